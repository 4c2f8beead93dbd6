//! Cleanup confirmation: every process of an attempt, including descendants that detached
//! from its process group, must be gone before `cleanup_confirmed: true`.

use std::time::Duration;

use crate::support::*;

#[test]
fn cleanup_finds_and_kills_a_detached_grandchild() {
    let sb = Sandbox::engine_alone();
    // The harness leaves a grandchild behind in a new session (setsid + background), as a
    // careless browser launcher would, then exits successfully.
    let manifest = sb.write(
        "leak.yaml",
        r#"batch_id: leak
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  harness: 'setsid sh -c "sleep 400; echo survived >> $SANDBOX/survivor.log" > /dev/null 2>&1 & echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: leaky
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 0);
    let receipt = journal_at(&sb.bundle("leak").join("cases/leaky/attempts/1"))["cleanup"].clone();
    assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    assert!(
        !receipt["killed"].as_array().unwrap().is_empty(),
        "the detached grandchild was found by its marker and killed: {receipt:#}"
    );
    // Killed is not yet gone: the orphan is reaped by init a moment later. A survivor is
    // described in full: where it lives says how it escaped. Only this sandbox's (its
    // environment names it): another `sleep 400` on the host is not the harness's.
    let log = sb.path("survivor.log");
    let sandbox = log.parent().expect("in the sandbox").display();
    let ours = || processes_with_env("sleep 400", &format!("SANDBOX={sandbox}"));
    let start = std::time::Instant::now();
    let mut left = ours();
    while !left.is_empty() && start.elapsed() < std::time::Duration::from_secs(15) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        left = ours();
    }
    assert!(
        left.is_empty(),
        "survivors of cleanup:\n{}\nreceipt: {receipt:#}",
        describe_processes(&left)
    );
    let result = sb.case_result("leak", "leaky");
    assert_eq!(
        result["state"], "succeeded",
        "cleanup is reported apart from the outcome"
    );
}

#[test]
fn an_environment_clearing_detached_descendant_is_killed_through_the_attempts_cgroup() {
    let sb = Sandbox::engine_alone();
    // `env -i` drops the allocation marker, so no scan of process environments can find it:
    // only membership of the attempt's cgroup does.
    let manifest = sb.write(
        "envless.yaml",
        r#"batch_id: envless
defaults:
  runtime: local-process
  harness: 'setsid env -i sleep 371 > /dev/null 2>&1 & echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: hidden
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 0);
    let attempt = sb.bundle("envless").join("cases/hidden/attempts/1");
    let receipt = journal_at(&attempt)["cleanup"].clone();
    assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    let method = receipt["method"].as_str().unwrap_or_default();
    assert!(method.starts_with("cgroup_"), "{receipt:#}");
    assert!(
        !receipt["killed"].as_array().unwrap().is_empty(),
        "the environment-less sleep was a member and was killed: {receipt:#}"
    );
    assert!(no_process_matches("sleep 371"), "a survivor: sleep 371");
    // The cgroup is removed with the attempt's processes.
    let job = journal_at(&attempt)["job"].clone();
    let dir = job["tracking"]["dir"]
        .as_str()
        .expect("a cgroup dir in the job record");
    assert!(!std::path::Path::new(dir).exists(), "{dir} is left behind");
}

