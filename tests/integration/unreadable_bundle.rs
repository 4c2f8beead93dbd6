//! A bundle file that is there but cannot be read (truncated JSON, a directory where a file
//! belongs, a file where a directory belongs) stops `batch report`, `diff`, `retry-failed` and
//! `resume` with exit 2, naming the file and the reason. Nothing is written, and no finished
//! case runs again: a damaged record is never read as one not written yet.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;

/// Two cases that pass; every execution appends a line to `$SANDBOX/runs`.
const MANIFEST: &str = r#"batch_id: intact
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  harness: 'echo "$CASEBATCH_BATCH_ID $CASEBATCH_CASE_ID" >> "$SANDBOX/runs"; echo "{\"scores\": {\"accuracy\": 1}}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: kept
  - task_id: damaged
"#;

/// Runs the two-case batch to success under `batch`; returns its bundle.
fn finished_batch(sb: &Sandbox, batch: &str) -> PathBuf {
    let manifest = sb.write("m.yaml", MANIFEST);
    let out = sb.out();
    let before = sb.lines("runs");
    let o = sb.run(&[
        "batch",
        "run",
        "--manifest",
        manifest.to_str().unwrap(),
        "--batch-id",
        batch,
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_exit(&o, 0);
    assert_eq!(sb.lines("runs"), before + 2, "each case ran once");
    sb.bundle(batch)
}

/// Cuts `damaged`'s result record off mid-way (a disk that filled, a bad copy); returns its
/// path and what it held.
fn truncate_result(bundle: &Path) -> (PathBuf, Vec<u8>) {
    let path = bundle.join("cases/damaged/result.json");
    let whole = std::fs::read(&path).unwrap();
    std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    (path, whole)
}

/// Every file under `dir` with its bytes, to show that nothing was written.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                files.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    files.sort();
    files
}

/// Exit 2, and stderr names `path` and says why it cannot be read and what to do.
fn refused_naming(o: &std::process::Output, path: &Path, reason: &str) {
    assert_exit(o, 2);
    let err = stderr(o);
    assert!(
        err.contains(&path.display().to_string()),
        "names the file {}:\n{err}",
        path.display()
    );
    assert!(err.contains(reason), "says {reason:?}:\n{err}");
    assert!(err.contains("restore that file"), "says what to do:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn report_refuses_a_damaged_bundle_naming_the_file_and_writes_nothing() {
    let sb = Sandbox::engine();
    let bundle = finished_batch(&sb, "intact");
    let report = || sb.op("report", "intact");
    assert_exit(&report(), 0);

    let (result, whole) = truncate_result(&bundle);
    let before = snapshot(&bundle);
    refused_naming(&report(), &result, "EOF while parsing");
    assert_eq!(snapshot(&bundle), before, "no batch file was rewritten");

    // A directory where the attempt's record belongs.
    std::fs::write(&result, whole).unwrap();
    let record = bundle.join("cases/damaged/attempts/1/attempt.jsonl");
    let kept = std::fs::read(&record).unwrap();
    std::fs::remove_file(&record).unwrap();
    std::fs::create_dir(&record).unwrap();
    refused_naming(&report(), &record, "not a regular file");
    std::fs::remove_dir(&record).unwrap();
    // A damaged line in it: never read past as if the attempt were still running.
    std::fs::write(&record, [&kept[..], b"{\"record\": tru\n"].concat()).unwrap();
    refused_naming(
        &report(),
        &record,
        "is not an entry of the attempt's record",
    );
    std::fs::write(&record, &kept).unwrap();

    // A file where the case's directory belongs: the case was read as queued, never run.
    let case = bundle.join("cases/damaged");
    std::fs::rename(&case, sb.path("moved-aside")).unwrap();
    std::fs::write(&case, "").unwrap();
    let before = snapshot(&bundle);
    refused_naming(&report(), &case.join("result.json"), "Not a directory");
    assert_eq!(snapshot(&bundle), before, "no batch file was rewritten");
    assert_eq!(sb.lines("runs"), 2, "a report runs nothing");
}

#[test]
fn diff_refuses_a_damaged_side_naming_the_file() {
    let sb = Sandbox::engine();
    finished_batch(&sb, "before");
    let after = finished_batch(&sb, "after");
    let out = sb.out();
    let diff = || {
        sb.run(&[
            "batch",
            "diff",
            "before",
            "after",
            "--output-dir",
            out.to_str().unwrap(),
            "--json",
        ])
    };
    assert_exit(&diff(), 0);

    let (result, whole) = truncate_result(&after);
    let o = diff();
    refused_naming(&o, &result, "EOF while parsing");
    assert!(
        stdout(&o).is_empty(),
        "no partial comparison: {}",
        stdout(&o)
    );

    // An attempt directory replaced by a file: its attempt was left out of the stats.
    std::fs::write(&result, whole).unwrap();
    let attempt = after.join("cases/kept/attempts/1");
    std::fs::remove_dir_all(&attempt).unwrap();
    std::fs::write(&attempt, "").unwrap();
    let o = diff();
    refused_naming(&o, &attempt, "not a directory");
    assert!(
        stdout(&o).is_empty(),
        "no partial comparison: {}",
        stdout(&o)
    );
    assert_eq!(sb.lines("runs"), 4, "a diff runs nothing");
}

#[test]
fn retry_failed_refuses_a_truncated_result_instead_of_rerunning_the_case() {
    let sb = Sandbox::engine();
    let bundle = finished_batch(&sb, "intact");
    let (result, _) = truncate_result(&bundle);
    let before = snapshot(&bundle);

    let o = sb.op("retry-failed", "intact");
    refused_naming(&o, &result, "EOF while parsing");
    assert_eq!(sb.lines("runs"), 2, "the passed case was not run again");
    assert!(
        !sb.bundle("intact-retry1").exists(),
        "no new batch was written"
    );
    assert_eq!(snapshot(&bundle), before, "the source batch is unchanged");
}

#[test]
fn resume_refuses_a_truncated_result_instead_of_rerunning_the_case() {
    let sb = Sandbox::engine();
    let bundle = finished_batch(&sb, "intact");
    // The engine no longer remembers the batch (a cluster's retention, a new dev-server
    // database): resume can only learn from the bundle where the batch stands.
    let engine_dir = sb.out().join(".casebatch-engine");
    if let Some(record) = engine_record(&sb.out()) {
        wait_until(Duration::from_secs(60), "the embedded engine stops", || {
            !engine_alive(&record)
        });
    }
    std::fs::remove_dir_all(&engine_dir).unwrap();
    let (result, whole) = truncate_result(&bundle);
    let before = snapshot(&bundle);

    let o = sb.op("resume", "intact");
    refused_naming(&o, &result, "EOF while parsing");
    assert_eq!(sb.lines("runs"), 2, "the finished case was not run again");
    assert_eq!(snapshot(&bundle), before, "nothing was written");

    // Restored, the same resume finds every case finished and runs nothing.
    std::fs::write(&result, whole).unwrap();
    assert_exit(&sb.op("resume", "intact"), 0);
    assert_eq!(sb.lines("runs"), 2, "nothing ran again");
}
