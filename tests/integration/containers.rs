//! `sandbox.provider: container` end to end, against a real container engine (podman's
//! Docker-compatible service here, `scripts/container-engine.sh`): one fresh container per
//! attempt with the harness contract mounted at `/casebatch`, the evaluator beside it, limits
//! and OOM read from the engine, and nothing of the attempt left on the engine after cleanup.

use crate::support::*;
use serde_json::Value;

/// The tests' image (built by `scripts/container-engine.sh` from the host's static busybox).
pub(crate) const IMAGE: &str = "localhost/casebatch-test-busybox:1";

/// The engine at `DOCKER_HOST`, or `None` (the test is skipped with a notice) when it is not
/// set, unless `CASEBATCH_REQUIRE_CONTAINERS` is (CI sets it: there a missing engine fails
/// the test rather than passing it unseen).
pub(crate) fn engine_or_skip(test: &str) -> Option<String> {
    let host = std::env::var("DOCKER_HOST").ok();
    if host.is_none() {
        assert!(
            std::env::var_os("CASEBATCH_REQUIRE_CONTAINERS").is_none(),
            "{test}: DOCKER_HOST is not set and CASEBATCH_REQUIRE_CONTAINERS is"
        );
        eprintln!(
            "SKIPPED {test}: no container engine (export DOCKER_HOST=$(bash scripts/container-engine.sh))"
        );
    }
    host
}

