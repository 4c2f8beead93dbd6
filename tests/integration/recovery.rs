//! Crash recovery: SIGKILL the process that hosts the worker mid-batch, then resume. Nothing
//! finished re-runs; in-flight jobs are adopted, not started again.

use std::time::Duration;

use crate::support::*;

#[test]
fn sigkill_of_the_runner_then_resume_adopts_in_flight_cases_and_reruns_nothing() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "crash.yaml",
        r#"batch_id: crash
defaults:
  pass_env: [SANDBOX]
  concurrency: 3
  runtime: local-process
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/started.log"; sleep 3; echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/finished.log"; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: c1
  - task_id: c2
  - task_id: c3
  - task_id: c4
  - task_id: c5
  - task_id: c6
"#,
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    wait_until(Duration::from_secs(60), "three cases start", || {
        sb.lines("started.log") >= 3
    });
    runner.kill().unwrap(); // SIGKILL
    runner.wait().unwrap();
    assert_eq!(
        sb.lines("finished.log"),
        0,
        "killed while the first three were in flight"
    );

    let o = sb.op("resume", "crash");
    assert_exit(&o, 0);
    assert_eq!(sb.lines("started.log"), 6, "each case started exactly once");
    assert_eq!(sb.lines("finished.log"), 6);

    let summary = sb.json(&sb.bundle("crash").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 6, "{summary:#}");
    assert_eq!(
        summary["attempts_total"], 6,
        "no new attempts for adopted cases"
    );
    assert_eq!(
        summary["adopted_attempts"], 3,
        "the in-flight three were adopted: {summary:#}"
    );

    let report = sb.op("report", "crash");
    assert_exit(&report, 0);
    assert!(
        stdout(&report).contains("3 attempt(s) adopted"),
        "{}",
        stdout(&report)
    );
}

/// Epochs are cases like any other: a runner SIGKILLed with some epochs done, some running and
/// some queued, then resumed, runs every epoch of every task exactly once, and the report's
/// pass@k counts each once.
#[test]
fn sigkill_mid_epochs_then_resume_runs_every_epoch_exactly_once() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "epochs.yaml",
        r#"batch_id: epochs-crash
defaults:
  pass_env: [SANDBOX]
  concurrency: 3
  runtime: local-process
  epochs: 4
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/started.log"; sleep 2; echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/finished.log"; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: t1
  - task_id: t2
  - task_id: t3
"#,
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    wait_until(Duration::from_secs(60), "a few epochs finish", || {
        sb.lines("finished.log") >= 3 && sb.lines("started.log") >= 5
    });
    runner.kill().unwrap(); // SIGKILL
    runner.wait().unwrap();
    assert!(
        sb.lines("started.log") < 12,
        "killed with epochs still queued"
    );
    // No worker polls the running workflow's queue: status says so at once, without asking
    // a query no worker can answer, and counts what the cases' records hold. Issue 58: it
    // waited 5.1 s for the query, then printed `Running · segment 0`, `running 0` and an
    // empty `temporal actions 0 (0.0 per case): `.
    let asked = std::time::Instant::now();
    let text = sb.op("status", "epochs-crash");
    assert_exit(&text, 0);
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "status took {:?}",
        asked.elapsed()
    );
    let text = stdout(&text);
    assert!(
        text.contains("not running: no runner or worker polls its task queue"),
        "{text}"
    );
    assert!(
        text.contains("`casebatch batch resume` continues it"),
        "{text}"
    );
    for untrue in ["segment 0", "running 0", "temporal actions"] {
        assert!(!text.contains(untrue), "{untrue}: {text}");
    }
    let view = sb.status("epochs-crash");
    assert_eq!(
        (&view["live"], &view["source"]),
        (&true.into(), &"no_worker".into())
    );
    let recorded = std::fs::read_dir(sb.bundle("epochs-crash").join("cases"))
        .unwrap()
        .filter(|d| {
            let result = d.as_ref().unwrap().path().join("result.json");
            std::fs::read_to_string(result).is_ok_and(|r| r.contains("\"succeeded\""))
        })
        .count();
    let counts = &view["status"]["counts"];
    assert_eq!(counts["succeeded"], recorded, "{view:#}");
    assert_eq!(counts["queued"], 12 - recorded, "{view:#}");

    assert_exit(&sb.op("resume", "epochs-crash"), 0);
    let view = sb.status("epochs-crash");
    assert_eq!(
        (&view["live"], &view["source"]),
        (&false.into(), &"result".into())
    );
    let mut started: Vec<String> = sb.read("started.log").lines().map(String::from).collect();
    started.sort();
    let expected: Vec<String> = ["t1", "t2", "t3"]
        .iter()
        .flat_map(|t| (1..=4).map(move |e| format!("{t}#{e}")))
        .collect();
    assert_eq!(
        started, expected,
        "each epoch of each task started exactly once"
    );
    assert_eq!(sb.lines("finished.log"), 12);
    let summary = sb.json(&sb.bundle("epochs-crash").join("batch_summary.json"));
    let tasks = &summary["stats"]["tasks"];
    assert_eq!(summary["counts"]["succeeded"], 12, "{summary:#}");
    for row in tasks["rows"].as_array().unwrap() {
        assert_eq!(
            (row["finished"].clone(), row["passed"].clone()),
            (4.into(), 4.into()),
            "{row:#}"
        );
    }
}

