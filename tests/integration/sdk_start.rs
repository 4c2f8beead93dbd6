//! Batches started from another Temporal SDK: `batch prepare` writes the bundle and prints the
//! start request, Python's `temporalio` sends it (examples/start_from_python.py), and the run
//! is a normal batch: status, drain, resume and report work on it, and no case runs twice.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// The Python interpreter with the `temporalio` package, or a skip (a failure in CI, which
/// installs it and sets CASEBATCH_REQUIRE_PYTHON_SDK).
fn python_sdk_or_skip(test: &str) -> Option<&'static str> {
    let found = Command::new("python3")
        .args(["-c", "import temporalio"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CASEBATCH_REQUIRE_PYTHON_SDK").is_none(),
            "{test}: no Python `temporalio` package and CASEBATCH_REQUIRE_PYTHON_SDK is set"
        );
        eprintln!("SKIPPED {test}: no Python `temporalio` (pip install temporalio)");
    }
    found.then_some("python3")
}

#[test]
fn a_batch_prepared_and_started_from_the_python_sdk_is_a_normal_batch() {
    let Some(python) = python_sdk_or_skip("a_batch_prepared_and_started_from_the_python_sdk")
    else {
        return;
    };
    let sb = Sandbox::engine();
    let out = sb.out().display().to_string();
    // One case at a time, each waiting for `go`, each start counted.
    let manifest = sb.write(
        "from-sdk.yaml",
        r#"batch_id: from-sdk
defaults:
  concurrency: 1
  runtime: local-process
  pass_env: [SANDBOX]
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/runs"; while [ ! -e "$SANDBOX/go" ]; do sleep 0.05; done; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: a
  - task_id: b
  - task_id: c
"#,
    );
    // A worker holds the embedded engine: the request is sent to it from outside casebatch.
    let mut worker = sb.spawn(&["worker", "--output-dir", &out], "worker.log");
    let address = engine_address(&sb.out());

    let prepared = sb.run(&[
        "batch",
        "prepare",
        "--manifest",
        manifest.to_str().unwrap(),
        "--output-dir",
        &out,
    ]);
    assert_exit(&prepared, 0);
    let request: serde_json::Value = serde_json::from_slice(&prepared.stdout).unwrap();
    assert_eq!(request["workflow_id"], "casebatch-from-sdk");
    assert_eq!(request["workflow_type"], "BatchWorkflow");
    assert_eq!(request["search_attributes"]["CasebatchBatchId"], "from-sdk");
    let plan = sb.json(&sb.bundle("from-sdk").join("batch_plan.json"));
    assert_eq!(request["input"]["fingerprint"], plan["fingerprint"]);
    assert_eq!(request["memo"]["fingerprint"], plan["fingerprint"]);
    assert!(sb.bundle("from-sdk").join("run_config.json").exists());
    assert!(
        !sb.path("runs").exists(),
        "prepare runs nothing: {}",
        sb.read("runs")
    );
    let request_file = sb.write("request.json", &stdout(&prepared));

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/start_from_python.py"
    );
    let started = Command::new(python)
        .args([script, &address, request_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit(&started, 0);
    let started: serde_json::Value = serde_json::from_slice(&started.stdout).unwrap();
    assert_eq!(started["status"]["batch_id"], "from-sdk", "{started}");

    // Sent twice, the start is refused by the engine; prepared again, by casebatch.
    let again = Command::new(python)
        .args([script, &address, request_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!again.status.success(), "a second start of a running batch");
    let refused = sb.run(&[
        "batch",
        "prepare",
        "--manifest",
        manifest.to_str().unwrap(),
        "--output-dir",
        &out,
    ]);
    assert!(
        stderr(&refused).contains("still running"),
        "{}",
        stderr(&refused)
    );
    assert_ne!(refused.status.code(), Some(0));

    // casebatch's own commands find it: status, then drain once the first case runs.
    wait_until(Duration::from_secs(60), "the first case runs", || {
        sb.path("runs").exists()
    });
    let status = sb.status("from-sdk");
    assert_eq!(status["status"]["counts"]["running"], 1, "{status:#}");
    assert_exit(&sb.op("drain", "from-sdk"), 0);
    sb.write("go", "");
    wait_until(Duration::from_secs(60), "the drained run ends", || {
        let s = sb.status("from-sdk");
        s["live"] == false && s["status"]["counts"]["succeeded"] == 1
    });

    // Resumed by casebatch, it finishes without running a case twice.
    assert_exit(&sb.op("resume", "from-sdk"), 0);
    let summary = sb.json(&sb.bundle("from-sdk").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 3, "{summary:#}");
    assert_eq!(
        sb.lines("runs"),
        3,
        "each case ran once: {}",
        sb.read("runs")
    );
    assert_exit(&sb.op("report", "from-sdk"), 0);
    assert_eq!(stop(&mut worker), 0, "{}", sb.read("worker.log"));
}
