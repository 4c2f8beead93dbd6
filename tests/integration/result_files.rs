//! Result files are untrusted input: a harness (or evaluator) that leaves a FIFO, a symlink to
//! `/dev/zero`, or a huge file where its result belongs fails its own case as a harness
//! failure; the worker never blocks on it, never follows it, never reads past its limit.

use std::time::{Duration, Instant};

use crate::support::*;

const HARNESS: &str = r#"case "$CASEBATCH_CASE_ID" in
  fifo) rm -f "$CASEBATCH_RESULT"; mkfifo "$CASEBATCH_RESULT" ;;
  zero) rm -f "$CASEBATCH_RESULT"; ln -s /dev/zero "$CASEBATCH_RESULT" ;;
  big) { printf '{"outputs": {"pad": "'; head -c 20000000 /dev/zero | tr '\0' x; printf '"}}'; } > "$CASEBATCH_RESULT" ;;
  *) sleep 1; printf '{"outputs": {"answer": "ok"}}' > "$CASEBATCH_RESULT" ;;
esac
"#;

const EVALUATOR: &str = r#"case "$CASEBATCH_CASE_ID" in
  evalfifo) rm -f "$CASEBATCH_RESULT"; mkfifo "$CASEBATCH_RESULT" ;;
  *) printf '{"verdict": "pass"}' > "$CASEBATCH_RESULT" ;;
esac
"#;

#[test]
fn fifo_dev_zero_and_oversized_results_fail_their_case_and_block_nothing() {
    let sb = Sandbox::engine();
    sb.write("harness.sh", HARNESS);
    sb.write("evaluator.sh", EVALUATOR);
    let m = sb.write(
        "hostile.yaml",
        r#"batch_id: hostile
defaults:
  concurrency: 3
  timeout_seconds: 60
  runtime: local-process
  pass_env: [SANDBOX]
  harness: 'sh "$SANDBOX/harness.sh"'
  evaluator: 'sh "$SANDBOX/evaluator.sh"'
tasks:
  - task_id: fifo
  - task_id: zero
  - task_id: normal
  - task_id: big
  - task_id: evalfifo
"#,
    );
    // Worker default settings (16 MiB result limit).
    let mut runner = sb.spawn_batch_with_env(&m, "run.log", &[]);
    let pid = runner.id();
    let start = Instant::now();
    let mut peak_kib = 0;
    let status = loop {
        if let Some(s) = runner.try_wait().unwrap() {
            break s;
        }
        if let Some(kib) = peak_rss_kib(pid) {
            peak_kib = kib;
        }
        if start.elapsed() > Duration::from_secs(180) {
            let _ = runner.kill();
            let _ = runner.wait();
            panic!(
                "the runner hung on a hostile result file\n{}",
                std::fs::read_to_string(sb.path("run.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(sb.path("run.log")).unwrap_or_default();
    assert_eq!(status.code(), Some(4), "mixed outcomes\n{log}");
    assert!(
        peak_kib > 0 && peak_kib < 256 * 1024,
        "the runner's peak RSS stays small: {peak_kib} KiB"
    );

    let normal = sb.case_result("hostile", "normal");
    assert_eq!(normal["state"], "succeeded", "{normal:#}");
    assert_eq!(normal["outputs"]["answer"], "ok", "{normal:#}");

    for (case, code, says) in [
        ("fifo", "HARNESS_BAD_RESULT", "a FIFO, not a regular file"),
        ("zero", "HARNESS_BAD_RESULT", "symbolic link"),
        ("big", "RESULT_TOO_LARGE", "CASEBATCH_MAX_RESULT_BYTES"),
        ("evalfifo", "EVALUATOR_FAILED", "a FIFO, not a regular file"),
    ] {
        let r = sb.case_result("hostile", case);
        assert_eq!(r["state"], "failed", "{case}: {r:#}");
        assert_eq!(r["failure"]["class"], "harness", "{case}: {r:#}");
        assert_eq!(r["failure"]["code"], code, "{case}: {r:#}");
        let message = r["failure"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{case}: {message}");
        assert_eq!(r["attempts"], 1, "harness failures are not retried: {r:#}");
    }
}
