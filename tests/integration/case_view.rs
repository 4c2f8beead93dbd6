//! The case-level view outside the HTML report: `batch logs` (an attempt's logs, followed as
//! they are written), `batch diff` telling a result that changed from a case that did not run,
//! with intervals on its deltas, and `batch list` with start times and durations.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

#[test]
fn logs_follow_a_running_attempt_as_its_lines_are_written_and_stop_at_its_end() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "slow.yaml",
        r#"batch_id: slow
defaults:
  runtime: local-process
  pass_env: [SANDBOX]
  harness: 'echo first; echo "to stderr" >&2; while [ ! -f "$SANDBOX/go" ]; do sleep 0.05; done; echo second'
tasks: [{task_id: talker}]
"#,
    );
    let out = sb.out();
    let out_s = out.to_str().unwrap();
    let mut runner = sb.spawn_batch(&manifest, "runner.log");
    let case_dir = "talker";
    let log = sb.attempt_file("slow", case_dir, 1, "stdout.log");
    wait_until(Duration::from_secs(60), "the harness's first line", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("first"))
    });

    let mut follower = Command::new(env!("CARGO_BIN_EXE_casebatch"))
        .args([
            "batch",
            "logs",
            "--batch-id",
            "slow",
            "--output-dir",
            out_s,
            "--case",
            "talker",
            "--follow",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn casebatch batch logs");
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    // Printed while the harness still waits: its second line is not written yet.
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    assert!(!sb.path("go").exists());
    sb.write("go", "");
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    // The attempt's job ended: the follower ends by itself, with everything printed.
    assert!(lines.next().is_none(), "more than the harness wrote");
    assert_eq!(wait_child(&mut follower, Duration::from_secs(30)), 0);
    assert_eq!(wait_child(&mut runner, Duration::from_secs(120)), 0);

    // Afterwards: stdout and stderr apart, as written.
    let o = sb.run(&[
        "batch",
        "logs",
        "--batch-id",
        "slow",
        "--output-dir",
        out_s,
        "--case",
        "talker",
    ]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o), "first\nsecond\n");
    assert_eq!(stderr(&o), "to stderr\n");
    for (args, names) in [
        (&["--case", "nobody"][..], "\"nobody\""),
        (&["--case", "talker", "--attempt", "2"][..], "--attempt"),
    ] {
        let mut all = vec!["batch", "logs", "--batch-id", "slow", "--output-dir", out_s];
        all.extend(args);
        let o = sb.run(&all);
        assert_exit(&o, 2);
        assert!(stderr(&o).contains(names), "{}", stderr(&o));
    }
}

#[test]
fn diff_tells_a_changed_result_from_a_case_not_run_and_list_shows_when_each_ran() {
    let sb = Sandbox::engine();
    let manifest = |batch_id: &str, budget: &str| {
        sb.write(
            &format!("{batch_id}.yaml"),
            &format!(
                r#"batch_id: {batch_id}
defaults:
  runtime: local-process
  concurrency: 1
  max_retries: 0
  pass_env: [SANDBOX]
  {budget}
  harness: 'if [ "$PASS" = yes ] && [ ! -f "$SANDBOX/broken-$CASEBATCH_CASE_ID" ]; then r=0; else r=1; fi; echo "{{\"usage\": {{\"cost_usd\": 1}}, \"scores\": {{\"s\": $((1 - r))}}}}" > "$CASEBATCH_RESULT"; exit $r'
tasks:
  - {{task_id: a, env: {{PASS: "yes"}}}}
  - {{task_id: b, env: {{PASS: "yes"}}}}
  - {{task_id: c, env: {{PASS: "no"}}}}
  - {{task_id: d, env: {{PASS: "yes"}}}}
"#
            ),
        )
    };
    assert_exit(&sb.run_batch(&manifest("full", "")), 4);
    // b breaks; a budget of $2 at one case at a time runs a and b only, c and d stay queued.
    sb.write("broken-b", "");
    assert_exit(
        &sb.run_batch(&manifest("capped", "budget: {cost_usd: 2}")),
        1,
    );
    let out = sb.out();
    let out = out.to_str().unwrap();
    let o = sb.run(&[
        "batch",
        "diff",
        "full",
        "capped",
        "--output-dir",
        out,
        "--json",
    ]);
    assert_exit(&o, 0);
    let d = json_of(&o);
    assert_eq!(
        d["flipped"],
        serde_json::json!([{"case_id": "b", "from": "succeeded", "to": "failed"}]),
        "only a result that changed is a flip: {d:#}"
    );
    assert_eq!(
        d["not_finished"],
        serde_json::json!([
            {"case_id": "c", "from": "failed", "to": "queued"},
            {"case_id": "d", "from": "succeeded", "to": "queued"},
        ]),
        "{d:#}"
    );
    // Paired over the two cases finished in both (a passes in both, b flips): 1 → 0.5.
    let p = &d["paired_pass_rate"];
    assert_eq!(
        (p["n"].clone(), p["delta"].clone()),
        (2.into(), (-0.5).into()),
        "{d:#}"
    );
    let (low, high) = (
        p["ci95"]["low"].as_f64().unwrap(),
        p["ci95"]["high"].as_f64().unwrap(),
    );
    // Resampling {0, -1}: every mean lies in [-1, 0], and -0.5 within the interval.
    assert!(
        (-1.0..=-0.5).contains(&low) && (-0.5..=0.0).contains(&high),
        "{p:#}"
    );
    assert_eq!(d["scores"]["s"]["n"], 2, "{d:#}");
    let text = stdout(&sb.run(&["batch", "diff", "full", "capped", "--output-dir", out]));
    for needed in [
        "flipped (finished in both): 1",
        "not finished in one of them: 2",
        "pass rate over cases finished in both: 100.0% → 50.0% (-0.500, 95% CI [",
    ] {
        assert!(text.contains(needed), "no {needed:?} in:\n{text}");
    }

    let o = sb.run(&["batch", "list", "--output-dir", out, "--json"]);
    assert_exit(&o, 0);
    let listed = json_of(&o);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for b in listed.as_array().unwrap() {
        let started = b["started_at_ms"].as_u64().expect("a start time");
        let took = b["duration_ms"].as_u64().expect("a duration once ended");
        assert!(
            started + took <= now_ms && now_ms - started < 600_000,
            "{b:#}"
        );
    }
    // The text names the start in UTC to the minute, as `date -u` does.
    let full = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["batch_id"] == "full")
        .unwrap();
    let at = format!("@{}", full["started_at_ms"].as_u64().unwrap() / 1000);
    let date = Command::new("date")
        .args(["-u", "-d", &at, "+%Y-%m-%d %H:%M"])
        .output()
        .unwrap();
    let date = String::from_utf8_lossy(&date.stdout).trim().to_string();
    let text = stdout(&sb.run(&["batch", "list", "--output-dir", out]));
    let line = text.lines().find(|l| l.contains("full")).unwrap();
    assert!(line.contains(&date), "{date} not in:\n{text}");
}
