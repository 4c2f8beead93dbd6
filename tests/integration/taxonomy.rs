//! The failure taxonomy end to end: what is retried, what is not, and how it is reported.

use serde_json::Value;

use crate::support::*;

#[test]
fn only_retryable_infra_failures_get_another_attempt() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "mixed.yaml",
        r#"batch_id: mixed
defaults:
  runtime: local-process
  max_retries: 2
  concurrency: 4
  pass_env: [SANDBOX]   # harnesses see only what is passed on
  harness: 'echo x >> "$SANDBOX/$CASEBATCH_CASE_ID.runs"; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: flaky-infra
    runtime: fake
    fake: {infra_failures_first: 1}
  - task_id: harness-crash
    harness: 'echo x >> "$SANDBOX/harness-crash.runs"; exit 3'
  - task_id: agent-fail
    runtime: fake
    fake: {outcome: fail}
  - task_id: passes
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 4);

    let flaky = sb.case_result("mixed", "flaky-infra");
    assert_eq!(flaky["state"], "succeeded", "{flaky:#}");
    assert_eq!(
        flaky["attempts"], 2,
        "one retry after a retryable infra failure"
    );

    let crash = sb.case_result("mixed", "harness-crash");
    assert_eq!(crash["state"], "failed");
    assert_eq!(crash["attempts"], 1, "harness failures are never retried");
    assert_eq!(crash["failure"]["class"], "harness");
    assert_eq!(crash["failure"]["stage"], "await");
    assert_eq!(crash["exit_code"], 3);
    assert_eq!(sb.lines("harness-crash.runs"), 1);

    let agent = sb.case_result("mixed", "agent-fail");
    assert_eq!(agent["state"], "failed");
    assert_eq!(agent["attempts"], 1, "an agent verdict is never retried");
    assert_eq!(
        agent["actor_status"], "finished",
        "actor status kept apart from the verdict"
    );
    assert_eq!(agent["verdict"], "fail");
    assert_eq!(agent["failure"]["class"], "agent");

    let summary = sb.json(&sb.bundle("mixed").join("batch_summary.json"));
    assert_eq!(
        summary["failures_by_stage_class"]["await/harness"], 1,
        "{summary:#}"
    );
    assert_eq!(
        summary["failures_by_stage_class"]["evaluate/agent"], 1,
        "{summary:#}"
    );
    let report = sb.op("report", "mixed");
    assert!(
        stdout(&report).contains("await/harness: 1"),
        "{}",
        stdout(&report)
    );
}

#[test]
fn a_kill_by_the_memory_limit_is_oom_killed_and_not_retried() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "oom.yaml",
        r#"batch_id: oom
defaults:
  runtime: local-process
  max_retries: 3
  resources: {memory_mb: 64}
  pass_env: [SANDBOX]   # harnesses see only what is passed on
  harness: 'echo x >> "$SANDBOX/oom.runs"; python3 -c "b = bytearray(400 * 1024 * 1024); print(len(b))"'
tasks:
  - task_id: hog
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 4);
    let r = sb.case_result("oom", "hog");
    assert_eq!(r["failure"]["code"], "OOM_KILLED", "{r:#}");
    assert_eq!(r["failure"]["class"], "infra");
    assert_eq!(r["failure"]["retryable"], false);
    assert!(
        r["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("resources.memory_mb")
    );
    assert_eq!(r["attempts"], 1, "fatal at the same size: not retried");
    assert_eq!(sb.lines("oom.runs"), 1);
}

#[test]
fn a_harness_past_its_timeout_is_killed_and_retried_as_infra() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "slow.yaml",
        r#"batch_id: slow
defaults:
  runtime: local-process
  max_retries: 1
  timeout_seconds: 1
  pass_env: [SANDBOX]   # harnesses see only what is passed on
  harness: 'echo x >> "$SANDBOX/slow.runs"; sleep 345'
tasks:
  - task_id: sleeper
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 4);
    let r = sb.case_result("slow", "sleeper");
    assert_eq!(r["failure"]["code"], "TIMEOUT", "{r:#}");
    assert_eq!(r["failure"]["class"], "infra");
    assert_eq!(r["attempts"], 2, "a timeout is retryable infra: one retry");
    assert_eq!(sb.lines("slow.runs"), 2, "each attempt got a fresh process");
    assert!(
        no_process_matches("sleep 345"),
        "timed-out harnesses are killed"
    );
    let first = journal_at(&sb.bundle("slow").join("cases/sleeper/attempts/1"))["record"].clone();
    assert_eq!(first["will_retry"], true);
}

