//! The submit window: the runner dies after an attempt's process was started (or was about to
//! be) but before its job record was completed. Resume must never run a harness twice, never
//! truncate its logs, and the bundle must say what happened.
//!
//! The kill is placed deterministically with the worker's test hook
//! `CASEBATCH_FAULT_POINT=<point>:<n>`: the runner SIGKILLs itself once `n` submits are parked
//! at `<point>`.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Each case appends its id to its own side-effect file, prints a line, sleeps, then writes a
/// result: a second start would add a second line to the side file.
const HARNESS: &str = r#"'echo started >> "$SANDBOX/side.$CASEBATCH_CASE_ID"; echo "first output of $CASEBATCH_CASE_ID"; sleep 2; echo done; echo "{}" > "$CASEBATCH_RESULT"'"#;

fn manifest(sb: &Sandbox, batch: &str, cases: &[&str]) -> std::path::PathBuf {
    let tasks: Vec<String> = cases
        .iter()
        .map(|c| format!("  - task_id: {c}\n"))
        .collect();
    sb.write(
        &format!("{batch}.yaml"),
        &format!(
            "batch_id: {batch}\ndefaults:\n  concurrency: {}\n  runtime: local-process\n  pass_env: [SANDBOX]\n  harness: {HARNESS}\ntasks:\n{}",
            cases.len(),
            tasks.concat()
        ),
    )
}

fn events_of_kind(sb: &Sandbox, batch: &str, kind: &str) -> Vec<Value> {
    std::fs::read_to_string(sb.bundle(batch).join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == kind)
        .collect()
}

#[test]
fn a_runner_killed_after_spawn_before_the_job_record_adopts_and_never_starts_twice() {
    let sb = Sandbox::engine();
    let cases = ["w1", "w2", "w3"];
    let m = manifest(&sb, "window", &cases);
    let mut runner =
        sb.spawn_batch_with_env(&m, "run.log", &[("CASEBATCH_FAULT_POINT", "after-spawn:3")]);
    let status = wait_status(&mut runner, Duration::from_secs(120));
    assert_eq!(
        status.signal(),
        Some(9),
        "the runner must die at the fault point: {status:?}\n{}",
        std::fs::read_to_string(sb.path("run.log")).unwrap_or_default()
    );
    // All three were started by the dead runner, none has a completed job record.
    wait_until(Duration::from_secs(10), "the three harnesses run", || {
        cases.iter().all(|c| sb.lines(&format!("side.{c}")) == 1)
    });
    for c in cases {
        let job = sb.recorded("window", c, 1, "job");
        if !job.is_null() {
            assert_eq!(job["state"], "starting", "killed inside the window");
        }
    }

    let o = sb.op("resume", "window");
    assert_exit(&o, 0);
    for c in cases {
        assert_eq!(
            sb.lines(&format!("side.{c}")),
            1,
            "case {c} was started exactly once"
        );
        let log = std::fs::read_to_string(sb.attempt_file("window", c, 1, "stdout.log")).unwrap();
        assert_eq!(
            log,
            format!("first output of {c}\ndone\n"),
            "the first start's output is kept whole, once"
        );
        let job = sb.recorded("window", c, 1, "job");
        assert_eq!(job["state"], "running", "{job:#}");
        assert_eq!(job["starts"], 1, "{job:#}");
        assert_eq!(
            job["recovered"], true,
            "completed from the start's traces: {job:#}"
        );
        let r = sb.case_result("window", c);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["attempts"], 1, "{r:#}");
        assert_eq!(r["job_starts"], 1, "{r:#}");
        assert_eq!(
            r["adopted"], true,
            "harvested from the dead runner's process: {r:#}"
        );
    }
    assert!(events_of_kind(&sb, "window", "job_restarted").is_empty());
    let summary = sb.json(&sb.bundle("window").join("batch_summary.json"));
    assert_eq!(summary["attempts_total"], 3, "{summary:#}");
    assert_eq!(summary["adopted_attempts"], 3, "{summary:#}");
}

#[test]
fn an_intent_that_provably_never_ran_is_started_again_and_the_bundle_says_so() {
    let sb = Sandbox::engine();
    let cases = ["n1", "n2"];
    let m = manifest(&sb, "never", &cases);
    let mut runner = sb.spawn_batch_with_env(
        &m,
        "run.log",
        &[("CASEBATCH_FAULT_POINT", "before-spawn:2")],
    );
    let status = wait_status(&mut runner, Duration::from_secs(120));
    assert_eq!(status.signal(), Some(9), "{status:?}");
    for c in cases {
        assert_eq!(sb.lines(&format!("side.{c}")), 0, "nothing ran");
        let job = sb.recorded("never", c, 1, "job");
        assert_eq!(job["state"], "starting", "the intent is on disk: {job:#}");
    }

    let o = sb.op("resume", "never");
    assert_exit(&o, 0);
    for c in cases {
        assert_eq!(sb.lines(&format!("side.{c}")), 1, "case {c} ran once");
        let job = sb.recorded("never", c, 1, "job");
        assert_eq!(job["starts"], 2, "{job:#}");
        let r = sb.case_result("never", c);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["attempts"], 1, "{r:#}");
        assert_eq!(r["job_starts"], 2, "the second start is visible: {r:#}");
        assert_eq!(
            r["adopted"], false,
            "started by the resumed runner, nothing was re-attached: {r:#}"
        );
    }
    let restarted = events_of_kind(&sb, "never", "job_restarted");
    assert_eq!(restarted.len(), 2, "{restarted:#?}");
    let summary = sb.json(&sb.bundle("never").join("batch_summary.json"));
    assert_eq!(summary["adopted_attempts"], 0, "{summary:#}");
}
