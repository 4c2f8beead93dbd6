//! Reports that compare: pass rates with their denominators, score means with standard
//! errors (clustered by task with epochs), pass@k with its standard error, duration
//! percentiles, per-stage timings; the HTML report rendered in headless Chromium, with pass@k,
//! usage and cost, and a retried batch's lineage; a verdict from a score (`pass_when`);
//! `batch diff` of a batch and its retry-failed child; `batch list`.

use serde_json::Value;

use crate::support::*;

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
  harness: 'echo "line from $SCORE"; echo "{\"scores\": {\"accuracy\": $SCORE}, \"outputs\": {\"answer\": \"said $SCORE\"}}" > "$CASEBATCH_RESULT"'
tasks:
  - {task_id: right, query: "what is right", env: {SCORE: "1.0"}}
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

    let o = sb.op_with("report", "eval", &["--json"]);
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
    let html = html_report(&sb, "eval", "report.html");
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
        // The case-level view, as the browser sees it: each case's section with its input,
        // outputs and failure, and links that reach the attempt's own logs.
        let url = format!("file://{}", html.display());
        let dom = dom_of(&browser, &url, sb.dir.path()).expect("chromium renders the report");
        for needed in [
            "id=\"case-0\"",
            "said 1.0",
            "said 0.0",
            "NETWORK_DOWN",
            "what is right",
        ] {
            assert!(dom.contains(needed), "no {needed} on the page: {dom}");
        }
        let stdout_link = dom
            .split("href=\"")
            .skip(1)
            .map(|s| &s[..s.find('"').unwrap()])
            .find(|h| h.ends_with("stdout.log"))
            .expect("a link to an attempt's stdout");
        let linked = sb.dir.path().join(stdout_link);
        assert!(
            std::fs::read_to_string(&linked)
                .unwrap_or_default()
                .starts_with("line from "),
            "{stdout_link} does not reach the first case's log ({})",
            linked.display()
        );
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

    let text = stdout(&sb.op("report", "eval"));
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
    let o = sb.op("retry-failed", "eval");
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

/// Three tasks, four runs each, seeded by the run number the harness is told: one task always
/// passes, one never does, one passes only its first run. pass@k is computed by hand.
#[test]
fn epochs_run_each_task_four_times_and_the_report_gives_pass_at_k() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "epochs.yaml",
        r#"batch_id: epochs
defaults:
  runtime: local-process
  max_retries: 0
  concurrency: 4
  epochs: 4
  harness: 'test "$CASEBATCH_CASE_ID" = "$CASEBATCH_TASK_ID#$CASEBATCH_EPOCH" || exit 9; echo "{\"scores\": {\"accuracy\": $CASEBATCH_EPOCH}}" > "$CASEBATCH_RESULT"'
summary:
  write_csv: true