#[test]
fn a_config_failure_raised_by_an_activity_is_typed_and_never_retried() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "two.yaml",
        "batch_id: two\ndefaults: {runtime: local-process, concurrency: 1, harness: 'sleep 1'}\ntasks: [{task_id: a}, {task_id: b}]\n",
    );
    let out = sb.out();
    let out = out.to_str().unwrap();
    let mut runner = sb.spawn_batch_without_worker(&manifest, "run.log");
    let plan_path = sb.bundle("two").join("batch_plan.json");
    // run_config.json is written once the engine answers, after the plan's last write.
    let run_config = sb.bundle("two").join("run_config.json");
    wait_until(
        std::time::Duration::from_secs(60),
        "the runner reaches the engine",
        || run_config.exists(),
    );
    // The bundle no longer matches the batch: case b's activity raises casebatch.config.
    let mut plan = sb.json(&plan_path);
    plan["cases"].as_array_mut().unwrap().truncate(1);
    std::fs::write(&plan_path, plan.to_string()).unwrap();
    let mut worker = sb.spawn(&["worker", "--output-dir", out], "worker.log");
    assert_eq!(
        wait_child(&mut runner, std::time::Duration::from_secs(120)),
        4
    );
    // A graceful stop: a SIGKILLed worker would orphan the dev server it restarted when the
    // runner stopped its own (taking over orphans is issue 11's engine work).
    assert_eq!(stop(&mut worker), 0, "the worker stops on SIGTERM");
    let status = sb.status("two");
    assert_eq!(status["status"]["counts"]["failed"], 1, "{status:#}");
    assert_eq!(
        status["status"]["counters"]["retries"], 0,
        "a config failure is not retried, even with max_retries 1: {status:#}"
    );
}

/// Issue 58: `{"scores": {"acc": "high"}}` succeeded with the score dropped, and
/// `failure.class: "cosmic"` was counted as `harness` with its `retryable` ignored. Each
/// result is held to its contract, the refusal naming the field and the value, and the schema
/// `config schema --kind result` prints says the same of each file.
#[test]
fn a_result_that_breaks_its_contract_is_a_bad_result_naming_field_and_value() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "contract.yaml",
        r#"batch_id: contract
defaults:
  runtime: local-process
  max_retries: 2
  pass_env: [SANDBOX]
  harness: 'echo x >> "$SANDBOX/$CASEBATCH_CASE_ID.runs"; cp "$SANDBOX/$CASEBATCH_CASE_ID.json" "$CASEBATCH_RESULT"'
tasks:
  - task_id: words
  - task_id: cosmic
    harness: 'echo x >> "$SANDBOX/cosmic.runs"; cp "$SANDBOX/cosmic.json" "$CASEBATCH_RESULT"; exit 1'
  - task_id: judged
    evaluator: 'printf "{\"verdict\": \"pass\", \"scores\": {\"judge\": \"yes\"}}" > "$CASEBATCH_RESULT"'
  - task_id: good
"#,
    );
    let results = [
        ("words", r#"{"scores": {"acc": "high"}}"#),
        (
            "cosmic",
            r#"{"failure": {"class": "cosmic", "code": "RAYS", "retryable": true}}"#,
        ),
        ("judged", r#"{"scores": {"acc": 1}}"#),
        ("good", r#"{"scores": {"acc": 0.5}, "outputs": {"a": [1]}}"#),
    ];
    for (case, result) in results {
        sb.write(&format!("{case}.json"), result);
    }
    assert_exit(&sb.run_batch(&manifest), 4);

    let failure = |case: &str| sb.case_result("contract", case)["failure"].clone();
    let words = failure("words");
    assert_eq!(
        (&words["class"], &words["code"]),
        (&"harness".into(), &"HARNESS_BAD_RESULT".into()),
        "{words:#}"
    );
    let message = words["message"].as_str().unwrap();
    assert!(
        message.contains(r#"scores.acc must be a number, got "high""#),
        "{message}"
    );

    let cosmic = failure("cosmic");
    assert_eq!(
        (&cosmic["code"], &cosmic["retryable"]),
        (&"HARNESS_BAD_RESULT".into(), &false.into()),
        "{cosmic:#}"
    );
    let message = cosmic["message"].as_str().unwrap();
    assert!(
        message.contains(
            r#"failure.class must be one of infra, config, harness, agent, got "cosmic""#
        ),
        "{message}"
    );
    // Its `retryable: true` was not honoured: a bad result is not retried.
    assert_eq!(sb.lines("cosmic.runs"), 1);

    let judged = failure("judged");
    assert_eq!(
        (&judged["stage"], &judged["code"]),
        (&"evaluate".into(), &"EVALUATOR_FAILED".into()),
        "{judged:#}"
    );
    assert!(
        judged["message"]
            .as_str()
            .unwrap()
            .contains(r#"scores.judge must be a number, got "yes""#),
        "{judged:#}"
    );
    assert_eq!(sb.case_result("contract", "good")["state"], "succeeded");

    // What a harness author checks against says the same of each file.
    let o = sb.run(&["config", "schema", "--kind", "result"]);
    assert_exit(&o, 0);
    let schema: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema itself is valid");
    for (case, result) in results {
        let doc: Value = serde_json::from_str(result).unwrap();
        let refused = matches!(case, "words" | "cosmic");
        assert_eq!(validator.is_valid(&doc), !refused, "{case}: {result}");
    }
}