/// The engine's containers labelled with `batch`, by name, as the engine lists them.
pub(crate) fn containers_of(host: &str, batch: &str) -> Vec<String> {
    let o = std::process::Command::new("podman")
        .args(["--url", host, "ps", "--all", "--format", "{{.Names}}"])
        .arg(format!("--filter=label=io.casebatch.batch-id={batch}"))
        .output()
        .expect("podman");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The batch's containers the engine says are running.
pub(crate) fn running_of(host: &str, batch: &str) -> Vec<String> {
    let o = std::process::Command::new("podman")
        .args(["--url", host, "ps", "--format", "{{.Names}}"])
        .arg(format!("--filter=label=io.casebatch.batch-id={batch}"))
        .arg("--filter=status=running")
        .output()
        .expect("podman");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn receipt(sb: &Sandbox, batch: &str, case_dir: &str, attempt: u32) -> Value {
    sb.recorded(batch, case_dir, attempt, "cleanup")
}

#[test]
fn each_attempt_runs_in_a_fresh_container_with_its_evaluator_beside_it_and_none_is_left() {
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("containers::each_attempt_runs_in_a_fresh_container") else {
        return;
    };
    // Attempt 1 leaves a file in its working directory and declares a retryable infra
    // failure; attempt 2 must not see that file. Both record where they ran.
    let manifest = sb.write(
        "boxed.yaml",
        &format!(
            r#"batch_id: boxed
defaults:
  runtime: local-process
  max_retries: 1
  sandbox: {{provider: container, template: "{IMAGE}", network: none}}
  env: {{GREETING: hello}}
  harness: |
    set -e
    hostname > "$CASEBATCH_OUTPUT_DIR/host"
    ls /sys/class/net > "$CASEBATCH_OUTPUT_DIR/networks"
    ls -A . > "$CASEBATCH_OUTPUT_DIR/found_in_work"
    cp "$CASEBATCH_INPUT" "$CASEBATCH_OUTPUT_DIR/input_seen"
    echo "$GREETING from $(pwd)"
    touch left-by-attempt-$CASEBATCH_ATTEMPT
    if [ "$CASEBATCH_ATTEMPT" = 1 ]; then
      echo '{{"failure": {{"class": "infra", "code": "FLAKY", "retryable": true}}}}' > "$CASEBATCH_RESULT"
      exit 1
    fi
    echo '{{"outputs": {{"answer": 42}}}}' > "$CASEBATCH_RESULT"
  evaluator: |
    test -f /casebatch/work/left-by-attempt-2 || {{ echo "the actor's work is not here" >&2; exit 3; }}
    grep -q 42 "$CASEBATCH_ACTOR_RESULT" && echo '{{"verdict": "pass", "scores": {{"seen": 1}}}}' > "$CASEBATCH_RESULT"
tasks:
  - task_id: t1
    query: what is in the box
"#
        ),
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 0);
    let r = sb.case_result("boxed", "t1");
    assert_eq!(r["state"], "succeeded", "{r:#}");
    assert_eq!(r["attempts"], 2, "{r:#}");
    assert_eq!(r["verdict"], "pass", "{r:#}");
    // Nothing crashed: no attempt was adopted, and the summary's recovery count says none.
    assert_eq!(r["adopted"], false, "{r:#}");
    for attempt in 1..=2 {
        let record = sb.recorded("boxed", "t1", attempt, "record");
        assert_eq!(record["summary"]["adopted"], false, "{record:#}");
    }

    let out = |n: u32, f: &str| {
        std::fs::read_to_string(sb.attempt_file("boxed", "t1", n, &format!("output/{f}")))
            .unwrap_or_else(|e| panic!("attempt {n}'s {f}: {e}"))
    };
    assert_ne!(out(1, "host"), out(2, "host"), "one container per attempt");
    assert_eq!(
        out(1, "networks").trim(),
        "lo",
        "network: none leaves only loopback"
    );
    assert_eq!(
        out(2, "found_in_work").trim(),
        "",
        "attempt 2 starts in a fresh work dir"
    );
    assert!(out(2, "input_seen").contains("what is in the box"));
    let stdout = std::fs::read_to_string(sb.attempt_file("boxed", "t1", 2, "stdout.log")).unwrap();
    assert_eq!(
        stdout.trim(),
        "hello from /casebatch/work",
        "logs harvested from the engine"
    );

    for attempt in [1, 2] {
        let receipt = receipt(&sb, "boxed", "t1", attempt);
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
        assert_eq!(receipt["method"], "container", "{receipt:#}");
        let containers = receipt["containers"].as_array().unwrap();
        let actor = &containers[0];
        assert_eq!(actor["role"], "actor", "{receipt:#}");
        assert_eq!(actor["exit_code"], if attempt == 1 { 1 } else { 0 });
        assert_eq!(actor["removed"], true);
        assert_eq!(actor["image"], IMAGE);
        assert!(
            actor["image_id"].as_str().unwrap().len() >= 12,
            "{receipt:#}"
        );
        assert_eq!(actor["id"].as_str().unwrap().len(), 64, "{receipt:#}");
    }
    // The evaluator ran once, after the attempt that succeeded, and was removed with it.
    let receipt = receipt(&sb, "boxed", "t1", 2);
    assert_eq!(receipt["containers"][1]["role"], "evaluator", "{receipt:#}");
    assert_eq!(receipt["containers"][1]["exit_code"], 0, "{receipt:#}");
    assert!(
        containers_of(&host, "boxed").is_empty(),
        "the engine keeps nothing of the batch"
    );
}

#[test]
fn a_container_past_its_memory_limit_is_oom_killed_and_the_retry_gets_more() {
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("containers::a_container_past_its_memory_limit") else {
        return;
    };
    // 100 MiB in one buffer under a 32 MiB limit (memory and swap alike); with auto-boost the
    // next attempt's container gets twice the limit, then four times: enough at 128 MiB.
    let manifest = sb.write(
        "hog.yaml",
        &format!(
            r#"batch_id: hog
defaults:
  runtime: local-process
  resources: {{memory_mb: 32}}
  oom_auto_boost: true
  max_retries: 0
  sandbox: {{provider: container, template: "{IMAGE}"}}
  harness: 'dd if=/dev/zero of=/dev/null bs=100M count=1 && echo "{{}}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: hog
"#
        ),
    );
    let o = sb.run_batch(&manifest);
    let r = sb.case_result("hog", "hog");
    assert_exit(&o, 0);
    assert_eq!(r["state"], "succeeded", "{r:#}");
    assert_eq!(
        r["attempts"], 3,
        "32 and 64 MiB are too small, 128 is enough: {r:#}"
    );
    assert_eq!(r["memory_boost_mb"], 128, "{r:#}");
    let steps = sb.status("hog")["status"]["timeline"].to_string();
    assert!(steps.contains("OOM auto-boost 32 → 64 MB"), "{steps}");
    let receipt = receipt(&sb, "hog", "hog", 1);
    assert_eq!(receipt["containers"][0]["exit_code"], 137, "{receipt:#}");
    assert!(containers_of(&host, "hog").is_empty());
}

/// The runner SIGKILLs itself (the worker's test hook) once four containers are started and
/// before their submits return: resume finds each container by its name and harvests it,
/// there is exactly one container per attempt (counted by label), and no harness runs twice
/// (each start appends a line to its attempt's `output/runs`).
#[test]
fn a_runner_killed_after_starting_containers_adopts_them_on_resume_and_never_starts_twice() {
    use std::os::unix::process::ExitStatusExt;
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("containers::a_runner_killed_after_starting_containers") else {
        return;
    };
    let manifest = sb.write(
        "window.yaml",
        &format!(
            r#"batch_id: cwindow
defaults:
  runtime: local-process
  concurrency: 4
  sandbox: {{provider: container, template: "{IMAGE}"}}
  harness: 'echo started >> "$CASEBATCH_OUTPUT_DIR/runs"; echo "out of $CASEBATCH_CASE_ID"; sleep 2; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks: [{{task_id: c1}}, {{task_id: c2}}, {{task_id: c3}}, {{task_id: c4}}]
"#
        ),
    );
    let mut runner = sb.spawn_batch_with_env(
        &manifest,
        "run.log",
        &[("CASEBATCH_FAULT_POINT", "after-spawn:4")],
    );
    let status = wait_status(&mut runner, std::time::Duration::from_secs(120));
    assert_eq!(
        status.signal(),
        Some(9),
        "the runner must die at the fault point: {}",
        sb.read("run.log")
    );
    let started = containers_of(&host, "cwindow");
    assert_eq!(started.len(), 4, "all four started: {started:?}");

    // While resume runs, the engine never holds a second container of any attempt.
    let watching = std::sync::atomic::AtomicBool::new(true);
    let most = std::thread::scope(|scope| {
        let most = scope.spawn(|| {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(containers_of(&host, "cwindow").len());
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            most
        });
        assert_exit(&sb.op("resume", "cwindow"), 0);
        watching.store(false, std::sync::atomic::Ordering::Relaxed);
        most.join().unwrap()
    });
    assert!(most <= 4, "{most} containers of four attempts at once");
    for case in ["c1", "c2", "c3", "c4"] {
        let r = sb.case_result("cwindow", case);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["attempts"], 1, "{r:#}");
        assert_eq!(
            r["adopted"], true,
            "harvested from the dead runner's container: {r:#}"
        );
        let runs = sb.attempt_file("cwindow", case, 1, "output/runs");
        assert_eq!(
            std::fs::read_to_string(runs).unwrap(),
            "started\n",
            "case {case} started exactly once"
        );
        let log =
            std::fs::read_to_string(sb.attempt_file("cwindow", case, 1, "stdout.log")).unwrap();
        assert_eq!(log, format!("out of {case}\n"));
    }
    assert!(containers_of(&host, "cwindow").is_empty());
}

/// Containers whose bundle is gone are garbage: `sandbox gc` lists them and removes nothing,
/// `--apply` removes them (scoped by `--batch-id`: another batch's scope leaves them), and
/// another batch's live containers are never touched.
#[test]
fn sandbox_gc_lists_containers_whose_bundle_is_gone_and_removes_them_only_when_applied() {
    use std::os::unix::process::ExitStatusExt;
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("containers::sandbox_gc_lists_containers") else {
        return;
    };
    let manifest = sb.write(
        "orphans.yaml",
        &format!(
            r#"batch_id: orphans
defaults:
  runtime: local-process
  concurrency: 2
  sandbox: {{provider: container, template: "{IMAGE}"}}
  harness: 'echo "{{}}" > "$CASEBATCH_RESULT"'
tasks: [{{task_id: o1}}, {{task_id: o2}}]
"#
        ),
    );
    // The runner dies with both containers started: nothing cleans them up.
    let mut runner = sb.spawn_batch_with_env(
        &manifest,
        "run.log",
        &[("CASEBATCH_FAULT_POINT", "after-spawn:2")],
    );
    let status = wait_status(&mut runner, std::time::Duration::from_secs(120));
    assert_eq!(status.signal(), Some(9), "{}", sb.read("run.log"));
    let left = containers_of(&host, "orphans");
    assert_eq!(left.len(), 2, "{left:?}");
    std::fs::remove_dir_all(sb.bundle("orphans")).unwrap();

    let ours = |o: &std::process::Output| -> Vec<Value> {
        assert_exit(o, 0);
        let all: Vec<Value> = serde_json::from_str(&stdout(o)).unwrap();
        all.into_iter()
            .filter(|c| left.contains(&c["name"].as_str().unwrap().to_string()))
            .collect()
    };
    let listed = ours(&sb.run(&["sandbox", "gc", "--json"]));
    assert_eq!(listed.len(), 2, "{listed:?}");
    for c in &listed {
        assert_eq!(c["verdict"], "bundle_gone", "{c:#}");
        assert_eq!(c["removed"], false, "a dry run removes nothing: {c:#}");
    }
    assert_eq!(
        containers_of(&host, "orphans").len(),
        2,
        "still there after the dry run"
    );

    // Scoped to another batch, --apply touches none of them.
    let elsewhere = ours(&sb.run(&["sandbox", "gc", "--apply", "--batch-id", "x", "--json"]));
    assert!(elsewhere.is_empty(), "{elsewhere:?}");
    assert_eq!(containers_of(&host, "orphans").len(), 2);

    let applied = ours(&sb.run(&[
        "sandbox",
        "gc",
        "--apply",
        "--batch-id",
        "orphans",
        "--json",
    ]));
    assert!(applied.iter().all(|c| c["removed"] == true), "{applied:?}");
    assert!(containers_of(&host, "orphans").is_empty());
}

/// `batch run --supersede` on a batch whose cases run in containers: the stale run's
/// containers stop within 15 s (killed by label on the engine, then removed by their cases'
/// cleanup), and the new run finishes the cases.
#[test]
fn supersede_stops_a_stale_batch_s_running_containers_within_15_s() {
    use std::time::{Duration, Instant};
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("containers::supersede_stops_a_stale_batch_s_running") else {
        return;
    };
    // First attempts sleep far past the test; the re-fire's attempts end at once.
    let manifest = sb.write(
        "stale.yaml",
        &format!(
            r#"batch_id: cstale
defaults:
  runtime: local-process
  concurrency: 2
  sandbox: {{provider: container, template: "{IMAGE}"}}
  harness: 'if [ "$CASEBATCH_ATTEMPT" = 1 ]; then sleep 600; fi; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks: [{{task_id: s1}}, {{task_id: s2}}]
"#
        ),
    );
    let mut stale = sb.spawn_batch(&manifest, "stale.log");
    wait_until(Duration::from_secs(90), "two running containers", || {
        running_of(&host, "cstale").len() == 2
    });
    let out = sb.out();
    let superseded = Instant::now();
    let mut refire = sb.spawn(
        &[
            "batch",
            "run",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
            "--supersede",
        ],
        "refire.log",
    );
    // Names end `-a<attempt>-<hash>`: the stale run's are its first attempts.
    let first_attempts_running = || {
        running_of(&host, "cstale")
            .iter()
            .filter(|n| n.contains("-a1-"))
            .count()
    };
    wait_until(
        Duration::from_secs(15),
        "the stale run's containers stop",
        || first_attempts_running() == 0,
    );
    eprintln!("stopped {:?} after supersede", superseded.elapsed());
    assert_eq!(
        wait_child(&mut stale, Duration::from_secs(60)),
        1,
        "the superseded runner ends incomplete: {}",
        sb.read("stale.log")
    );
    assert_eq!(
        wait_child(&mut refire, Duration::from_secs(120)),
        0,
        "{}",
        sb.read("refire.log")
    );
    for case in ["s1", "s2"] {
        let r = sb.case_result("cstale", case);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        let receipt = receipt(&sb, "cstale", case, 1);
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
        assert_eq!(
            receipt["containers"][0]["exit_code"], 137,
            "killed: {receipt:#}"
        );
    }
    let events = std::fs::read_to_string(sb.bundle("cstale").join("events.jsonl")).unwrap();
    assert!(
        events.contains("superseded: 2 job(s) killed on this host's container engine"),
        "{events}"
    );
    assert!(containers_of(&host, "cstale").is_empty());
}

/// `sandbox gc --apply` keeps a container whose attempt is still running (its bundle is
/// there and its attempt open); the batch's own cancel then removes it.
#[test]
fn sandbox_gc_keeps_a_running_attempt_s_container() {
    use std::time::Duration;
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("containers::sandbox_gc_keeps_a_running") else {
        return;
    };
    let manifest = sb.write(
        "alive.yaml",
        &format!(
            r#"batch_id: calive
defaults:
  runtime: local-process
  sandbox: {{provider: container, template: "{IMAGE}"}}
  harness: 'sleep 600'
tasks: [{{task_id: a1}}]
"#
        ),
    );
    let mut runner = sb.spawn_batch(&manifest, "alive.log");
    wait_until(Duration::from_secs(90), "its container runs", || {
        running_of(&host, "calive").len() == 1
    });
    let name = running_of(&host, "calive").remove(0);
    // Scoped to this batch: concurrent tests' garbage is theirs to sweep.
    let o = sb.run(&["sandbox", "gc", "--apply", "--batch-id", "calive", "--json"]);
    assert_exit(&o, 0);
    let all: Vec<Value> = serde_json::from_str(&stdout(&o)).unwrap();
    let entry = all
        .iter()
        .find(|c| c["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not listed: {all:?}"));
    assert_eq!(entry["verdict"], "in_use", "{entry:#}");
    assert_eq!(entry["removed"], false, "{entry:#}");
    assert_eq!(running_of(&host, "calive"), vec![name], "still running");

    assert_exit(&sb.op("cancel", "calive"), 0);
    wait_child(&mut runner, Duration::from_secs(90));
    assert!(containers_of(&host, "calive").is_empty());
}

/// `network: none` cuts a harness off from a port on the host's loopback, which the same
/// harness reaches as a host process (so the probe itself works): a listener counts who
/// connected.
#[test]
fn network_none_keeps_a_harness_off_the_host_s_loopback() {
    use std::io::Write;
    let sb = Sandbox::engine();
    if engine_or_skip("containers::network_none_keeps_a_harness_off").is_none() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = stream.write_all(b"reached\n");
        }
    });
    // The probe's outcome is the case's output, whether or not it connected (busybox's nc:
    // the one client both the host and the tests' image have).
    let harness = format!(
        r#"r=$(busybox nc -w 3 127.0.0.1 {port} </dev/null 2>/dev/null); [ -n "$r" ] || r=refused; echo "{{\"outputs\": {{\"probe\": \"$r\"}}}}" > "$CASEBATCH_RESULT""#
    );
    let manifest = sb.write(
        "net.yaml",
        &format!(
            r#"batch_id: cnet
defaults:
  runtime: local-process
  harness: '{harness}'
tasks:
  - task_id: boxed
    sandbox: {{provider: container, template: "{IMAGE}", network: none}}
  - task_id: host
    sandbox: {{provider: local}}
"#
        ),
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 0);
    let probe = |case: &str| sb.case_result("cnet", case)["outputs"]["probe"].clone();
    assert_eq!(probe("host"), "reached", "the probe works from the host");
    assert_eq!(probe("boxed"), "refused", "network: none reaches nothing");
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Provisioning a container case is the pull and the create: with `prepare_ahead`, the next
/// case's container stands created (not started) while the running case works, and its
/// start later runs that very container (one per attempt, as the engine counts them).
#[test]
fn prepare_ahead_creates_the_next_case_s_container_while_another_runs() {
    use std::time::Duration;
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("containers::prepare_ahead_creates") else {
        return;
    };
    // Each case waits for its gate, a file the test writes into its output directory.
    let manifest = sb.write(
        "ahead.yaml",
        &format!(
            r#"batch_id: cahead
defaults:
  runtime: local-process
  concurrency: 1
  prepare_ahead: 1
  sandbox: {{provider: container, template: "{IMAGE}"}}
  harness: 'hostname > "$CASEBATCH_OUTPUT_DIR/host"; while [ ! -e "$CASEBATCH_OUTPUT_DIR/go" ]; do sleep 0.1; done; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks: [{{task_id: p1}}, {{task_id: p2}}]
"#
        ),
    );
    let created_of = |batch: &str| -> Vec<String> {
        let o = std::process::Command::new("podman")
            .args(["--url", &host, "ps", "--all", "--format", "{{.Names}}"])
            .arg(format!("--filter=label=io.casebatch.batch-id={batch}"))
            .arg("--filter=status=created")
            .output()
            .expect("podman");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    let gate = |case: &str| sb.attempt_file("cahead", case, 1, "output/go");
    wait_until(
        Duration::from_secs(90),
        "p1 runs while p2's container stands created",
        || running_of(&host, "cahead").len() == 1 && created_of("cahead").len() == 1,
    );
    let waiting = created_of("cahead").remove(0);
    assert!(waiting.contains("-p2-a1-"), "{waiting}");
    assert_eq!(
        containers_of(&host, "cahead").len(),
        2,
        "one container per attempt, the second not started"
    );
    std::fs::write(gate("p1"), "").unwrap();
    wait_until(Duration::from_secs(60), "p2's container runs", || {
        running_of(&host, "cahead") == vec![waiting.clone()]
    });
    std::fs::write(gate("p2"), "").unwrap();
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(90)),
        0,
        "{}",
        sb.read("run.log")
    );
    for case in ["p1", "p2"] {
        let r = sb.case_result("cahead", case);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["attempts"], 1, "{r:#}");
        let receipt = receipt(&sb, "cahead", case, 1);
        assert_eq!(receipt["held_job"], true, "{receipt:#}");
        assert_eq!(receipt["containers"][0]["exit_code"], 0, "{receipt:#}");
    }
    let p2 = sb.recorded("cahead", "p2", 1, "container");
    assert_eq!(p2["provisioned"], true, "{p2:#}");
    assert!(
        p2["started_at_ms"].as_u64().unwrap() > p2["created_at_ms"].as_u64().unwrap(),
        "{p2:#}"
    );
    assert!(containers_of(&host, "cahead").is_empty());
}