#[test]
fn a_dev_server_killed_mid_batch_is_brought_back_and_the_batch_completes() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "restart.yaml",
        r#"batch_id: restart
defaults:
  pass_env: [SANDBOX]
  concurrency: 3
  runtime: local-process
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ran.log"; sleep 2; echo "{}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: r1}, {task_id: r2}, {task_id: r3}, {task_id: r4}, {task_id: r5}, {task_id: r6}]
"#,
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    wait_until(Duration::from_secs(60), "three cases start", || {
        sb.lines("ran.log") >= 3
    });
    let engine = sb.json(&sb.out().join(".casebatch-engine/engine.json"));
    let pid = engine["pid"].as_u64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(180)),
        0,
        "the batch completes"
    );
    let restarted = sb.json(&sb.out().join(".casebatch-engine/engine.json"));
    assert_ne!(
        restarted["pid"], engine["pid"],
        "a new dev server on the same database"
    );
    assert_eq!(
        restarted["address"], engine["address"],
        "on the same address"
    );
    assert_eq!(sb.lines("ran.log"), 6, "each case ran exactly once");
    let summary = sb.json(&sb.bundle("restart").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 6, "{summary:#}");
    assert_eq!(summary["attempts_total"], 6);
}

/// The chaos drill script (scripts/chaos-drill.sh), exactly as operators run it: worker
/// SIGKILL with one job purged, SIGKILL of a single-case run, dev-server SIGKILL, a runtime
/// agent SIGKILLed and left down under a `runtime: [a, b]` batch, and a batch started with
/// that agent still down.
#[test]
fn the_chaos_drill_passes() {
    let sb = Sandbox::engine();
    let script = format!("{}/../scripts/chaos-drill.sh", env!("CARGO_MANIFEST_DIR"));
    let o = std::process::Command::new("bash")
        .arg(script)
        .env("CASEBATCH_BIN", env!("CARGO_BIN_EXE_casebatch"))
        .env("WORK", sb.path("drill"))
        .env_remove("TEMPORAL_ADDRESS")
        .output()
        .expect("run the drill");
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(o.status.success(), "the drill failed:\n{text}");
    assert!(text.contains("finished cases re-run 0"), "{text}");
    assert!(
        text.contains("drill dead-runtime: cases 24 succeeded"),
        "{text}"
    );
    assert!(
        text.contains("drill dead-runtime-left-down: cases 8 succeeded"),
        "{text}"
    );
    assert!(text.contains("drill: ok"), "{text}");
    // Leave no dev server behind (the drill's killed runner orphaned one).
    kill_engine(&sb.path("drill/out"));
    kill_engine(&sb.path("drill/engine-out"));
    kill_engine(&sb.path("drill/failover-out"));
    kill_engine(&sb.path("drill/pair-out"));
    kill_engine(&sb.path("drill/left-out"));
}
