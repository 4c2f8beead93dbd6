//! The web demo in a real browser: each attempt drives its own headless Chromium, its
//! evaluator looks in that browser, and cleanup leaves no Chromium process behind, also when
//! the runner is SIGKILLed mid-attempt and the batch resumed. Skipped without a Chromium
//! unless CASEBATCH_REQUIRE_BROWSER is set (CI).

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Click receipts in a fixture's events.jsonl: (task, attempt, user agent).
fn clicks(sb: &Sandbox, dir: &str) -> Vec<(String, u64, String)> {
    sb.read(&format!("{dir}/events.jsonl"))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["action"] == "click")
        .map(|r| {
            (
                r["task_id"].as_str().unwrap().to_string(),
                r["attempt"].as_u64().unwrap(),
                r["user_agent"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Chromium processes started by this sandbox's attempts (they inherit its paths).
fn sandbox_browsers(sb: &Sandbox) -> Vec<u32> {
    processes_with_env("chromium", &sb.dir.path().display().to_string())
}

fn serve_fixture(sb: &Sandbox, dir: &str, delay: &str) -> std::process::Child {
    let log = format!("{dir}.log");
    let child = sb.spawn(
        &[
            "demo",
            "serve",
            "--directory",
            dir,
            "--response-delay",
            delay,
            "--actor",
            "browser",
        ],
        &log,
    );
    wait_until(Duration::from_secs(30), "the fixture is ready", || {
        sb.read(&log).contains("ready: true")
    });
    child
}

#[test]
fn a_sigkilled_runner_s_browsers_are_cleaned_up_on_resume_and_no_click_repeats() {
    if browser_or_skip("the browser demo's SIGKILL and resume").is_none() {
        return;
    }
    let sb = Sandbox::engine();
    // Slow pages, one task at a time: the runner dies while a browser works.
    let mut fixture = serve_fixture(&sb, "fx", "2");
    let manifest = sb.path("fx/batch.yaml");
    let out = sb.out();
    // The harnesses' working directories go here (the resume's worker uses its default:
    // adopted jobs are evaluated and cleaned up where their job record says).
    let scratch = sb.path("scratch");
    let mut runner = sb.spawn_env(
        &[
            "batch",
            "run",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
            "--parallelism",
            "1",
        ],
        "run.log",
        &[("CASEBATCH_SCRATCH_DIR", scratch.to_str().unwrap())],
    );
    // The second task (plan index 1, attempt 1) names its browser in its working directory.
    let second_browser = || {
        std::fs::read_dir(&scratch).ok()?.flatten().find_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let browser = e.path().join("browser.json");
            (name.starts_with("local-web_1_1-") && browser.exists()).then_some(browser)
        })
    };
    wait_until(
        Duration::from_secs(120),
        "the second task's browser runs",
        || second_browser().is_some(),
    );
    runner.kill().unwrap(); // SIGKILL
    runner.wait().unwrap();
    assert!(
        !sandbox_browsers(&sb).is_empty(),
        "the in-flight attempt's browser outlives the runner"
    );
    assert_eq!(
        clicks(&sb, "fx").len(),
        1,
        "only the first task had clicked"
    );

    let o = sb.op("resume", "local-web");
    assert_exit(&o, 0);
    let mut made = clicks(&sb, "fx");
    made.sort();
    let tasks: Vec<(&str, u64)> = made.iter().map(|c| (c.0.as_str(), c.1)).collect();
    assert_eq!(
        tasks,
        [("web-1", 1), ("web-2", 1), ("web-3", 1)],
        "each task clicked once: none repeated after the crash"
    );
    for (task, _, agent) in &made {
        assert!(
            agent.contains("HeadlessChrome"),
            "{task} clicked by {agent:?}"
        );
    }
    let summary = sb.json(&sb.bundle("local-web").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 3, "{summary:#}");
    assert_eq!(
        summary["attempts_total"], 3,
        "the in-flight attempt was adopted"
    );
    for task in ["web-1", "web-2", "web-3"] {
        let receipt = sb.recorded("local-web", task, 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{task}: {receipt:#}");
        let killed = receipt["killed"].as_array().unwrap().len();
        assert!(
            killed >= 2,
            "{task}: the browser and its helpers were killed, not only one process: {receipt:#}"
        );
    }
    assert!(
        sandbox_browsers(&sb).is_empty(),
        "no Chromium process is left: {:?}",
        sandbox_browsers(&sb)
    );
    // The adopted attempt's cleanup removed the working directory its job record named,
    // though the resume's own scratch root is elsewhere.
    assert!(
        second_browser().is_none(),
        "the second task's working directory outlived its cleanup"
    );
    stop(&mut fixture);
}

#[test]
fn a_page_without_its_button_fails_the_task_as_agent_not_infra() {
    let Some(browser) = browser_or_skip("the browser demo's missing button") else {
        return;
    };
    let sb = Sandbox::engine();
    let mut fixture = serve_fixture(&sb, "fx", "0");
    let addr = sb
        .read("fx.log")
        .lines()
        .find_map(|l| l.strip_prefix("fixture: http://").map(str::to_string))
        .unwrap();
    let exe = env!("CARGO_BIN_EXE_casebatch");
    let manifest = sb.write(
        "no-button.yaml",
        &format!(
            r#"batch_id: no-button
defaults:
  runtime: local-process
  max_retries: 1
  harness: ["{exe}", "harness", "web-demo", "--browser", "{}"]
  evaluator: ["{exe}", "harness", "web-demo-eval"]
tasks:
  - task_id: web-no-button
    url: "http://{addr}/tasks/web-no-button"
"#,
            browser.display()
        ),
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let result = sb.case_result("no-button", "web-no-button");
    assert_eq!(result["state"], "failed", "{result:#}");
    assert_eq!(result["failure"]["class"], "agent", "{result:#}");
    assert_eq!(
        result["attempts"], 1,
        "an agent failure is not retried: {result:#}"
    );
    assert_eq!(result["outputs"]["clicked"], false, "{result:#}");
    assert!(clicks(&sb, "fx").is_empty());
    assert!(sandbox_browsers(&sb).is_empty(), "cleanup left a browser");
    stop(&mut fixture);
}
