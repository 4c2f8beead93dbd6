//! What people read, pinned: `batch report`, `batch status` and manifest refusals. Paths are
//! filtered so only meaning is compared; nothing printed here carries a time.

use crate::support::*;

/// The sandbox's path (unique per test) reads as `[SANDBOX]`.
fn filtered(sb: &Sandbox, text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let sandbox = sb.dir.path().display().to_string();
    let canonical = std::fs::canonicalize(sb.dir.path())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| sandbox.clone());
    let text = text
        .replace(&canonical, "[SANDBOX]")
        .replace(&sandbox, "[SANDBOX]");
    // Durations depend on the machine's load; how many attempts or stages were timed does not.
    let timed =
        |l: &str| l.starts_with("  attempt durations: ") || l.starts_with("  stage durations, ");
    text.lines()
        .map(|l| match (timed(l), l.find(": "), l.rfind('(')) {
            (true, Some(colon), Some(i)) => format!("{}: [TIMES] {}\n", &l[..colon], &l[i..]),
            _ if l.starts_with("  temporal actions ") => format!("{}\n", actions_filtered(l)),
            _ => format!("{l}\n"),
        })
        .collect()
}

/// Timers and upserts depend on workflow time (a held-back upsert arms a timer); the other
/// kinds do not. The totals follow them.
fn actions_filtered(line: &str) -> String {
    let (_, kinds) = line.split_once(": ").expect("actions line");
    let kinds: Vec<String> = kinds
        .split(" · ")
        .map(|kind| match kind.split_once(' ') {
            Some((name @ ("timers" | "upserts"), _)) => format!("{name} [N]"),
            _ => kind.to_string(),
        })
        .collect();
    format!("  temporal actions [N]: {}", kinds.join(" · "))
}

const MIXED: &str = r#"batch_id: snap
defaults:
  runtime: fake
  concurrency: 1
  max_retries: 1
tasks:
  - task_id: passes
  - task_id: flaky-then-passes
    fake: {infra_failures_first: 1}
  - task_id: agent-says-fail
    fake: {outcome: fail}
  - task_id: harness-crashes
    fake: {outcome: harness_error}
  - task_id: out-of-memory
    fake: {outcome: oom_killed}
"#;

#[test]
fn report_and_status_of_a_finished_mixed_batch() {
    let sb = Sandbox::engine();
    let manifest = sb.write("snap.yaml", MIXED);
    assert_exit(&sb.run_batch(&manifest), 4);

    let report = sb.op("report", "snap");
    assert_exit(&report, 0);
    insta::assert_snapshot!("report", filtered(&sb, &report.stdout));

    let status = sb.op("status", "snap");
    assert_exit(&status, 0);
    insta::assert_snapshot!("status", filtered(&sb, &status.stdout));
}

#[test]
fn manifest_refusals_name_file_line_field_and_fix() {
    let sb = Sandbox::new();
    let manifest = sb.write(
        "bad.yaml",
        r#"batch_id: bad
defaults:
  concurency: 4
  runtime: docker
tasks:
  - task_id: a
    timeout_seconds: -5
  - task_id: a
  - inputs: {q: 1}
  - {task_id: c, colour: red}
  - {task_id: d, colour: red}
  - {task_id: e, colour: red}
"#,
    );
    let o = sb.validate(&manifest);
    assert_exit(&o, 2);
    assert!(o.stdout.is_empty(), "a refusal prints nothing on stdout");
    insta::assert_snapshot!("refusals", filtered(&sb, &o.stderr));
}
