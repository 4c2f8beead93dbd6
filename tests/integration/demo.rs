//! The local web demo and its tutorial (docs/tutorial.md), step by step, for real: a fixture
//! web app, a real Temporal dev server, real actor processes making HTTP requests, receipts
//! counted in the fixture's events.jsonl. Every `casebatch` command in the tutorial runs here.

use std::collections::BTreeSet;
use std::process::Child;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Runs tutorial commands exactly as written (relative paths, from the sandbox) and keeps a
/// record of which ones ran.
struct Tutorial<'a> {
    sb: &'a Sandbox,
    ran: BTreeSet<String>,
}

impl<'a> Tutorial<'a> {
    fn args(cmd: &str) -> Vec<&str> {
        cmd.strip_prefix("casebatch ")
            .expect("a casebatch command")
            .split(' ')
            .collect()
    }

    fn run(&mut self, cmd: &str, code: i32) -> std::process::Output {
        self.ran.insert(cmd.to_string());
        let o = self.sb.run(&Self::args(cmd));
        assert_exit(&o, code);
        o
    }

    fn spawn(&mut self, cmd: &str, log: &str) -> Child {
        self.ran.insert(cmd.to_string());
        self.sb.spawn(&Self::args(cmd), log)
    }

    fn serve(&mut self, cmd: &str, log: &str) -> Child {
        let child = self.spawn(cmd, log);
        let sb = self.sb;
        wait_until(Duration::from_secs(30), "fixture ready: true", || {
            std::fs::read_to_string(sb.path(log))
                .unwrap_or_default()
                .contains("ready: true")
        });
        child
    }

    fn clicks(&self, dir: &str) -> Vec<(String, u64)> {
        std::fs::read_to_string(self.sb.path(&format!("{dir}/events.jsonl")))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["type"] == "web_action" && r["action"] == "click")
            .map(|r| {
                (
                    r["task_id"].as_str().unwrap().to_string(),
                    r["attempt"].as_u64().unwrap(),
                )
            })
            .collect()
    }
}

