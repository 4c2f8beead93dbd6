//! Several standalone worker replicas on one task queue share a batch safely: every case runs
//! exactly once, and the runner itself hosts no worker.

use std::time::Duration;

use crate::support::*;

#[test]
fn two_standalone_workers_share_one_batch_and_run_each_case_once() {
    let sb = Sandbox::engine();
    let out = sb.out().display().to_string();
    let mut tasks = String::new();
    for i in 0..12 {
        tasks.push_str(&format!("  - task_id: r{i}\n"));
    }
    let manifest = sb.write(
        "replicas.yaml",
        &format!(
            r#"batch_id: replicas
defaults:
  concurrency: 6
  runtime: local-process
  harness: 'echo "$CASEBATCH_CASE_ID $PPID" >> "$SANDBOX/ran.log"; sleep 1; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks:
{tasks}"#
        ),
    );
    let mut runner = sb.spawn(
        &[
            "batch",
            "run",
            "--no-worker",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            &out,
        ],
        "run.log",
    );
    let engine = sb.out().join(".casebatch-engine/engine.json");
    wait_until(Duration::from_secs(60), "the embedded engine is up", || {
        engine.exists()
    });
    let mut w1 = sb.spawn(&["worker", "--output-dir", &out], "w1.log");
    let mut w2 = sb.spawn(&["worker", "--output-dir", &out], "w2.log");

    assert_eq!(wait_child(&mut runner, Duration::from_secs(180)), 0);
    for w in [&mut w1, &mut w2] {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(
            wait_child(w, Duration::from_secs(30)),
            0,
            "a worker stops cleanly on SIGTERM"
        );
    }
    let ran = std::fs::read_to_string(sb.path("ran.log")).unwrap();
    let mut ids: Vec<&str> = ran.lines().map(|l| l.split(' ').next().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ran.lines().count(),
        12,
        "each case ran exactly once:\n{ran}"
    );
    assert_eq!(ids.len(), 12);
    let summary = sb.json(&sb.bundle("replicas").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 12, "{summary:#}");
}
