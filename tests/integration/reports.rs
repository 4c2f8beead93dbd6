//! Reports that compare: pass rates with their denominators, score means with standard
//! errors, duration percentiles, per-stage timings; the HTML report rendered in headless
//! Chromium; `batch diff` of a batch and its retry-failed child; `batch list`.

use serde_json::Value;

use crate::support::*;

fn json_of(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn a_report_rates_scores_and_times_and_diff_shows_what_a_retry_flipped() {
    let sb = Sandbox::engine();
    sb.write("network-down", "");
    let manifest = sb.write(
        "eval.yaml",
        r#"batch_id: eval
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  harness: 'echo "{\"scores\": {\"accuracy\": $SCORE}}" > "$CASEBATCH_RESULT"'
tasks:
  - {task_id: right, env: {SCORE: "1.0"}}
  - {task_id: wrong, env: {SCORE: "0.0"}}
  - task_id: crash
    harness: 'if [ -f "$SANDBOX/fixed" ]; then echo "{\"scores\": {\"accuracy\": 0.5}}" > "$CASEBATCH_RESULT"; else exit 3; fi'
  - task_id: casualty
    harness: 'echo "{\"failure\": {\"class\": \"infra\", \"code\": \"NETWORK_DOWN\", \"retryable\": true}}" > "$CASEBATCH_RESULT"; exit 1'
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let out = sb.out();
    let out = out.to_str().unwrap();

    let o = sb.run(&[
        "batch",
        "report",
        "--batch-id",
        "eval",
        "--output-dir",
        out,
        "--json",
    ]);
    assert_exit(&o, 0);
    let stats = json_of(&o)["summary"]["stats"].clone();
    // 2 of 4 finished; leaving out the infra casualty, 2 of 3.
    assert_eq!(
        (
            stats["pass_rate"]["passed"].clone(),
            stats["pass_rate"]["of"].clone()
        ),
        (2.into(), 4.into()),
        "{stats:#}"
    );
    assert_eq!(stats["pass_rate_excluding_infra"]["of"], 3, "{stats:#}");
    assert!(
        stats["pass_rate_excluding_infra"]["denominator"]
            .as_str()
            .unwrap()
            .contains("infra")
    );
    let accuracy = &stats["scores"]["accuracy"];
    assert_eq!(
        (accuracy["n"].clone(), accuracy["mean"].clone()),
        (2.into(), 0.5.into()),
        "{stats:#}"
    );
    // Sample deviation of {1, 0} is √0.5; over √2 that is 0.5.
    assert!(
        (accuracy["stderr"].as_f64().unwrap() - 0.5).abs() < 1e-9,
        "{stats:#}"
    );
    assert_eq!(
        stats["durations"]["n"], 4,
        "one timed attempt per case: {stats:#}"
    );
    // Every attempt's stages are timed, in the order they ran: judged only when the job ended
    // cleanly.
    let summary = sb.json(&sb.bundle("eval").join("batch_summary.json"));
    let stages_of = |case_id: &str| -> Vec<Value> {
        let row = summary["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["case_id"] == case_id)
            .unwrap();
        let case_dir = row["case_dir"].as_str().unwrap();
        sb.recorded("eval", case_dir, 1, "record")["stages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    for (case_id, expected) in [
        (
            "right",
            &[
                "provision",
                "submit",
                "await",
                "evaluate",
                "collect",
                "cleanup",
            ][..],
        ),
        ("crash", &["provision", "submit", "await", "cleanup"][..]),
    ] {
        let stages = stages_of(case_id);
        let names: Vec<&str> = stages
            .iter()
            .map(|t| t["stage"].as_str().unwrap())
            .collect();
        assert_eq!(names, expected, "{case_id}: {stages:#?}");
        let mut previous_end = 0;
        for t in &stages {
            let (start, end) = (
                t["started_at_ms"].as_u64().unwrap(),
                t["ended_at_ms"].as_u64().unwrap(),
            );
            assert!(
                start >= previous_end,
                "{case_id}: stages overlap: {stages:#?}"
            );
            assert_eq!(t["duration_ms"].as_u64().unwrap(), end - start, "{t}");
            previous_end = end;
        }
    }
    let by_stage = &stats["stage_durations"];
    assert_eq!(
        (
            by_stage["provision"]["n"].clone(),
            by_stage["evaluate"]["n"].clone(),
            by_stage["cleanup"]["n"].clone()
        ),
        (4.into(), 2.into(), 4.into()),
        "every attempt provisioned and cleaned up, two judged: {stats:#}"
    );

    // The HTML report: one file, nothing fetched, its plots drawn by a real browser.
    let html = sb.path("report.html");
    let o = sb.run(&[
        "batch",
        "report",
        "--batch-id",
        "eval",
        "--output-dir",
        out,
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_exit(&o, 0);
    let page = sb.read("report.html");
    for plot in [
        "<svg id=\"outcomes\"",
        "<svg id=\"classes\"",
        "<svg id=\"durations\"",
    ] {
        assert!(page.contains(plot), "no {plot} in the report");
    }
    assert!(page.contains("66.7%") && page.contains("<code>casualty</code>"));
    if let Some(browser) = browser_or_skip("the HTML report in a browser") {
        std::fs::create_dir_all(sb.path("shot")).unwrap();
        let shot = Screenshot::of(&browser, &html, &sb.path("shot"), (1000, 2400));
        use casebatch_report::colors;
        for (what, color) in [
            ("the succeeded bar", colors::SUCCEEDED),
            ("the failed bar", colors::FAILED),
            ("the harness class bar", colors::HARNESS),
            ("the infra class bar", colors::INFRA),
            ("the duration histogram", colors::DURATION),
        ] {
            let n = shot.pixels_of(color);
            assert!(
                n >= 500,
                "{what} is not drawn: {n} pixels of {color} in a {}x{} screenshot",
                shot.width,
                shot.height
            );
        }
    }

    let text = stdout(&sb.run(&["batch", "report", "--batch-id", "eval", "--output-dir", out]));
    assert!(
        text.contains("pass rate: 50.0% (2 of 4 finished cases"),
        "{text}"
    );
    assert!(
        text.contains("pass rate excluding infra: 66.7% (2 of 3"),
        "{text}"
    );

    // The crash is fixed; the network is still down: retry-failed flips one case.
    sb.write("fixed", "");
    let o = sb.run(&[
        "batch",
        "retry-failed",
        "--batch-id",
        "eval",
        "--output-dir",
        out,
    ]);
    assert_exit(&o, 4);
    let o = sb.run(&[
        "batch",
        "diff",
        "eval",
        "eval-retry1",
        "--output-dir",
        out,
        "--json",
    ]);
    assert_exit(&o, 0);
    let d = json_of(&o);
    assert_eq!(d["same_task_list"], true, "{d:#}");
    assert_eq!(
        d["flipped"],
        serde_json::json!([{"case_id": "crash", "from": "failed", "to": "succeeded"}]),
        "{d:#}"
    );
    assert!(
        (d["pass_rate"]["delta"].as_f64().unwrap() - 0.25).abs() < 1e-9,
        "{d:#}"
    );
    // Scores compared over the cases scored in both (the carried two): unchanged.
    assert_eq!(d["scores"]["accuracy"]["n"], 2, "{d:#}");
    assert_eq!(d["scores"]["accuracy"]["delta"], 0.0, "{d:#}");

    let o = sb.run(&["batch", "list", "--output-dir", out, "--json"]);
    assert_exit(&o, 0);
    let listed = json_of(&o);
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["eval", "eval-retry1"], "{listed:#}");
    assert_eq!(listed[1]["outcome"], "failures", "{listed:#}");
    assert_eq!(listed[1]["pass_rate"], 0.75, "{listed:#}");
}