tasks:
  - task_id: always
  - task_id: never
    harness: 'exit 1'
  - task_id: first
    harness: 'test "$CASEBATCH_EPOCH" = 1 || exit 1; echo "{\"scores\": {\"accuracy\": 1}}" > "$CASEBATCH_RESULT"'
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let out = sb.out();
    let o = sb.run(&[
        "batch",
        "report",
        "--batch-id",
        "epochs",
        "--output-dir",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_exit(&o, 0);
    let summary = json_of(&o)["summary"].clone();
    assert_eq!(summary["total"], 12, "{summary:#}");
    assert_eq!(summary["counts"]["succeeded"], 5, "{summary:#}");
    let tasks = &summary["stats"]["tasks"];
    assert_eq!(tasks["tasks"], 3, "{tasks:#}");
    let close = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
    // always: 1 at every k; never: 0; first (1 of 4): 1 − C(3,k)/C(4,k) = 1/4, 1/2, 3/4, 1.
    let expected = [
        (1.0 + 0.0 + 0.25) / 3.0,
        (1.0 + 0.0 + 0.5) / 3.0,
        (1.0 + 0.0 + 0.75) / 3.0,
        (1.0 + 0.0 + 1.0) / 3.0,
    ];
    let at = tasks["pass_at_k"].as_array().unwrap();
    assert_eq!(at.len(), 4, "{tasks:#}");
    for (k, want) in expected.iter().enumerate() {
        assert_eq!(at[k]["k"], k + 1);
        assert_eq!(at[k]["of"], 3, "{tasks:#}");
        assert!(close(&at[k]["mean"], *want), "pass@{}: {tasks:#}", k + 1);
    }
    let rows = tasks["rows"].as_array().unwrap();
    let first = rows.iter().find(|r| r["task_id"] == "first").unwrap();
    assert_eq!(
        (first["finished"].clone(), first["passed"].clone()),
        (4.into(), 1.into())
    );
    for (k, want) in [0.25, 0.5, 0.75, 1.0].iter().enumerate() {
        assert!(close(&first["pass_at_k"][k], *want), "{first:#}");
    }
    // Scores by task: always averages its runs 1..4 (2.5), first has one (1); the batch's
    // mean is over those two tasks.
    let always = rows.iter().find(|r| r["task_id"] == "always").unwrap();
    assert!(
        close(&always["scores"]["accuracy"]["mean"], 2.5),
        "{always:#}"
    );
    let by_task = &tasks["scores"]["accuracy"];
    assert_eq!(by_task["n"], 2, "{tasks:#}");
    assert!(close(&by_task["mean"], 1.75), "{tasks:#}");

    let text = sb.run(&[
        "batch",
        "report",
        "--batch-id",
        "epochs",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_exit(&text, 0);
    assert!(
        stdout(&text).contains("pass@2: 50.0% ± 28.9% (mean of 3 tasks"),
        "{}",
        stdout(&text)
    );
    assert!(
        stdout(&text).contains("task first: 1 of 4 finished run(s) passed"),
        "{}",
        stdout(&text)
    );
    let csv = std::fs::read_to_string(sb.bundle("epochs").join("batch_tasks.csv")).unwrap();
    assert_eq!(
        csv.lines().next(),
        Some("task_id,epochs,finished,passed,pass@1,pass@2,pass@3,pass@4")
    );
    assert!(
        csv.contains("\nfirst,4,4,1,0.250000,0.500000,0.750000,1.000000\n"),
        "{csv}"
    );
}

/// Three tasks, four runs each, judged by `pass_when` from the `match` score each run reports
/// (with its cost): `always` matches every run, `never` none, `first` only its first. By hand,
/// over tasks: task means 1, 0, 1/4, mean 5/12, standard error √(Σ(mᵢ − 5/12)² / 2 / 3) =
/// √(13/144) ≈ 0.300; over the 12 runs taken as independent it would be √(35/132 / 12) ≈
/// 0.149. pass@2 by task: 1, 0, 1/2: mean 1/2 ± √(1/12) ≈ 0.289.
const JUDGED_EPOCHS: &str = r#"batch_id: judged
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  concurrency: 4
  epochs: 4
  pass_when: {score: match, at_least: 1}
  harness: 'case " $MATCHES " in *" $CASEBATCH_EPOCH "*) m=1 ;; *) m=0 ;; esac; if [ -f "$SANDBOX/fixed" ]; then m=1; fi; printf "{\"scores\": {\"match\": %s}, \"usage\": {\"cost_usd\": 0.25, \"input_tokens\": 100}}" "$m" > "$CASEBATCH_RESULT"'
tasks:
  - {task_id: always, env: {MATCHES: "1 2 3 4"}}
  - {task_id: never, env: {MATCHES: ""}}
  - {task_id: first, env: {MATCHES: "1"}}
"#;

#[test]
fn an_epochs_batch_leads_with_the_clustered_error_and_gives_pass_at_k_its_error() {
    let sb = Sandbox::engine();
    let manifest = sb.write("judged.yaml", JUDGED_EPOCHS);
    assert_exit(&sb.run_batch(&manifest), 4);
    let o = sb.op_with("report", "judged", &["--json"]);
    assert_exit(&o, 0);
    let stats = json_of(&o)["summary"]["stats"].clone();
    let close = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;

    // The headline is the per-task figure, clustered by task.
    assert_eq!(stats["scores_over"], "tasks", "{stats:#}");
    let headline = &stats["scores"]["match"];
    assert_eq!(headline, &stats["tasks"]["scores"]["match"], "{stats:#}");
    assert_eq!(headline["n"], 3, "{stats:#}");
    assert!(close(&headline["mean"], 5.0 / 12.0), "{stats:#}");
    assert!(
        close(&headline["stderr"], (13.0f64 / 144.0).sqrt()),
        "{stats:#}"
    );
    // The per-run figure is kept, named, and smaller.
    let unclustered = &stats["scores_unclustered"]["match"];
    assert_eq!(unclustered["n"], 12, "{stats:#}");
    assert!(
        close(&unclustered["stderr"], (35.0f64 / 132.0 / 12.0).sqrt()),
        "{stats:#}"
    );

    // pass@k with its standard error over tasks.
    let at = &stats["tasks"]["pass_at_k"];
    assert!(
        close(&at[0]["mean"], 5.0 / 12.0) && close(&at[0]["stderr"], (13.0f64 / 144.0).sqrt()),
        "{at:#}"
    );
    assert!(
        close(&at[1]["mean"], 0.5) && close(&at[1]["stderr"], (1.0f64 / 12.0).sqrt()),
        "{at:#}"
    );

    let text = stdout(&sb.op("report", "judged"));
    let first_score = text
        .lines()
        .find(|l| l.contains("score match"))
        .unwrap_or_default();
    assert!(
        first_score.contains("mean 0.417 ± 0.300")
            && first_score.contains("clustered by task, n=3 tasks"),
        "the first score line is the clustered one:\n{text}"
    );
    assert!(
        text.contains("score match over runs, unclustered: mean 0.417 ± 0.149"),
        "{text}"
    );
    assert!(
        text.contains("pass@2: 50.0% ± 28.9% (mean of 3 tasks"),
        "{text}"
    );
    assert!(
        text.contains("usage: cost_usd 3 · input_tokens 1200"),
        "{text}"
    );

    // The HTML page carries the same, in a real browser: pass@k with its error, and the cost.
    let html = html_report(&sb, "judged", "judged.html");
    if let Some(browser) = browser_or_skip("the HTML report of an epochs batch in a browser") {
        let dom = dom_of(
            &browser,
            &format!("file://{}", html.display()),
            sb.dir.path(),
        )
        .expect("chromium renders the report");
        for needed in [
            "<h2 id=\"pass-at-k\">pass@k</h2>",
            "<td class=\"n\">pass@2</td><td class=\"n\">50.0%</td><td class=\"n\">± 28.9%</td>",
            "mean 0.417 ± 0.300 (standard error), n=3 tasks",
            "over runs, unclustered",
            "<th>cost_usd</th>",
            "<th>Total</th><td class=\"n\">3</td><td class=\"n\">1200</td>",
            "id=\"task-table\"",
            "attempts</text>",
        ] {
            assert!(dom.contains(needed), "no {needed} on the page: {dom}");
        }
        std::fs::create_dir_all(sb.path("shot")).unwrap();
        let shot = Screenshot::of(&browser, &html, &sb.path("shot"), (1000, 2400));
        let n = shot.pixels_of(casebatch_report::colors::PASS_AT_K);
        assert!(n >= 500, "the pass@k plot is not drawn: {n} pixels");
    }

    // Fixed, the failed runs pass when retried: the retry's report says what it is a retry of,
    // what it carried, and that its pass@k counts the re-runs.
    sb.write("fixed", "");
    let o = sb.op("retry-failed", "judged");
    assert_exit(&o, 0);
    let o = sb.op_with("report", "judged-retry1", &["--json"]);
    assert_exit(&o, 0);
    let summary = json_of(&o)["summary"].clone();
    assert_eq!(
        summary["lineage"],
        serde_json::json!({"retry_of": "judged", "carried": 5, "rerun": 7, "recollected": 0,
                           "rerun_in_place": 0}),
        "{summary:#}"
    );
    assert_eq!(summary["stats"]["tasks"]["reruns"], 7, "{summary:#}");
    let text = stdout(&sb.op("report", "judged-retry1"));
    assert!(
        text.contains("retry of batch judged: 7 case(s) re-run here, 5 carried over"),
        "{text}"
    );
    assert!(
        text.contains("note: pass@k counts 7 re-run run(s) of 2 task(s)"),
        "{text}"
    );
    // Its usage is what it ran: the carried results were paid for by the batch it retries.
    assert!(
        text.contains(
            "usage: cost_usd 1.75 · input_tokens 700 (over 7 case(s); what this batch ran only: \
             its 5 carried-over results were paid for by batch judged)"
        ),
        "{text}"
    );
    html_report(&sb, "judged-retry1", "retry.html");
    let page = sb.read("retry.html");
    assert!(
        page.contains("<th>Retry of batch</th><td><code>judged</code>"),
        "{page}"
    );
    assert!(
        page.contains("<th>Cases carried over as they were</th><td class=\"n\">5</td>"),
        "{page}"
    );
    assert!(
        page.contains("pass@k counts 7 re-run run(s) of 2 task(s)"),
        "{page}"
    );
}

/// `pass_when` turns a score into a verdict with no evaluator process: a run at the threshold
/// passes, one below fails as the agent's (`VERDICT_FAIL`), and one that reports no such score
/// is the harness's failure (`HARNESS_BAD_RESULT`); `batch report` exits 0 whatever the
/// outcome, as its help says.
#[test]
fn pass_when_decides_pass_or_fail_from_a_score_without_an_evaluator() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "scored.yaml",
        r#"batch_id: scored
defaults:
  runtime: local-process
  max_retries: 0
  pass_when: {score: match, at_least: 1}
  harness: 'printf "{\"scores\": $SCORES}" > "$CASEBATCH_RESULT"'
tasks:
  - {task_id: matched, env: {SCORES: '{"match": 1}'}}
  - {task_id: missed, env: {SCORES: '{"match": 0}'}}
  - {task_id: unscored, env: {SCORES: '{"f1": 0.9}'}}
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let state = |case: &str| sb.case_result("scored", case);
    let matched = state("matched");
    assert_eq!(
        (matched["state"].clone(), matched["verdict"].clone()),
        ("succeeded".into(), "pass".into()),
        "{matched:#}"
    );
    assert_eq!(matched["evaluation_configured"], true, "{matched:#}");
    let missed = state("missed");
    assert_eq!(
        (missed["state"].clone(), missed["verdict"].clone()),
        ("failed".into(), "fail".into()),
        "{missed:#}"
    );
    assert_eq!(
        (
            missed["failure"]["class"].clone(),
            missed["failure"]["code"].clone()
        ),
        ("agent".into(), "VERDICT_FAIL".into()),
        "{missed:#}"
    );
    assert!(
        missed["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("below pass_when's at_least 1"),
        "{missed:#}"
    );
    let unscored = state("unscored");
    assert_eq!(
        (
            unscored["failure"]["class"].clone(),
            unscored["failure"]["code"].clone()
        ),
        ("harness".into(), "HARNESS_BAD_RESULT".into()),
        "{unscored:#}"
    );
    assert!(
        unscored["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("`match`"),
        "{unscored:#}"
    );
    // The attempt's evaluation says the rule decided, and no evaluator ran.
    let evaluation = sb.recorded("scored", "missed", 1, "evaluation");
    assert_eq!(
        evaluation["pass_when"], "score match = 0, pass_when at_least 1",
        "{evaluation:#}"
    );
    assert!(
        !sb.attempt_file("scored", "missed", 1, "evaluator_result.json")
            .exists()
    );
    // The plan records the rule on each case.
    let plan = sb.json(&sb.bundle("scored").join("batch_plan.json"));
    assert_eq!(
        plan["cases"][0]["pass_when"],
        serde_json::json!({"score": "match", "at_least": 1.0})
    );

    let o = sb.op("report", "scored");
    assert_exit(&o, 0);
    assert!(
        stdout(&o).contains("failed 2 · succeeded 1"),
        "{}",
        stdout(&o)
    );

    // Re-run in place, the two failed cases are counted as re-runs, and the report says so.
    assert_exit(&sb.op_with("rerun", "scored", &["--failed"]), 4);
    let o = sb.op_with("report", "scored", &["--json"]);
    assert_exit(&o, 0);
    let lineage = json_of(&o)["summary"]["lineage"].clone();
    assert_eq!(lineage["rerun_in_place"], 2, "{lineage:#}");
    assert_eq!(lineage.get("retry_of"), None, "{lineage:#}");
    let text = stdout(&sb.op("report", "scored"));
    assert!(
        text.contains("re-run in this batch: 2 case(s) got a new attempt after they had finished"),
        "{text}"
    );
}

/// Writes `batch`'s HTML report to `file` in the sandbox, and returns its path.
fn html_report(sb: &Sandbox, batch: &str, file: &str) -> std::path::PathBuf {
    let html = sb.path(file);
    assert_exit(
        &sb.op_with("report", batch, &["--html", html.to_str().unwrap()]),
        0,
    );
    html
}
