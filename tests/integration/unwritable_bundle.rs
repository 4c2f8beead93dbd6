//! A worker whose user may not write the bundle (a container running as another uid than the
//! volume's owner): every case fails as `config`, naming the path and the uid, without
//! retries; the runner, which can write there, records those failures from the engine, so
//! `batch report` says why.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The unprivileged user the worker runs as (`nobody` on Debian).
const NOBODY: &str = "65534";

#[test]
fn a_worker_that_cannot_write_the_bundle_fails_cases_as_config_naming_path_and_uid() {
    let sb = Sandbox::engine();
    let cluster = Cluster::start(&sb);
    let out = sb.out();
    std::fs::create_dir_all(&out).unwrap();
    // Readable by everyone (the worker reads the plan), writable by this test's user only.
    for dir in [sb.dir.path(), out.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let manifest = sb.write(
        "unwritable.yaml",
        r#"batch_id: unwritable
defaults:
  runtime: local-process
  max_retries: 2
  harness: 'echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: one
  - task_id: two
"#,
    );
    let mut runner = sb.spawn_batch_on_cluster(&manifest, &cluster, "run.log");
    let log = std::fs::File::create(sb.path("worker.log")).unwrap();
    let mut worker = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_casebatch"))
        .args(["worker", "--address", &cluster.address])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("run a worker as nobody (setpriv, util-linux)");

    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(180)),
        4,
        "every case failed: {}\n{}",
        tail(&sb.path("run.log"), 20),
        tail(&sb.path("worker.log"), 20)
    );
    assert!(
        sb.read("run.log")
            .contains("could not be recorded by their worker"),
        "{}",
        sb.read("run.log")
    );
    let report = sb.run(&[
        "batch",
        "report",
        "--batch-id",
        "unwritable",
        "--output-dir",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_exit(&report, 0);
    let summary = &serde_json::from_slice::<serde_json::Value>(&report.stdout).unwrap()["summary"];
    assert_eq!(summary["counts"]["failed"], 2, "{summary:#}");
    for row in summary["rows"].as_array().unwrap() {
        assert_eq!(row["failure_class"], "config", "{row:#}");
        assert_eq!(row["failure_code"], "BUNDLE_UNWRITABLE", "{row:#}");
        assert_eq!(
            row["attempts"], 1,
            "a config failure is not retried: {row:#}"
        );
    }
    let result = sb.case_result("unwritable", "one");
    let message = result["failure"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("uid {NOBODY}")), "{message}");
    assert!(
        message.contains(&out.join("unwritable").display().to_string()),
        "names the path: {message}"
    );
    stop(&mut worker);
}

/// Lifts `chattr +i` from a directory when dropped, so a failing test still leaves a
/// sandbox its `TempDir` can remove.
struct Immutable(std::path::PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// The attempt's record and the case's result are written by `close` (the end of `settle`
/// for a final attempt, or `cleanup`). A case directory that refuses writes by then (made
/// immutable by the evaluator, so after the job ran and before `close`; root ignores
/// permission bits, not `chattr +i`) fails the attempt as `config/BUNDLE_UNWRITABLE` naming
/// the path, not as an unclassified error retried until the attempt is lost.
#[test]
fn a_case_directory_sealed_between_settle_and_close_fails_the_attempt_as_bundle_unwritable() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "sealed.yaml",
        r#"batch_id: sealed
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  concurrency: 2
  max_retries: 0
  harness: 'echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: one
    evaluator: 'chattr +i "$(dirname "$(dirname "$(dirname "$CASEBATCH_ACTOR_RESULT")")")" && echo "{\"verdict\": \"pass\"}" > "$CASEBATCH_RESULT"'
  - task_id: gate
    harness: 'while [ ! -e "$SANDBOX/gate" ]; do sleep 0.05; done; echo "{}" > "$CASEBATCH_RESULT"'
"#,
    );
    let case_dir = sb.bundle("sealed").join("cases/one");
    let _seal = Immutable(case_dir.clone());
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    // `gate` holds the run open: the runner records what its worker could not only at the
    // end, and by then the directory must take writes again.
    wait_until(Duration::from_secs(60), "case one is judged", || {
        !sb.recorded("sealed", "one", 1, "evaluation").is_null()
    });
    wait_until(Duration::from_secs(150), "case one fails", || {
        sb.status("sealed")["status"]["counts"]["failed"] == 1
    });
    let lifted = Command::new("chattr").arg("-i").arg(&case_dir).status();
    assert!(lifted.is_ok_and(|s| s.success()), "chattr -i {case_dir:?}");
    sb.write("gate", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        4,
        "one case failed: {}",
        tail(&sb.path("run.log"), 20)
    );

    let out = sb.out();
    let report = sb.run(&[
        "batch",
        "report",
        "--batch-id",
        "sealed",
        "--output-dir",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_exit(&report, 0);
    let summary = &serde_json::from_slice::<serde_json::Value>(&report.stdout).unwrap()["summary"];
    let row = summary["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["case_id"] == "one")
        .unwrap();
    assert_eq!(row["state"], "failed", "{row:#}");
    assert_eq!(row["failure_class"], "config", "{row:#}");
    assert_eq!(row["failure_code"], "BUNDLE_UNWRITABLE", "{row:#}");
    assert_eq!(row["attempts"], 1, "{row:#}");
    let result = case_dir.join("result.json").display().to_string();
    let message = row["failure_message"].as_str().unwrap_or_default();
    assert!(message.contains(&result), "names {result}: {row:#}");
    // The job ran to its end and was judged; the record of the attempt says why it failed.
    let evaluation = sb.recorded("sealed", "one", 1, "evaluation");
    assert_eq!(evaluation["verdict"], "pass", "{evaluation:#}");
    let attempt = sb.recorded("sealed", "one", 1, "record");
    let failure = &attempt["summary"]["failure"];
    assert_eq!(failure["code"], "BUNDLE_UNWRITABLE", "{attempt:#}");
    assert_eq!(sb.case_result("sealed", "gate")["state"], "succeeded");
}
