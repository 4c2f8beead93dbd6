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
    let sb = Sandbox::new();
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
    let mut runner = sb.spawn(
        &[
            "batch",
            "run",
            "--no-worker",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
            "--address",
            &cluster.address,
        ],
        "run.log",
    );
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
