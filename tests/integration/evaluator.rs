//! The evaluator runs under the attempt's control on local-process: in the attempt's cgroup
//! (so cleanup kills what it leaves and the receipt covers it) and under its memory limit.
//! The same on an agent: `agent_batches.rs`.

use crate::support::*;

#[test]
fn an_evaluators_detached_env_clearing_process_dies_with_the_attempts_cleanup() {
    let sb = Sandbox::engine_alone();
    let _reaper = KillOnDrop("sleep 3016");
    // `setsid env -i`: out of the evaluator's session and without the allocation marker, so
    // only membership of the attempt's cgroup finds it.
    let manifest = sb.write(
        "eval-leak.yaml",
        r#"batch_id: eval-leak
defaults:
  runtime: local-process
  harness: 'echo "{}" > "$CASEBATCH_RESULT"'
  evaluator: 'setsid env -i sleep 3016 > /dev/null 2>&1 & echo judged; printf "{\"verdict\": \"pass\"}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: judged
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 0);
    let receipt = sb.recorded("eval-leak", "judged", 1, "cleanup");
    assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    assert!(
        !receipt["killed"].as_array().unwrap().is_empty(),
        "the evaluator's sleep was a member of the attempt's cgroup and was killed: {receipt:#}"
    );
    assert!(
        no_process_matches("sleep 3016"),
        "survivors of cleanup:\n{}\nreceipt: {receipt:#}",
        describe_processes(&processes_matching("sleep 3016"))
    );
    let result = sb.case_result("eval-leak", "judged");
    assert_eq!(result["state"], "succeeded", "{result:#}");
    assert_eq!(result["verdict"], "pass", "{result:#}");
    // Its logs are where they always were.
    let log = sb.attempt_file("eval-leak", "judged", 1, "evaluator.stdout.log");
    assert_eq!(std::fs::read_to_string(log).unwrap(), "judged\n");
}

#[test]
fn an_evaluator_over_the_attempts_memory_limit_is_killed_as_oom() {
    let sb = Sandbox::engine();
    // The evaluator's hog dies; the shell goes on to write a pass, which must not count: the
    // attempt's limit was hit during its evaluation.
    let manifest = sb.write(
        "eval-oom.yaml",
        r#"batch_id: eval-oom
defaults:
  runtime: local-process
  max_retries: 2
  resources: {memory_mb: 64}
  harness: 'echo "{}" > "$CASEBATCH_RESULT"'
  evaluator: 'python3 -c "b = bytearray(400 * 1024 * 1024); print(len(b))"; printf "{\"verdict\": \"pass\"}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: hog
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 4);
    let r = sb.case_result("eval-oom", "hog");
    assert_eq!(
        (&r["failure"]["stage"], &r["failure"]["code"]),
        (&"evaluate".into(), &"OOM_KILLED".into()),
        "{r:#}"
    );
    assert_eq!(r["failure"]["retryable"], false, "{r:#}");
    assert_eq!(r["attempts"], 1, "fatal at the same size: not retried");
    let evaluation = sb.recorded("eval-oom", "hog", 1, "evaluation");
    assert_eq!(
        evaluation["verdict"],
        serde_json::Value::Null,
        "{evaluation:#}"
    );
    let message = evaluation["failure"]["message"].as_str().unwrap();
    assert!(
        message.contains("evaluator") && message.contains("64 MB"),
        "{message}"
    );
}
