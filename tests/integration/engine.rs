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

/// A stand-in for `temporal` that loses its port: on its first start another server (an
/// "impostor", not its descendant: another user's, or another batch's) takes the port it was
/// given, and this one gives up after a while, as a server that failed its bind. Later starts
/// exec the real `temporal`.
const LOSES_ITS_PORT: &str = r#"#!/usr/bin/env python3
import os, socket, subprocess, sys, time
args = sys.argv[1:]
port = args[args.index("--port") + 1]
real = os.environ["REAL_TEMPORAL"]
mark = os.path.join(os.environ["IMPOSTOR_DIR"], "impostor.port")
if not os.path.exists(mark):
    db = os.path.join(os.environ["IMPOSTOR_DIR"], "impostor.db")
    # Forked twice: the impostor is nobody's child here.
    first = os.fork()
    if first == 0:
        os.setsid()
        second = os.fork()
        if second == 0:
            fd = os.open(os.devnull, os.O_RDWR)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.execvp(real, [real, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
                             "--log-level", "error", "--port", port, "--db-filename", db])
        with open(mark + ".pid", "w") as f:
            f.write(str(second))
        os._exit(0)
    os.waitpid(first, 0)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", int(port)), 1).close()
            break
        except OSError:
            time.sleep(0.1)
    with open(mark, "w") as f:
        f.write(port)
    time.sleep(3)
    sys.exit("bind: address already in use")
os.execvp(real, [real] + args)
"#;

/// Kills the impostor server when the test ends.
struct Impostor(Option<casebatch_attempt::local::procfs::ProcessId>);

impl Drop for Impostor {
    fn drop(&mut self) {
        if let Some(p) = self.0.filter(|p| p.is_alive()) {
            casebatch_attempt::local::procfs::kill_pid(p.pid);
        }
    }
}