/// The `casebatch` commands in the tutorial's code blocks.
fn tutorial_commands() -> BTreeSet<String> {
    let doc = format!("{}/../docs/tutorial.md", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(doc)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("casebatch "))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_tutorial_runs_step_by_step_with_one_click_per_task() {
    let sb = Sandbox::engine();
    let mut t = Tutorial {
        sb: &sb,
        ran: BTreeSet::new(),
    };

    // Terminals A and B.
    let mut fixture = t.serve(
        "casebatch demo serve --directory logs/batch-tutorial --response-delay 1",
        "fixture.log",
    );
    let mut worker = t.spawn(
        "casebatch worker --output-dir logs/batch-tutorial/batches",
        "worker.log",
    );
    let engine = sb.path("logs/batch-tutorial/batches/.casebatch-engine/engine.json");
    wait_until(Duration::from_secs(60), "the worker's engine is up", || {
        engine.exists()
    });

    // Terminal C.
    t.run(
        "casebatch batch validate --manifest logs/batch-tutorial/batch.yaml",
        0,
    );
    t.run(
        "casebatch batch run --manifest logs/batch-tutorial/batch.yaml --dry-run --output-dir logs/batch-tutorial/plan",
        0,
    );
    assert!(
        sb.path("logs/batch-tutorial/plan/local-web/batch_plan.json")
            .exists()
    );
    t.run(
        "casebatch batch run --manifest logs/batch-tutorial/batch.yaml --output-dir logs/batch-tutorial/batches --no-worker",
        0,
    );
    let status = t.run(
        "casebatch batch status --batch-id local-web --output-dir logs/batch-tutorial/batches",
        0,
    );
    assert!(
        stdout(&status).contains("succeeded 3"),
        "{}",
        stdout(&status)
    );
    let report = t.run(
        "casebatch batch report --batch-id local-web --output-dir logs/batch-tutorial/batches",
        0,
    );
    assert!(
        stdout(&report).contains("succeeded 3"),
        "{}",
        stdout(&report)
    );

    let bundle = sb.path("logs/batch-tutorial/batches/local-web");
    let summary = sb.json(&bundle.join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 3, "{summary:#}");
    assert_eq!(summary["attempts_total"], 3, "one attempt each");
    for row in summary["rows"].as_array().unwrap() {
        assert_eq!(row["verdict"], "pass");
        assert_eq!(row["actor_status"], "finished");
        assert_eq!(row["cleanup_confirmed"], true);
    }
    let mut clicks = t.clicks("logs/batch-tutorial");
    clicks.sort();
    assert_eq!(
        clicks,
        vec![
            ("web-1".into(), 1),
            ("web-2".into(), 1),
            ("web-3".into(), 1)
        ],
        "exactly three real click receipts"
    );
    // With a Chromium found, the tutorial's actor is the browser: its clicks say so.
    if browser_or_skip("the tutorial's browser actor").is_some() {
        let events = sb.read("logs/batch-tutorial/events.jsonl");
        let by_browser = events
            .lines()
            .filter(|l| l.contains("\"click\"") && l.contains("HeadlessChrome"))
            .count();
        assert_eq!(by_browser, 3, "clicked by a headless Chromium: {events}");
    }

    // Resume after completion: no new clicks, attempt counts unchanged.
    t.run(
        "casebatch batch resume --batch-id local-web --output-dir logs/batch-tutorial/batches --no-worker",
        0,
    );
    assert_eq!(
        t.clicks("logs/batch-tutorial").len(),
        3,
        "resume made no new clicks"
    );
    assert_eq!(
        sb.json(&bundle.join("batch_summary.json"))["attempts_total"],
        3
    );
    stop(&mut worker);
    stop(&mut fixture);

    // Drain, then resume, on a fresh fixture with slow pages and one task at a time.
    let mut fixture = t.serve(
        "casebatch demo serve --directory logs/batch-drain --response-delay 3",
        "fixture-drain.log",
    );
    let mut runner = t.spawn(
        "casebatch batch run --manifest logs/batch-drain/batch.yaml --output-dir logs/batch-drain/batches --parallelism 1",
        "drain-run.log",
    );
    let first = sb.path("logs/batch-drain/batches/local-web/cases/web-1/attempts/1");
    wait_until(Duration::from_secs(60), "the first task runs", || {
        !journal_at(&first)["job"].is_null()
    });
    t.run(
        "casebatch batch drain --batch-id local-web --output-dir logs/batch-drain/batches",
        0,
    );
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        1,
        "drained with queued work: exit 1"
    );
    let status = t.run(
        "casebatch batch status --batch-id local-web --output-dir logs/batch-drain/batches",
        0,
    );
    assert!(stdout(&status).contains("queued 2"), "{}", stdout(&status));
    assert_eq!(
        t.clicks("logs/batch-drain").len(),
        1,
        "only the admitted task clicked"
    );
    t.run(
        "casebatch batch resume --batch-id local-web --output-dir logs/batch-drain/batches",
        0,
    );
    let mut clicks = t.clicks("logs/batch-drain");
    clicks.sort();
    assert_eq!(
        clicks,
        vec![
            ("web-1".into(), 1),
            ("web-2".into(), 1),
            ("web-3".into(), 1)
        ],
        "no task clicked twice"
    );
    stop(&mut fixture);

    // The one-command variant.
    let o = t.run("casebatch demo", 0);
    assert!(stdout(&o).contains("3 click(s)"), "{}", stdout(&o));
    assert_eq!(t.clicks("logs/demo").len(), 3);
    // Issue 58: the demo never said where its HTML report is. It writes one and says so.
    assert!(
        stdout(&o).contains("HTML report: logs/demo/report.html"),
        "{}",
        stdout(&o)
    );
    let page = std::fs::read_to_string(t.sb.path("logs/demo/report.html")).unwrap();
    assert!(page.contains("<html"), "{}", &page[..page.len().min(200)]);

    let missing: Vec<_> = tutorial_commands().difference(&t.ran).cloned().collect();
    assert!(
        missing.is_empty(),
        "tutorial commands no test ran: {missing:#?}"
    );
}
