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
  pass_env: [SANDBOX]
  concurrency: 6
  runtime: local-process
  harness: 'echo "$CASEBATCH_CASE_ID $PPID" >> "$SANDBOX/ran.log"; sleep 1; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks:
{tasks}"#
        ),
    );
    let mut runner = sb.spawn_batch_without_worker(&manifest, "run.log");
    let mut w1 = sb.spawn(&["worker", "--output-dir", &out], "w1.log");
    let mut w2 = sb.spawn(&["worker", "--output-dir", &out], "w2.log");

    assert_eq!(wait_child(&mut runner, Duration::from_secs(180)), 0);
    for w in [&mut w1, &mut w2] {
        assert_eq!(stop(w), 0, "a worker stops cleanly on SIGTERM");
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

#[test]
fn with_an_address_casebatch_uses_that_cluster_and_starts_no_engine_of_its_own() {
    let sb = Sandbox::engine();
    let cluster = Cluster::start(&sb);
    let manifest = sb.write(
        "remote.yaml",
        "batch_id: remote\ndefaults: {runtime: fake}\ntasks: [{task_id: a}, {task_id: b}]\n",
    );
    let out = sb.out();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend([
            "--output-dir",
            out.to_str().unwrap(),
            "--address",
            &cluster.address,
        ]);
        sb.run(&all)
    };
    let o = run(&["batch", "run", "--manifest", manifest.to_str().unwrap()]);
    let status = run(&["batch", "status", "--batch-id", "remote", "--json"]);
    assert_exit(&o, 0);
    assert_exit(&status, 0);
    assert!(
        !out.join(".casebatch-engine").exists(),
        "no embedded engine was started"
    );
    let config = sb.json(&sb.bundle("remote").join("run_config.json"));
    assert_eq!(config["engine"]["mode"], "cluster", "{config:#}");
    assert!(
        config["engine"]["address"]
            .as_str()
            .unwrap()
            .contains(&cluster.address)
    );
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(s["status"]["counts"]["succeeded"], 2, "{s:#}");

    // Plaintext to a non-loopback address is refused before anything is written.
    let o = sb.run(&[
        "worker",
        "--output-dir",
        out.to_str().unwrap(),
        "--address",
        "192.0.2.1:7233",
    ]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("without TLS"), "{}", stderr(&o));
}
