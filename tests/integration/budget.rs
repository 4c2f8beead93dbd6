//! A batch's budget over the usage its harnesses report: admissions stop before it would be
//! passed, the batch ends `budget_exhausted` (exit 1), and `resume --budget` finishes it
//! without running a finished case again.

use crate::support::{Sandbox, assert_exit, json_of};

#[test]
fn a_spent_budget_stops_admissions_and_resume_with_a_larger_one_finishes_without_repeats() {
    let sb = Sandbox::engine();
    let tasks: String = (1..=12).map(|i| format!("  - task_id: t{i}\n")).collect();
    let manifest = sb.write(
        "budget.yaml",
        &format!(
            r#"batch_id: budget
defaults:
  runtime: local-process
  concurrency: 2
  pass_env: [SANDBOX]
  budget:
    cost_usd: 5
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ran.log"; echo "{{\"usage\": {{\"cost_usd\": 1.0, \"input_tokens\": 100, \"output_tokens\": 20}}}}" > "$CASEBATCH_RESULT"'
tasks:
{tasks}"#
        ),
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 1);
    let started = sb.lines("ran.log");
    // Each running case is reserved at what finished ones cost ($1): with two at a time the
    // batch may reach $6, never more, and it stops only once one more would pass $5.
    assert!(
        (5..=6).contains(&started),
        "{started} cases started under a $5 budget"
    );
    let status = sb.status("budget");
    assert_eq!(status["end"], "budget_exhausted", "{status:#}");
    let s = &status["status"];
    assert_eq!(s["counts"]["succeeded"], started, "{status:#}");
    assert_eq!(s["counts"]["queued"], 12 - started, "{status:#}");
    assert_eq!(
        s["spending"]["spent"]["cost_usd"].as_f64(),
        Some(started as f64),
        "{status:#}"
    );
    let timeline = s["timeline"].to_string();
    assert!(
        timeline.contains("budget reached (cost_usd 5)"),
        "{timeline}"
    );

    let report = sb.op("report", "budget");
    assert_exit(&report, 0);
    let text = String::from_utf8_lossy(&report.stdout);
    let want = format!(
        "usage: cost_usd {started} · input_tokens {} · output_tokens {} (over {started} case(s))",
        100 * started,
        20 * started
    );
    assert!(text.contains(&want), "{want}\n{text}");

    assert_exit(
        &sb.op_with("resume", "budget", &["--budget", "cost_usd=100"]),
        0,
    );
    let mut ran: Vec<String> = sb.read("ran.log").lines().map(String::from).collect();
    ran.sort();
    ran.dedup();
    assert_eq!(
        (sb.lines("ran.log"), ran.len()),
        (12, 12),
        "every case ran exactly once"
    );
    let report = sb.op_with("report", "budget", &["--json"]);
    let summary = json_of(&report)["summary"].clone();
    assert_eq!(
        summary["usage"]["cost_usd"].as_f64(),
        Some(12.0),
        "{summary:#}"
    );
    assert_eq!(
        summary["rows"][0]["usage"]["input_tokens"].as_f64(),
        Some(100.0)
    );
}

#[test]
fn a_usage_that_is_not_numbers_fails_the_case_naming_the_field() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "badusage.yaml",
        r#"batch_id: badusage
defaults:
  runtime: local-process
  max_retries: 0
  harness: 'echo "{\"usage\": {\"cost_usd\": \"free\"}}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: only
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let summary = sb.json(&sb.bundle("badusage").join("batch_summary.json"));
    let row = &summary["rows"][0];
    assert_eq!(row["failure_code"], "HARNESS_BAD_RESULT", "{row:#}");
    let message = row["failure_message"].as_str().unwrap();
    assert!(message.contains("usage.cost_usd"), "{message}");
}
