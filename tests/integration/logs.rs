//! Logs: `--log-format json` makes stderr one JSON object per line, with each attempt's span
//! (batch, case, attempt); text carries no colour codes off a terminal; `RUST_LOG` filters.
//! A harness's own logs are kept to their cap, with a marker where the rest was dropped.

use serde_json::Value;

use crate::support::*;

const MANIFEST: &str = r#"batch_id: logged
defaults: {runtime: fake, concurrency: 2}
tasks: [{task_id: a}, {task_id: b}, {task_id: c}]
"#;

#[test]
fn json_logs_parse_line_by_line_and_name_each_attempt_and_the_outcome_is_json() {
    let sb = Sandbox::engine();
    let manifest = sb.write("logged.yaml", MANIFEST);
    let out = sb.out();
    let mut args = batch_run_args(&manifest, &out).to_vec();
    args.extend(["--log-format", "json", "--json"]);
    let o = sb.run_env(&args, &[("RUST_LOG", "warn,casebatch=info")]);
    assert_exit(&o, 0);
    // The outcome is one JSON object on stdout, apart from the logs.
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("the outcome is JSON");
    assert_eq!(outcome["end"], "completed", "{outcome:#}");
    assert_eq!(outcome["counts"]["succeeded"], 3, "{outcome:#}");
    assert_eq!(outcome["simulated"], true, "{outcome:#}");
    let lines: Vec<Value> = stderr(&o)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let closed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "attempt closed")
        .collect();
    let mut cases: Vec<&str> = closed
        .iter()
        .map(|l| {
            assert_eq!(l["span"]["batch"], "logged", "{l}");
            assert_eq!(l["span"]["attempt"], 1, "{l}");
            assert_eq!(l["level"], "INFO", "{l}");
            l["span"]["case"].as_str().unwrap()
        })
        .collect();
    cases.sort_unstable();
    assert_eq!(cases, ["a", "b", "c"], "one closed attempt per case");
    assert!(
        lines.iter().any(|l| l["target"] == "casebatch::progress"),
        "progress is logged as JSON too"
    );
}

#[test]
fn text_logs_carry_no_colour_codes_off_a_terminal() {
    let sb = Sandbox::engine();
    let manifest = sb.write("logged.yaml", MANIFEST);
    let out = sb.out();
    let o = sb.run_env(
        &batch_run_args(&manifest, &out),
        &[("RUST_LOG", "casebatch=info")],
    );
    assert_exit(&o, 0);
    let err = stderr(&o);
    assert!(err.contains("attempt closed"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escapes in a pipe: {err:?}");
}

/// 200 MB of `0123456789abcdef\n` on stdout; 3 MiB on stderr under a 1 MiB cap; a quiet case.
const CHATTY: &str = r#"batch_id: chatty
defaults: {concurrency: 3}
tasks:
  - task_id: loud
    harness: "yes 0123456789abcdef | head -c 209715200; echo '{}' > \"$CASEBATCH_RESULT\""
  - task_id: noisy
    resources: {log_mb: 1}
    harness: "yes err | head -c 3145728 >&2; echo '{}' > \"$CASEBATCH_RESULT\""
  - task_id: quiet
    harness: "echo hello; echo '{}' > \"$CASEBATCH_RESULT\""
"#;

#[test]
fn a_harness_log_past_its_cap_keeps_its_start_and_end_and_the_record_says_what_went() {
    const MIB: u64 = 1024 * 1024;
    let sb = Sandbox::engine();
    let manifest = sb.write("chatty.yaml", CHATTY);
    assert_exit(&sb.run_batch(&manifest), 0);

    let stdout_log = sb.attempt_file("chatty", "loud", 1, "stdout.log");
    let size = std::fs::metadata(&stdout_log).unwrap().len();
    assert!((64 * MIB - 1024..=64 * MIB).contains(&size), "{size} bytes");
    let text = std::fs::read(&stdout_log).unwrap();
    let kept_each = (64 * MIB - 256) / 2;
    let dropped = 209_715_200 - 2 * kept_each;
    let marker = format!(
        "[casebatch: {dropped} bytes of stdout.log dropped here: it passed its cap of {} bytes",
        64 * MIB
    );
    let middle = String::from_utf8_lossy(&text[kept_each as usize - 10..kept_each as usize + 300]);
    assert!(middle.contains(&marker), "{middle}");
    assert!(text.starts_with(b"0123456789abcdef\n0123456789abcdef\n"));
    // `head -c` cut the last line short: the end is the harness's, not the marker's.
    assert!(text.ends_with(b"\n0123456789abcdef\n0123"));
    let record = sb.recorded("chatty", "loud", 1, "record");
    assert_eq!(
        record["summary"]["logs_capped"],
        serde_json::json!({"cap_bytes": 64 * MIB, "stdout_dropped": dropped, "stderr_dropped": 0}),
        "{record:#}"
    );

    let stderr_log = sb.attempt_file("chatty", "noisy", 1, "stderr.log");
    assert!(std::fs::metadata(&stderr_log).unwrap().len() <= MIB);
    let record = sb.recorded("chatty", "noisy", 1, "record");
    assert_eq!(
        record["summary"]["logs_capped"]["stderr_dropped"],
        3 * MIB - (MIB - 256) / 2 * 2,
        "{record:#}"
    );

    let record = sb.recorded("chatty", "quiet", 1, "record");
    assert!(record["summary"].get("logs_capped").is_none(), "{record:#}");
    assert_eq!(
        std::fs::read_to_string(sb.attempt_file("chatty", "quiet", 1, "stdout.log")).unwrap(),
        "hello\n"
    );
}
