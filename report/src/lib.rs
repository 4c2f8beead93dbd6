//! `batch report --html`: the batch report as one self-contained HTML file (no scripts, no
//! fetched assets) that a person opens in a browser. Plots are inline SVG whose geometry is
//! computed here; the template (`templates/report.html`) only places it, and escapes every
//! value it prints (case ids and failure messages come from users).

mod plots;

use casebatch_bundle::stats::Durations;
use casebatch_bundle::{AttemptRecord, BatchSummary};
use minijinja::{Environment, context};

pub use plots::{Bar, BarChart, Histogram, colors};

const TEMPLATE: &str = include_str!("../templates/report.html");

/// Renders the report of one batch from its summary and its attempt records.
pub fn render_html(summary: &BatchSummary, attempts: &[AttemptRecord]) -> String {
    let mut env = Environment::new();
    // The `.html` name turns on HTML auto-escaping.
    env.add_template("report.html", TEMPLATE)
        .expect("the report template parses");
    let durations: Vec<u64> = attempts
        .iter()
        .filter(|a| !a.summary.speculative_loser)
        .filter_map(|a| a.summary.duration_ms())
        .collect();
    env.get_template("report.html")
        .expect("added above")
        .render(context! {
            summary => summary,
            stats => summary.stats,
            outcomes => plots::outcome_bars(summary),
            classes => plots::class_bars(summary),
            histogram => plots::duration_histogram(&durations),
            duration_rows => duration_rows(summary),
        })
        .expect("the report template renders with any summary")
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
    use casebatch_bundle::{CaseRecordState, RECORD_SCHEMA_VERSION, SummaryRow};
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
            stats: None,
            rows: vec![SummaryRow {
                case_id: case_id.into(),
                case_dir: "c".into(),
                state: CaseRecordState::Failed,
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

    #[test]
    fn user_text_is_escaped_and_nothing_is_fetched() {
        let html = render_html(&summary("<script>alert(1)</script>"), &[]);
        assert!(!html.contains("<script>alert"), "case id printed raw");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;"));
        for external in ["<script", "<link", "src=\"http", "url("] {
            assert!(
                !html.contains(external),
                "the report fetches or runs {external}"
            );
        }
    }

    #[test]
    fn every_plot_is_drawn_with_its_colours() {
        let html = render_html(&summary("x"), &[]);
        assert!(html.contains(&format!("fill=\"{}\"", colors::FAILED)));
        assert!(html.contains(&format!("fill=\"{}\"", colors::HARNESS)));
    }
}
