//! `batch report --html`: the batch report as one self-contained HTML file (no scripts, no
//! fetched assets) that a person opens in a browser. Plots are inline SVG whose geometry is
//! computed here; the template (`templates/report.html`) only places it, and escapes every
//! value it prints (case ids and failure messages come from users).

mod cases;
mod plots;

use std::path::Path;

use casebatch_bundle::stats::Durations;
use casebatch_bundle::{AttemptRecord, BatchSummary, CaseResult};
use casebatch_manifest::Plan;
use minijinja::{Environment, context};

pub use cases::{MAX_SECTIONS, relative_href};
pub use plots::{Bar, BarChart, Histogram, colors};

/// What a report is made of, as read from one bundle.
pub struct ReportInput<'a> {
    pub plan: &'a Plan,
    pub summary: &'a BatchSummary,
    /// Each case's latest result, in plan order.
    pub results: &'a [Option<CaseResult>],
    /// Every attempt record, in case order.
    pub attempts: &'a [AttemptRecord],
    /// The bundle's directory, to see which of an attempt's files exist.
    pub bundle_dir: &'a Path,
    /// The bundle's directory as a link from where the report is written
    /// ([`relative_href`]).
    pub bundle_href: String,
}

const TEMPLATE: &str = include_str!("../templates/report.html");

/// Renders the report of one batch: its summary, plots, and a section per case.
pub fn render_html(input: &ReportInput<'_>) -> String {
    let (summary, attempts) = (input.summary, input.attempts);
    let mut env = Environment::new();
    // The `.html` name turns on HTML auto-escaping.
    env.add_template("report.html", TEMPLATE)
        .expect("the report template parses");
    let durations: Vec<u64> = attempts
        .iter()
        .filter(|a| !a.summary.speculative_loser)
        .filter_map(|a| a.summary.duration_ms())
        .collect();
    let case_sections = cases::sections(&evidence(input), input.bundle_dir, &input.bundle_href);
    env.get_template("report.html")
        .expect("added above")
        .render(context! {
            summary => summary,
            stats => summary.stats,
            outcomes => plots::outcome_bars(summary),
            classes => plots::class_bars(summary),
            histogram => plots::duration_histogram(&durations),
            duration_rows => duration_rows(summary),
            anchors => input.plan.cases.iter().map(|c| cases::anchor(c.index)).collect::<Vec<_>>(),
            cases => case_sections.0,
            cases_left_out => case_sections.1,
            bundle_href => input.bundle_href,
        })
        .expect("the report template renders with any summary")
}

/// Each planned case with its result and attempts (attempt records come in case order).
fn evidence<'a>(input: &ReportInput<'a>) -> Vec<cases::CaseEvidence<'a>> {
    let mut by_case: std::collections::HashMap<&str, Vec<&'a AttemptRecord>> =
        std::collections::HashMap::new();
    for a in input.attempts {
        by_case.entry(a.case_id.as_str()).or_default().push(a);
    }
    input
        .plan
        .cases
        .iter()
        .zip(input.results)
        .map(|(case, result)| cases::CaseEvidence {
            case,
            result: result.as_ref(),
            attempts: by_case.remove(case.case_id.as_str()).unwrap_or_default(),
        })
        .collect()
}

/// One row of the durations table, formatted.
#[derive(Debug, serde::Serialize)]
struct DurationRow {
    label: &'static str,
    p50: String,
    p90: String,
    p99: String,
    max: String,
    n: usize,
}

/// The whole attempt, then each stage in pipeline order.
fn duration_rows(summary: &BatchSummary) -> Vec<DurationRow> {
    let Some(stats) = &summary.stats else {
        return Vec::new();
    };
    let row = |label, d: &Durations| DurationRow {
        label,
        p50: human(d.p50_ms),
        p90: human(d.p90_ms),
        p99: human(d.p99_ms),
        max: human(d.max_ms),
        n: d.n,
    };
    let stages = stats
        .stage_durations
        .iter()
        .map(|(stage, d)| row(stage.as_str(), d));
    stats
        .durations
        .iter()
        .map(|d| row("attempt", d))
        .chain(stages)
        .collect()
}

