//! The embedded engine's life: whichever casebatch process uses the dev server supervises it,
//! also one that found it running, and no command starts work before the server answers.

use std::time::Duration;

use crate::support::*;

/// A stand-in for `temporal` (CASEBATCH_TEMPORAL_BIN): listens on the server's port first,
/// then (mode `reset`) resets every connection for FAKE_SECS seconds and execs the real
/// `temporal` with the same arguments and pid, or (mode `silent`) accepts and never answers.
const FAKE_TEMPORAL: &str = r#"#!/usr/bin/env python3
import os, socket, struct, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = os.environ.get("FAKE_MODE", "reset")
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
s.settimeout(0.05)
held = []
end = time.time() + float(os.environ.get("FAKE_SECS", "3"))
while mode == "silent" or time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    if mode == "silent":
        held.append(c)
    else:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
s.close()
real = os.environ.get("REAL_TEMPORAL", "temporal")
os.execvp(real, [real] + args)
"#;

#[test]
fn resume_supervises_the_engine_it_found_and_brings_it_back_when_it_dies() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "found.yaml",
        r#"batch_id: found
defaults:
  concurrency: 2
  runtime: local-process
  pass_env: [SANDBOX]
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/started.log"; sleep 2; echo "{}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: f1}, {task_id: f2}, {task_id: f3}, {task_id: f4}, {task_id: f5}, {task_id: f6}]
"#,
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    wait_until(Duration::from_secs(60), "two cases start", || {
        sb.lines("started.log") >= 2
    });
    runner.kill().unwrap(); // SIGKILL: its dev server survives it
    runner.wait().unwrap();
    let first = engine_record(&sb.out()).expect("engine.json");
    assert!(engine_alive(&first), "the runner's dev server survived");
    let started_at_kill = sb.lines("started.log");

    let out = sb.out();
    let mut resume = sb.spawn(
        &[
            "batch",
            "resume",
            "--batch-id",
            "found",
            "--output-dir",
            out.to_str().unwrap(),
        ],
        "resume.log",
    );
    wait_until(
        Duration::from_secs(90),
        "the resumed runner admits a new case",
        || sb.lines("started.log") > started_at_kill,
    );
    assert_eq!(
        engine_record(&out).unwrap()["pid"],
        first["pid"],
        "resume uses the dev server it found"
    );

    kill_engine(&out); // SIGKILL, by identity
    wait_until(
        Duration::from_secs(60),
        "the resumed runner starts a new dev server",
        || engine_record(&out).is_some_and(|r| r["pid"] != first["pid"] && engine_alive(&r)),
    );
    let second = engine_record(&out).unwrap();
    assert_eq!(second["address"], first["address"], "on the same port");
    assert_eq!(second["db"], first["db"], "on the same database");

    let code = wait_child(&mut resume, Duration::from_secs(180));
    assert_eq!(
        code,
        0,
        "resume completes the batch:\n{}",
        sb.read("resume.log")
    );
    let summary = sb.json(&sb.bundle("found").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 6, "{summary:#}");
    assert_eq!(sb.lines("started.log"), 6, "each case ran exactly once");
    assert!(
        !engine_record(&out).is_some_and(|r| engine_alive(&r)),
        "the runner stops the dev server it started"
    );
}

#[test]
fn back_to_back_fresh_starts_each_with_a_new_engine_all_succeed() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "one.yaml",
        "batch_id: fresh\ndefaults: {runtime: fake}\ntasks:\n  - task_id: only\n",
    );
    for i in 0..8 {
        let out = sb.path(&format!("out-{i}"));
        let o = sb.run(&batch_run_args(&manifest, &out));
        kill_engine(&out);
        assert!(
            o.status.success(),
            "fresh start {i} failed ({:?}):\n{}",
            o.status.code(),
            stderr(&o)
        );
    }
}

/// The cause of the flaky fresh starts: the port accepts connections before the server
/// answers. Here it deterministically resets them for 3 s, then the real server starts.
#[test]
fn a_dev_server_whose_port_opens_before_it_answers_is_waited_for() {
    let sb = Sandbox::engine();
    let fake = sb.write("fake-temporal", FAKE_TEMPORAL);
    make_executable(&fake);
    let real = std::env::var("CASEBATCH_TEMPORAL_BIN").unwrap_or_else(|_| "temporal".into());
    let manifest = sb.write(
        "one.yaml",
        "batch_id: early\ndefaults: {runtime: fake}\ntasks:\n  - task_id: only\n",
    );
    let out = sb.out();
    let o = sb.run_env(
        &batch_run_args(&manifest, &out),
        &[
            ("CASEBATCH_TEMPORAL_BIN", fake.to_str().unwrap()),
            ("REAL_TEMPORAL", &real),
            ("FAKE_MODE", "reset"),
            ("FAKE_SECS", "3"),
        ],
    );
    assert_exit(&o, 0);
}

#[test]
fn an_engine_that_never_answers_exits_3_naming_its_address_and_log() {
    let sb = Sandbox::engine();
    let fake = sb.write("fake-temporal", FAKE_TEMPORAL);
    make_executable(&fake);
    let manifest = sb.write(
        "one.yaml",
        "batch_id: mute\ndefaults: {runtime: fake}\ntasks:\n  - task_id: only\n",
    );
    let out = sb.out();
    let started = std::time::Instant::now();
    let o = sb.run_env(
        &batch_run_args(&manifest, &out),
        &[
            ("CASEBATCH_TEMPORAL_BIN", fake.to_str().unwrap()),
            ("FAKE_MODE", "silent"),
        ],
    );
    assert_exit(&o, 3);
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "the wait is bounded"
    );
    let err = stderr(&o);
    let record = engine_record(&out).expect("engine.json");
    let address = record["address"].as_str().unwrap();
    assert!(err.contains(address), "names the address: {err}");
    assert!(
        err.contains(
            &out.join(".casebatch-engine/temporal.log")
                .display()
                .to_string()
        ),
        "names the engine log: {err}"
    );
    assert!(
        !engine_alive(&record),
        "the server it started is not left behind"
    );
    assert!(
        !sb.bundle("mute").join("run_config.json").exists(),
        "nothing was started on it"
    );
}

fn make_executable(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}