/// A harness running as root can move a process out of the attempt's cgroup, where the
/// cgroup kill cannot see it. The receipt says confirmed only after a check that would see
/// it: a scan for the attempt's marker among the processes started since the job. The one
/// that escaped is named (and killed), the receipt is not confirmed, and the batch goes on.
#[test]
fn a_process_that_left_the_attempts_cgroup_keeps_the_receipt_unconfirmed_and_is_named() {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        eprintln!("skipped: only root can move a process out of its cgroup");
        return;
    }
    let sb = Sandbox::engine_alone();
    // The child writes its pid to the root of every cgroup hierarchy, says so, and sleeps;
    // the harness waits for that before it ends, so cleanup finds it outside.
    let manifest = sb.write(
        "escape.yaml",
        r#"batch_id: escape
defaults:
  runtime: local-process
  harness: 'if [ "$CASEBATCH_CASE_ID" = escapes ]; then sh -c "for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do echo \$\$ > \$f; done 2>/dev/null; touch moved; exec sleep 3017" > /dev/null 2>&1 & while [ ! -e moved ]; do sleep 0.05; done; fi; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: escapes
  - task_id: stays
"#,
    );
    let o = sb.run_batch(&manifest);
    let survivors = processes_matching("sleep 3017");
    for pid in &survivors {
        casebatch_attempt::local::procfs::kill_pid(*pid);
    }
    assert_exit(&o, 0);
    let receipt = sb.recorded("escape", "escapes", 1, "cleanup");
    assert_eq!(receipt["cleanup_confirmed"], false, "{receipt:#}");
    let escaped = receipt["escaped"].as_array().cloned().unwrap_or_default();
    assert_eq!(escaped.len(), 1, "{receipt:#}");
    let message = receipt["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("pid {}", escaped[0])) && message.contains("sleep 3017"),
        "the survivor is named: {receipt:#}"
    );
    assert_eq!(
        receipt["checks"],
        serde_json::json!(["cgroup_empty", "marker_scan"]),
        "{receipt:#}"
    );
    assert!(
        survivors.is_empty(),
        "cleanup killed the process it found outside the cgroup:\n{}",
        describe_processes(&survivors)
    );
    // The other case's cleanup is confirmed by the same checks, and both cases ran on.
    let other = sb.recorded("escape", "stays", 1, "cleanup");
    assert_eq!(other["cleanup_confirmed"], true, "{other:#}");
    assert_eq!(other["checks"], receipt["checks"], "{other:#}");
    for case in ["escapes", "stays"] {
        assert_eq!(sb.case_result("escape", case)["state"], "succeeded");
    }
}

/// Two bundles of one batch id on a host (a copied manifest, a second checkout) share the
/// attempt key `twin/0/1`. The cleanup of the batch that ends first must not take the other's
/// processes for its own, though they carry the same key and started after its job.
#[test]
fn a_batch_of_the_same_id_in_another_bundle_keeps_its_processes_through_the_others_cleanup() {
    let first = Sandbox::engine_alone();
    let second = Sandbox::engine_alone();
    let shared = first.path("shared");
    std::fs::create_dir(&shared).unwrap();
    let manifest = |sb: &Sandbox, harness: &str| {
        sb.write(
            "twin.yaml",
            &format!(
                r#"batch_id: twin
defaults:
  pass_env: [SHARED]
  runtime: local-process
  harness: '{harness}'
tasks:
  - task_id: only
"#
            ),
        )
    };
    // The first ends once the second's harness runs; the second, once the first has ended.
    let first_manifest = manifest(
        &first,
        r#"touch "$SHARED/first"; while [ ! -e "$SHARED/second" ]; do sleep 0.05; done; echo "{}" > "$CASEBATCH_RESULT""#,
    );
    let second_manifest = manifest(
        &second,
        r#"touch "$SHARED/second"; while [ ! -e "$SHARED/first-done" ]; do sleep 0.05; done; echo "{}" > "$CASEBATCH_RESULT""#,
    );
    let env = [("SHARED", shared.to_str().unwrap())];
    let mut first_run = first.spawn_batch_with_env(&first_manifest, "run.log", &env);
    wait_until(Duration::from_secs(120), "the first harness runs", || {
        shared.join("first").exists()
    });
    let mut second_run = second.spawn_batch_with_env(&second_manifest, "run.log", &env);
    assert_eq!(
        wait_child(&mut first_run, Duration::from_secs(120)),
        0,
        "{}",
        first.read("run.log")
    );
    std::fs::write(shared.join("first-done"), "").unwrap();
    assert_eq!(
        wait_child(&mut second_run, Duration::from_secs(120)),
        0,
        "the second batch's harness survived the first's cleanup: {}",
        second.read("run.log")
    );
    let receipt = first.recorded("twin", "only", 1, "cleanup");
    assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    assert_eq!(receipt["killed"], serde_json::json!([]), "{receipt:#}");
    let result = second.case_result("twin", "only");
    assert_eq!(result["state"], "succeeded", "{result:#}");
    assert_eq!(result["job_starts"], 1, "{result:#}");
}