/// Milliseconds below a second (a stage often takes a few), else seconds.
fn human(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_bundle::{RECORD_SCHEMA_VERSION, SummaryRow};
    use casebatch_proto::CaseState;
    use std::collections::BTreeMap;

    fn summary(case_id: &str) -> BatchSummary {
        BatchSummary {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            batch_id: "b".into(),
            total: 1,
            counts: BTreeMap::from([("failed".into(), 1)]),
            failures_by_stage_class: BTreeMap::from([("await/harness".into(), 1)]),
            failures_by_code: BTreeMap::new(),
            cases_by_runtime: BTreeMap::new(),
            cleanup_unconfirmed: 0,
            collect_failed: 0,
            adopted_attempts: 0,
            attempts_total: 1,
            speculative_losers: 0,
            stranded_attempts: 0,
            jobs_paid_twice: 0,
            temporal_actions: None,
            simulated: false,
            usage: None,
            lineage: None,
            stats: None,
            rows: vec![SummaryRow {
                case_id: case_id.into(),
                case_dir: "c".into(),
                state: CaseState::Failed,
                attempts: 1,
                actor_status: None,
                verdict: None,
                cleanup_confirmed: Some(true),
                failure_stage: Some("await".into()),
                failure_class: Some("harness".into()),
                failure_code: None,
                failure_message: None,
                runtime: None,
                fields: BTreeMap::new(),
                usage: None,
            }],
        }
    }

    /// A one-case plan whose task id and input are `text`, with its result's outputs `text`.
    fn page(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("m.yaml");
        let task = serde_json::json!({"task_id": text, "query": text});
        std::fs::write(
            &manifest,
            format!("batch_id: b\ndefaults: {{runtime: fake}}\ntasks: [{task}]\n"),
        )
        .unwrap();
        let plan = casebatch_manifest::load_plan(&manifest, &Default::default()).unwrap();
        let result: CaseResult = serde_json::from_value(serde_json::json!({
            "schema_version": "1", "case_id": text, "case_dir": "c", "state": "failed",
            "attempts": 1, "actor_status": "failed", "exit_code": 3,
            "evaluation_configured": false, "verdict": null, "cleanup_confirmed": true,
            "failure": null, "collect_failure": null, "adopted": false,
            "outputs": {"answer": format!("the answer is {text}")}
        }))
        .unwrap();
        render_html(&ReportInput {
            plan: &plan,
            summary: &summary(text),
            results: &[Some(result)],
            attempts: &[],
            bundle_dir: dir.path(),
            bundle_href: ".".into(),
        })
    }

    #[test]
    fn user_text_is_escaped_and_nothing_is_fetched() {
        let html = page("<script>alert(1)</script>");
        assert!(!html.contains("<script>alert"), "user text printed raw");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;"));
        for external in ["<script", "<link", "src=\"http", "url("] {
            assert!(
                !html.contains(external),
                "the report fetches or runs {external}"
            );
        }
    }

    #[test]
    fn every_case_has_a_section_with_its_input_and_outputs_linked_from_the_table() {
        let html = page("find-the-price");
        assert!(
            html.contains("<section class=\"case\" id=\"case-0\">"),
            "{html}"
        );
        assert!(html.contains("href=\"#case-0\""), "{html}");
        assert!(html.contains("the answer is find-the-price"), "{html}");
        assert!(
            html.contains("&quot;query&quot;"),
            "the input is shown: {html}"
        );
    }

    #[test]
    fn every_plot_is_drawn_with_its_colours() {
        let html = page("x");
        assert!(html.contains(&format!("fill=\"{}\"", colors::FAILED)));
        assert!(html.contains(&format!("fill=\"{}\"", colors::HARNESS)));
    }
}
