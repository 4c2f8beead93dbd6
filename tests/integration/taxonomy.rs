//! The failure taxonomy end to end: what is retried, what is not, and how it is reported.

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
