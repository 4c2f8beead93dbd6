//! `batch report --html`: the batch report as one self-contained HTML file (no scripts, no
//! fetched assets) that a person opens in a browser and shares, carrying every number the text
//! report has: pass rates, score means and pass@k with standard errors, usage and cost, the
//! tasks of an epochs batch, where a retried batch's results come from. Plots are inline SVG
//! with axes, whose geometry is computed here; the template (`templates/report.html`) only
//! places it, and escapes every value it prints (case ids and failure messages come from
//! users).

mod axes;
mod cases;
mod headline;
mod plots;

use std::path::Path;

use casebatch_bundle::stats::Durations;
use casebatch_bundle::{AttemptRecord, BatchSummary, CaseResult};
use casebatch_manifest::Plan;
use minijinja::{Environment, context};

pub use cases::{MAX_SECTIONS, relative_href};
pub use plots::{Bar, BarChart, Histogram, PassAtKPlot, colors};

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
    let stats = summary.stats.as_ref();
    let tasks = stats.and_then(|s| s.tasks.as_deref());
    let usage = headline::usage_table(summary);
    let usage_names = usage.as_ref().map_or(&[][..], |u| &u.names[..]);
    env.get_template("report.html")
        .expect("added above")
        .render(context! {
            summary => summary,
            stats => stats,
            lineage => summary.lineage,
            scores => stats.map(headline::score_rows).unwrap_or_default(),
            pass_at_k => tasks.map(headline::pass_at_k_rows).unwrap_or_default(),
            pass_at_k_plot => tasks.and_then(|t| plots::pass_at_k_plot(&t.pass_at_k)),
            reruns_note => tasks.and_then(|t| t.reruns_note()),
            task_table => tasks.map(|t| headline::task_table(t, usage_names)),
            usage => usage,
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

    /// Two tasks of two runs: `a` passes both (score 1, cost 0.5 each), `b` one of two.
    fn epochs_page() -> String {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("m.yaml");
        std::fs::write(
            &manifest,
            "batch_id: b\ndefaults: {runtime: fake, epochs: 2}\ntasks: [{task_id: a}, {task_id: b}]\n",
        )
        .unwrap();
        let plan = casebatch_manifest::load_plan(&manifest, &Default::default()).unwrap();
        let outcome = |case_id: &str, passed: bool| -> Option<CaseResult> {
            Some(
                serde_json::from_value(serde_json::json!({
                    "schema_version": "1", "case_id": case_id, "case_dir": "c",
                    "state": if passed { "succeeded" } else { "failed" }, "attempts": 1,
                    "actor_status": "finished", "exit_code": 0, "evaluation_configured": false,
                    "verdict": null, "cleanup_confirmed": true, "failure": null,
                    "collect_failure": null, "adopted": false,
                    "scores": {"acc": if passed { 1 } else { 0 }},
                }))
                .unwrap(),
            )
        };
        let results = [
            outcome("a#1", true),
            outcome("a#2", true),
            outcome("b#1", true),
            outcome("b#2", false),
        ];
        let stats = casebatch_bundle::stats::BatchStats::of(&results, &[]).with_tasks(
            casebatch_bundle::epochs::TaskStats::of(&plan.cases, &results),
        );
        let cost = |usd: f64| Some(casebatch_proto::Usage([("cost_usd".into(), usd)].into()));
        let mut summary = summary("a#1");
        summary.rows = plan
            .cases
            .iter()
            .map(|c| SummaryRow {
                case_id: c.case_id.clone(),
                usage: cost(0.5),
                ..summary.rows[0].clone()
            })
            .collect();
        summary.usage = cost(2.0);
        summary.lineage = Some(casebatch_bundle::BatchLineage {
            retry_of: Some("first-try".into()),
            carried: 3,
            rerun: 1,
            ..Default::default()
        });
        let mut stats = stats;
        if let Some(t) = stats.tasks.as_mut() {
            t.add_usage(&plan.cases, &summary.rows);
        }
        summary.stats = Some(stats);
        render_html(&ReportInput {
            plan: &plan,
            summary: &summary,
            results: &results,
            attempts: &[],
            bundle_dir: dir.path(),
            bundle_href: ".".into(),
        })
    }

    #[test]
    fn an_epochs_report_carries_pass_at_k_scores_usage_tasks_and_lineage() {
        let html = epochs_page();
        // pass@1: a 1, b 1/2: mean 75 %, standard error √(1/8 / 2) = 25 %. pass@2: 1 and 1.
        assert!(
            html.contains(
                "<td class=\"n\">pass@1</td><td class=\"n\">75.0%</td><td class=\"n\">± 25.0%</td>"
            ),
            "{html}"
        );
        assert!(
            html.contains(
                "<td class=\"n\">pass@2</td><td class=\"n\">100.0%</td><td class=\"n\">± 0.0%</td>"
            ),
            "{html}"
        );
        assert!(html.contains("<svg id=\"pass-at-k-plot\""));
        assert!(html.contains(&format!("fill=\"{}\"", colors::PASS_AT_K)));
        // The headline score is over tasks, clustered; the one over runs is named.
        assert!(
            html.contains("mean 0.750 ± 0.250 (standard error), n=2 tasks"),
            "{html}"
        );
        assert!(html.contains("over runs, unclustered"), "{html}");
        // Cost: the total, by task (1 each), by case.
        assert!(html.contains("<h2 id=\"usage\">Usage and cost</h2>"));
        assert!(html.contains("<th>cost_usd</th>"));
        assert!(
            html.contains("<th>Total</th><td class=\"n\">2</td>"),
            "{html}"
        );
        let tasks = &html[html.find("id=\"task-table\"").unwrap()..];
        assert!(tasks.contains("<code>b</code></td><td class=\"n\">2</td><td class=\"n\">2</td><td class=\"n\">1</td>"), "{tasks}");
        assert!(
            tasks.contains("<td class=\"n\">1</td></tr>"),
            "a task's cost: {tasks}"
        );
        // Where the results come from.
        assert!(html.contains("<code>first-try</code>"), "{html}");
        assert!(html.contains("<th>Cases carried over as they were</th><td class=\"n\">3</td>"));
    }

    #[test]
    fn every_plot_is_drawn_with_its_colours() {
        let html = page("x");
        assert!(html.contains(&format!("fill=\"{}\"", colors::FAILED)));
        assert!(html.contains(&format!("fill=\"{}\"", colors::HARNESS)));
    }
}