/// A port that answers is not a server that is ours: one that lost its port to another
/// server must not be taken for ready, or the batch runs on that server and its workers
/// take our cases. The runner starts a server of its own on another port.
#[test]
fn a_server_that_lost_its_port_is_not_taken_for_the_one_that_holds_it() {
    let sb = Sandbox::engine();
    let fake = sb.write("fake-temporal", LOSES_ITS_PORT);
    make_executable(&fake);
    let real = std::env::var("CASEBATCH_TEMPORAL_BIN").unwrap_or_else(|_| "temporal".into());
    let manifest = sb.write(
        "one.yaml",
        "batch_id: own\ndefaults: {runtime: fake}\ntasks:\n  - task_id: only\n",
    );
    let out = sb.out();
    let o = sb.run_env(
        &batch_run_args(&manifest, &out),
        &[
            ("CASEBATCH_TEMPORAL_BIN", fake.to_str().unwrap()),
            ("REAL_TEMPORAL", &real),
            ("IMPOSTOR_DIR", sb.dir.path().to_str().unwrap()),
        ],
    );
    let port: u16 = sb
        .read("impostor.port")
        .trim()
        .parse()
        .expect("the impostor started");
    let pid = sb.read("impostor.port.pid").trim().parse().unwrap();
    let impostor = Impostor(casebatch_attempt::local::procfs::ProcessId::of(pid));
    assert_exit(&o, 0);
    let record = engine_record(&out).expect("engine.json");
    assert_ne!(
        record["address"].as_str().unwrap(),
        format!("127.0.0.1:{port}"),
        "the runner's engine is its own"
    );
    let listed = std::process::Command::new(&real)
        .args([
            "workflow",
            "count",
            "--address",
            &format!("127.0.0.1:{port}"),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("Total: 0"),
        "nothing ran on the impostor: {}{}",
        String::from_utf8_lossy(&listed.stdout),
        String::from_utf8_lossy(&listed.stderr)
    );
    drop(impostor);
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
    // Killed as the runner gave up; its exit is the kernel's to finish.
    wait_until(
        Duration::from_secs(10),
        "the server it started is not left behind",
        || !engine_alive(&record),
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

/// The issue's crash bar on the local runtime: a runner SIGKILLed mid-batch, then `resume`.
/// Finished cases are not run again, the cases in flight are adopted and cleaned up through
/// their cgroups (each left a detached, environment-less `sleep 377` behind), and the engine
/// the dead runner started is taken over by `resume` and stopped when it is done.
#[test]
fn a_runner_sigkilled_mid_batch_resumes_through_cgroups_and_leaves_no_engine_running() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "crash.yaml",
        r#"batch_id: crash-cg
defaults:
  concurrency: 3
  runtime: local-process
  pass_env: [SANDBOX]
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/started.log"; setsid env -i sleep 377 > /dev/null 2>&1 & sleep 3; echo "{}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: k1}, {task_id: k2}, {task_id: k3}, {task_id: k4}, {task_id: k5}, {task_id: k6}]
"#,
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    // The first three finished, the next ones in flight.
    wait_until(Duration::from_secs(90), "a second wave starts", || {
        sb.lines("started.log") >= 4
    });
    runner.kill().unwrap();
    runner.wait().unwrap();
    let engine = engine_record(&sb.out()).expect("engine.json");
    assert!(engine_alive(&engine), "the dead runner's engine still runs");

    let out = sb.out();
    let o = sb.run(&[
        "batch",
        "resume",
        "--batch-id",
        "crash-cg",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_exit(&o, 0);
    assert_eq!(sb.lines("started.log"), 6, "no case ran twice");
    let summary = sb.json(&sb.bundle("crash-cg").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 6, "{summary:#}");
    assert!(
        summary["adopted_attempts"].as_u64().unwrap_or(0) >= 1,
        "the cases in flight were adopted: {summary:#}"
    );
    for case in ["k1", "k2", "k3", "k4", "k5", "k6"] {
        let receipt = sb.recorded("crash-cg", case, 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{case}: {receipt:#}");
        assert_eq!(receipt["method"], "cgroup_v2", "{case}: {receipt:#}");
    }
    assert!(no_process_matches("sleep 377"), "a detached sleep survived");
    // Taken over: the engine resume found is stopped, and no other one runs.
    assert!(!engine_alive(&engine), "the found engine is left running");
    let keeper = &engine["keeper"];
    assert!(!keeper.is_null(), "the engine record names its keeper");
    // The keeper exits on its own once its engine is gone.
    wait_until(
        Duration::from_secs(10),
        &format!("its keeper ({keeper}) exits"),
        || !engine_alive(keeper),
    );
    assert!(
        !engine_record(&out).is_some_and(|r| engine_alive(&r)),
        "an engine is left running"
    );
}

/// Nobody resumes: the keeper of a SIGKILLed runner's engine stops it once it has been idle
/// for its timeout, and `engine status` says so.
#[test]
fn the_keeper_stops_an_engine_nobody_uses_after_its_idle_timeout() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "idle.yaml",
        r#"batch_id: idle
defaults:
  runtime: local-process
  pass_env: [SANDBOX]
  harness: 'echo x >> "$SANDBOX/started.log"; sleep 30'
tasks: [{task_id: i1}]
"#,
    );
    let out = sb.out();
    let mut runner = sb.spawn_env(
        &batch_run_args(&manifest, &out),
        "run.log",
        &[("CASEBATCH_ENGINE_IDLE_SECS", "2")],
    );
    wait_until(Duration::from_secs(60), "the case starts", || {
        sb.lines("started.log") >= 1
    });
    runner.kill().unwrap();
    runner.wait().unwrap();
    let engine = engine_record(&out).expect("engine.json");
    assert_eq!(engine["idle_timeout_secs"], 2, "{engine}");
    let status = sb.run(&[
        "engine",
        "status",
        "--output-dir",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_exit(&status, 0);
    let status: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(status["running"], true, "{status:#}");
    assert_eq!(status["users"], serde_json::json!([]), "{status:#}");
    wait_until(
        Duration::from_secs(30),
        "the keeper stops the idle engine",
        || !engine_alive(&engine),
    );
    // The keeper reaps the engine, then exits: a moment after the engine, not with it.
    wait_until(Duration::from_secs(10), "the keeper exits with it", || {
        !engine_alive(&engine["keeper"])
    });
    let status = sb.run(&["engine", "status", "--output-dir", out.to_str().unwrap()]);
    assert!(
        stdout(&status).contains("not running"),
        "{}",
        stdout(&status)
    );
    let log = std::fs::read_to_string(out.join(".casebatch-engine/temporal.log")).unwrap();
    assert!(
        log.contains("no casebatch process has used this engine for 2s"),
        "the keeper says why it stopped the engine: {log}"
    );
}

/// A batch gated on a file, so that it is still running while it is looked at. Each test
/// gives it its own id: attempts of two batches with one id on one host share their allocation
/// marker, and a cleanup's marker scan would reach the other's processes.
fn gated(batch_id: &str) -> String {
    format!(
        r#"batch_id: {batch_id}
defaults:
  runtime: local-process
  pass_env: [SANDBOX]
  harness: 'while [ ! -e "$SANDBOX/go" ]; do sleep 0.05; done; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: a
  - task_id: b
"#
    )
}

/// The address a line of a log names after `prefix` (up to the next space).
fn address_after(log: &str, prefix: &str) -> Option<String> {
    let at = log.find(prefix)? + prefix.len();
    Some(log[at..].split_whitespace().next()?.to_string())
}

/// `batch run --ui`: the embedded engine serves Temporal's Web UI on loopback, the runner
/// prints where, and the page, loaded in headless Chromium, lists the batch's workflow.
#[test]
fn batch_run_ui_serves_the_web_ui_and_it_lists_the_batchs_workflow() {
    let Some(browser) = browser_or_skip("batch_run_ui_serves_the_web_ui") else {
        return;
    };
    let sb = Sandbox::engine();
    let manifest = sb.write("ui-run.yaml", &gated("ui-run"));
    let out = sb.out().display().to_string();
    let mut runner = sb.spawn(
        &[
            "batch",
            "run",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            &out,
            "--ui",
        ],
        "run.log",
    );
    let mut page = None;
    wait_until(
        Duration::from_secs(90),
        "the runner names the Web UI",
        || {
            page = address_after(&sb.read("run.log"), "Temporal Web UI: ");
            page.is_some()
        },
    );
    let page = page.unwrap();
    assert!(
        page.starts_with("http://127.0.0.1:") && page.ends_with("/workflows/casebatch-ui-run"),
        "{page}"
    );
    // Loopback only, the UI as well as the frontend.
    let record = engine_record(&sb.out()).expect("engine.json");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", record["pid"])).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let after = |flag: &str| args.iter().skip_while(|a| *a != flag).nth(1).cloned();
    assert_eq!(after("--ui-ip").as_deref(), Some("127.0.0.1"), "{args:?}");
    assert_eq!(after("--ip").as_deref(), Some("127.0.0.1"), "{args:?}");
    assert!(!args.iter().any(|a| a == "--headless"), "{args:?}");

    // The list of workflows, as the browser builds it from the UI's API.
    let list = page.rsplit_once('/').unwrap().0.to_string();
    let listed = |seen: &Result<String, String>| {
        seen.as_ref()
            .is_ok_and(|dom| dom.contains("casebatch-ui-run"))
    };
    let mut seen = Err(String::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !listed(&seen) && std::time::Instant::now() < deadline {
        seen = dom_of(&browser, &list, sb.dir.path());
    }
    assert!(
        listed(&seen),
        "the Web UI at {list} does not list the batch: {}\n{}",
        match &seen {
            Ok(dom) => dom.chars().take(2000).collect::<String>(),
            Err(e) => e.clone(),
        },
        tail(&sb.path("run.log"), 20)
    );

    sb.write("go", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        0,
        "{}",
        tail(&sb.path("run.log"), 20)
    );
    // The last user out stops the engine, its UI with it (its process may still be exiting
    // when the runner is done: its command line is gone before it is).
    wait_until(Duration::from_secs(10), "the engine stops", || {
        !engine_alive(&record)
    });
}

/// `engine ui` on an engine that runs headless under a batch: the engine is restarted with its
/// UI (loopback), the batch carries on to the end, and the UI's own API lists its workflow.
/// Once `engine ui` is stopped, the engine it held stops with it.
#[test]
fn engine_ui_turns_the_ui_on_under_a_running_batch_which_still_finishes() {
    let sb = Sandbox::engine();
    let manifest = sb.write("ui-engine.yaml", &gated("ui-engine"));
    let out = sb.out().display().to_string();
    let mut runner = sb.spawn(
        &[
            "batch",
            "run",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            &out,
        ],
        "run.log",
    );
    let bundle = sb.bundle("ui-engine");
    wait_until(Duration::from_secs(90), "both cases run", || {
        ["a", "b"].iter().all(|c| {
            !journal_at(&bundle.join(format!("cases/{c}/attempts/1")))["wrapper"].is_null()
        })
    });
    let headless = engine_record(&sb.out()).expect("engine.json");
    assert!(headless.get("ui_address").is_none(), "{headless}");

    let mut ui = sb.spawn(&["engine", "ui", "--output-dir", &out], "ui.log");
    let mut address = None;
    wait_until(
        Duration::from_secs(90),
        "engine ui prints its address",
        || {
            address = address_after(
                &sb.read("ui.log"),
                "Temporal Web UI of the embedded engine at ",
            );
            address.is_some()
        },
    );
    let address = address.unwrap();
    let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
    assert!(address.starts_with("http://127.0.0.1:"), "{address}");
    let record = engine_record(&sb.out()).expect("engine.json");
    assert_eq!(record["ui_address"], address.as_str(), "{record}");
    assert_eq!(record["address"], headless["address"], "same frontend port");
    assert!(!engine_alive(&headless), "the headless server was replaced");
    let status = sb.run(&["engine", "status", "--output-dir", &out]);
    assert!(
        stdout(&status).contains(&format!("Web UI at {address}")),
        "{}",
        stdout(&status)
    );

    // The UI server's API (what its page fetches) lists the batch's workflow.
    wait_until(
        Duration::from_secs(60),
        "the UI's API lists the batch",
        || {
            http_get(port, "/api/v1/namespaces/default/workflows")
                .is_some_and(|(code, body)| code == 200 && body.contains("casebatch-ui-engine"))
        },
    );

    sb.write("go", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        0,
        "the batch survives the restart: {}",
        tail(&sb.path("run.log"), 20)
    );
    assert!(engine_alive(&record), "engine ui still uses it");
    assert_eq!(stop(&mut ui), 0, "{}", sb.read("ui.log"));
    wait_until(
        Duration::from_secs(10),
        "the last user out stops the engine",
        || !engine_alive(&record),
    );
}
