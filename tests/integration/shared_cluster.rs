//! One Temporal namespace shared by many users (a standalone dev server stands in for the
//! cluster): a batch id someone else uses is refused, commands stay on the batch's engine, a
//! run nobody works on says so, and a batch terminated with Temporal's own tools exits 6 and
//! resumes without re-running anything.

use std::path::Path;
use std::time::Duration;

use crate::support::*;

fn fake_manifest(sb: &Sandbox, name: &str, task: &str) -> std::path::PathBuf {
    sb.write(
        name,
        &format!("batch_id: shared\ndefaults: {{runtime: fake}}\ntasks: [{{task_id: {task}}}]\n"),
    )
}

fn run_in(sb: &Sandbox, manifest: &Path, out: &Path, address: &str) -> std::process::Output {
    let mut args = batch_run_args(manifest, out).to_vec();
    args.extend(["--address", address]);
    sb.run(&args)
}

#[test]
fn a_batch_id_someone_else_runs_is_refused_and_commands_stick_to_the_batchs_engine() {
    let sb = Sandbox::engine();
    let cluster = Cluster::start(&sb);
    let (out_a, out_b) = (sb.path("alice"), sb.path("bob"));
    let alice = fake_manifest(&sb, "alice.yaml", "x");
    assert_exit(&run_in(&sb, &alice, &out_a, &cluster.address), 0);

    // Bob picks the same batch id for another task list, and then for the same one.
    let bob = fake_manifest(&sb, "bob.yaml", "y");
    for manifest in [&bob, &alice] {
        let o = run_in(&sb, manifest, &out_b, &cluster.address);
        assert_exit(&o, 2);
        let err = stderr(&o);
        assert!(err.contains("not this batch's"), "{err}");
        assert!(
            err.contains(out_a.to_str().unwrap()),
            "names the owner's bundle: {err}"
        );
        assert!(err.contains(out_b.to_str().unwrap()), "names ours: {err}");
        assert!(
            !out_b.join("shared").exists(),
            "nothing is written for a refused batch"
        );
    }

    // Without engine flags, a command uses the engine the batch runs on.
    let status_of_a = |extra: &[&str]| {
        let mut args = vec!["batch", "status", "--batch-id", "shared"];
        args.extend(["--output-dir", out_a.to_str().unwrap()]);
        args.extend(extra);
        sb.run(&args)
    };
    let status = status_of_a(&["--json"]);
    assert_exit(&status, 0);
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(s["status"]["counts"]["succeeded"], 1, "{s:#}");
    assert!(
        !out_a.join(".casebatch-engine").exists(),
        "no embedded engine was started beside a cluster batch"
    );
    // Another engine is refused, naming the recorded one.
    let elsewhere = format!("127.0.0.1:{}", free_port());
    let o = status_of_a(&["--address", &elsewhere]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains(&cluster.address), "{}", stderr(&o));
}

#[test]
fn a_run_nobody_works_on_says_so_and_a_terminated_batch_exits_6_then_resumes() {
    let sb = Sandbox::engine();
    let cluster = Cluster::start(&sb);
    let out = sb.out();
    let manifest = sb.write(
        "gated.yaml",
        r#"batch_id: gated
defaults:
  runtime: local-process
  pass_env: [SANDBOX]
  concurrency: 1
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ran.log"; while [ ! -e "$SANDBOX/go" ]; do sleep 0.05; done; echo "{}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: a}, {task_id: b}]
"#,
    );
    let mut runner = sb.spawn_batch_on_cluster(&manifest, &cluster, "run.log");
    wait_until(
        Duration::from_secs(60),
        "the runner says no worker polls",
        || sb.read("run.log").contains("no worker polls task queue"),
    );

    let out_arg = out.to_str().unwrap();
    let mut worker = sb.spawn(
        &[
            "worker",
            "--output-dir",
            out_arg,
            "--address",
            &cluster.address,
        ],
        "worker.log",
    );
    wait_until(Duration::from_secs(60), "case a starts", || {
        sb.lines("ran.log") >= 1
    });
    let o = cluster.temporal(&["workflow", "terminate", "--workflow-id", "casebatch-gated"]);
    assert_exit(&o, 0);
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(60)),
        6,
        "a terminated batch has its own exit code\n{}",
        sb.read("run.log")
    );
    assert!(
        sb.read("run.log").contains("terminated"),
        "{}",
        sb.read("run.log")
    );

    // Resume (no engine flags: the batch's own engine) adopts the job that outlived the
    // terminated run instead of starting case a again.
    sb.write("go", "");
    let o = sb.run(&[
        "batch",
        "resume",
        "--batch-id",
        "gated",
        "--output-dir",
        out_arg,
        "--no-worker",
    ]);
    assert_eq!(stop(&mut worker), 0, "the worker stops on SIGTERM");
    assert_exit(&o, 0);
    assert_eq!(
        sb.lines("ran.log"),
        2,
        "each case ran once: {}",
        sb.read("ran.log")
    );
}
