//! Provision ahead (`prepare_ahead`): the next cases' environments are provisioned while
//! others run, and a drained batch cleans up the ones it will not use, with receipts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Case directories by plan index.
fn case_dirs(sb: &Sandbox, batch: &str) -> Vec<String> {
    let plan = sb.json(&sb.bundle(batch).join("batch_plan.json"));
    plan["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["case_dir"].as_str().unwrap().to_string())
        .collect()
}

fn prepared_at_ms(sb: &Sandbox, batch: &str, case_dir: &str) -> Option<u64> {
    sb.recorded(batch, case_dir, 1, "prepared")["prepared_at_ms"].as_u64()
}

#[test]
fn the_next_cases_are_provisioned_while_the_running_one_works() {
    let sb = Sandbox::engine();
    // One at a time, each a SIMULATION: 400 ms to provision, 600 ms to run.
    let manifest = sb.write(
        "ahead.yaml",
        r#"batch_id: ahead
defaults:
  concurrency: 1
  prepare_ahead: 2
  runtime: fake
  fake: {duration_ms: 600, provision_ms: 400}
tasks:
  - task_id: a
  - task_id: b
  - task_id: c
  - task_id: d
  - task_id: e
  - task_id: f
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 0);
    assert!(
        stdout(&o).contains("provisioned ahead 5 · released unused 0"),
        "{}",
        stdout(&o)
    );

    let dirs = case_dirs(&sb, "ahead");
    // The first case had a free slot: provisioned when dispatched, as without the setting.
    assert_eq!(prepared_at_ms(&sb, "ahead", &dirs[0]), None);
    for i in 1..dirs.len() {
        let prepared = prepared_at_ms(&sb, "ahead", &dirs[i])
            .unwrap_or_else(|| panic!("case {i} was not provisioned ahead"));
        // Ready before the case ahead of it ended: provisioned while it ran, not after.
        let job = sb.recorded("ahead", &dirs[i - 1], 1, "job");
        let before_ended = job["started_at_ms"].as_u64().unwrap() + 600;
        assert!(
            prepared < before_ended,
            "case {i} was provisioned at {prepared}, after case {} ended at {before_ended}",
            i - 1
        );
        let result = sb.case_result("ahead", &dirs[i]);
        assert_eq!(result["state"], "succeeded", "{result:#}");
        assert_eq!(result["attempts"], 1, "{result:#}");
    }
}

/// The released-environment records of a case.
fn released(bundle: &Path, case_dir: &str) -> Vec<Value> {
    let dir: PathBuf = bundle.join("cases").join(case_dir).join("released");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap())
        .collect()
}

#[test]
fn a_drained_batch_releases_the_environments_it_provisioned_ahead() {
    let sb = Sandbox::engine();
    // Real processes, one at a time; each case waits for the test to create `$SANDBOX/go`.
    let manifest = sb.write(
        "ahead-drain.yaml",
        r#"batch_id: ahead-drain
defaults:
  concurrency: 1
  prepare_ahead: 2
  pass_env: [SANDBOX]
  runtime: local-process
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ran.log"; while [ ! -e "$SANDBOX/go" ]; do sleep 0.05; done; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: a
  - task_id: b
  - task_id: c
  - task_id: d
"#,
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    wait_until(Duration::from_secs(60), "the plan is written", || {
        sb.bundle("ahead-drain").join("batch_plan.json").exists()
    });
    let dirs = case_dirs(&sb, "ahead-drain");
    wait_until(Duration::from_secs(60), "b and c provisioned ahead", || {
        sb.lines("ran.log") >= 1
            && prepared_at_ms(&sb, "ahead-drain", &dirs[1]).is_some()
            && prepared_at_ms(&sb, "ahead-drain", &dirs[2]).is_some()
    });
    let status = sb.status("ahead-drain");
    assert_eq!(
        status["status"]["prepared"],
        serde_json::json!([1, 2]),
        "{status:#}"
    );

    assert_exit(&sb.op("drain", "ahead-drain"), 0);
    sb.write("go", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        1,
        "a drained runner exits 1: {}",
        tail(&sb.path("run.log"), 20)
    );

    let status = sb.status("ahead-drain");
    assert_eq!(status["end"], "drained", "{status:#}");
    assert_eq!(status["status"]["counts"]["succeeded"], 1, "{status:#}");
    assert_eq!(status["status"]["counts"]["queued"], 3, "{status:#}");
    assert_eq!(status["status"]["counters"]["prepared"], 2, "{status:#}");
    assert_eq!(status["status"]["counters"]["released"], 2, "{status:#}");
    assert_eq!(sb.lines("ran.log"), 1, "only the admitted case ran");

    let bundle = sb.bundle("ahead-drain");
    for dir in &dirs[1..=2] {
        let records = released(&bundle, dir);
        assert_eq!(records.len(), 1, "{dir}: {records:#?}");
        let r = &records[0];
        assert_eq!(r["why"], "drain", "{r:#}");
        assert_eq!(r["attempt"], 1, "{r:#}");
        assert_eq!(r["receipt"]["cleanup_confirmed"], true, "{r:#}");
        let method = r["receipt"]["method"].as_str().unwrap_or_default();
        assert!(
            method.starts_with("cgroup_") || method == "proc_marker_scan",
            "{r:#}"
        );
        // Nothing of the environment is left, and no attempt was recorded.
        let attempt = bundle.join("cases").join(dir).join("attempts").join("1");
        assert!(!attempt.exists(), "{} is left", attempt.display());
    }
    assert!(
        released(&bundle, &dirs[3]).is_empty(),
        "d was never provisioned"
    );
    let events = std::fs::read_to_string(bundle.join("events.jsonl")).unwrap();
    assert_eq!(
        events.matches("\"prepared_released\"").count(),
        2,
        "{events}"
    );

    // Resume: the released cases run as their first attempt, each exactly once.
    assert_exit(&sb.op("resume", "ahead-drain"), 0);
    assert_eq!(sb.lines("ran.log"), 4, "every case ran exactly once");
    let summary = sb.json(&bundle.join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 4, "{summary:#}");
    assert_eq!(
        summary["attempts_total"], 4,
        "no attempt was spent: {summary:#}"
    );
    for dir in &dirs[1..=2] {
        assert!(!sb.recorded("ahead-drain", dir, 1, "record").is_null());
    }
}
