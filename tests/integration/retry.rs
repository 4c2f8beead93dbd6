//! retry-failed and OOM escalation: finished results are never re-run; failures re-run in a
//! new batch with lineage; the source batch is never changed.

use crate::support::*;

#[test]
fn retry_failed_with_a_class_filter_reruns_only_that_class_and_carries_the_rest() {
    let sb = Sandbox::engine();
    sb.write("network-down", "");
    let manifest = sb.write(
        "incident.yaml",
        r#"batch_id: incident
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  harness: 'echo x >> "$SANDBOX/$CASEBATCH_CASE_ID.runs"; if [ -f "$SANDBOX/network-down" ]; then echo "{\"failure\": {\"class\": \"infra\", \"code\": \"NETWORK_DOWN\", \"retryable\": true}}" > "$CASEBATCH_RESULT"; exit 1; fi; echo "{\"scores\": {\"accuracy\": 0.75}}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: passes
    harness: 'echo x >> "$SANDBOX/passes.runs"; echo "{\"scores\": {\"accuracy\": 0.5}}" > "$CASEBATCH_RESULT"'
  - task_id: judged-fail
    runtime: fake
    fake: {outcome: fail}
  - task_id: casualty
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let source_summary = std::fs::read(sb.bundle("incident").join("batch_summary.json")).unwrap();
    std::fs::remove_file(sb.path("network-down")).unwrap();

    let out = sb.out();
    let o = sb.run(&[
        "batch",
        "retry-failed",
        "--batch-id",
        "incident",
        "--class",
        "infra",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_exit(&o, 4); // judged-fail is carried as the legitimate failure it is
    assert!(
        stdout(&o).contains("re-running 1 failed case(s), carrying 2"),
        "{}",
        stdout(&o)
    );

    assert_eq!(sb.lines("casualty.runs"), 2, "the infra casualty ran again");
    assert_eq!(
        sb.lines("passes.runs"),
        1,
        "a passing result is never re-run"
    );
    let casualty = sb.case_result("incident-retry1", "casualty");
    assert_eq!(casualty["state"], "succeeded", "{casualty:#}");
    assert_eq!(casualty["origin"]["retry_of"], "incident");
    assert_eq!(casualty["origin"]["carried"], false);
    let passes = sb.case_result("incident-retry1", "passes");
    assert_eq!(passes["origin"]["carried"], true);
    assert_eq!(
        passes["scores"]["accuracy"], 0.5,
        "carried verbatim, scores included"
    );
    let judged = sb.case_result("incident-retry1", "judged-fail");
    assert_eq!(judged["verdict"], "fail", "agent failures stay carried");
    assert_eq!(judged["origin"]["carried"], true);
    let lineage = sb.json(&sb.bundle("incident-retry1").join("lineage.json"));
    assert_eq!(lineage["retry_of"], "incident");
    assert_eq!(lineage["rerun"], serde_json::json!(["casualty"]));

    let after = std::fs::read(sb.bundle("incident").join("batch_summary.json")).unwrap();
    assert_eq!(
        source_summary, after,
        "the source batch's bundle is never changed"
    );
    assert_eq!(sb.case_result("incident", "casualty")["state"], "failed");
}

#[test]
fn oom_killed_cases_escalate_memory_per_retry_without_changing_the_spec() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "hog.yaml",
        r#"batch_id: hog
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  resources: {memory_mb: 64}
  harness: 'echo "$CASEBATCH_ATTEMPT" >> "$SANDBOX/hog.runs"; python3 -c "b = bytearray(150 * 1024 * 1024)"'
tasks: [{task_id: hog}]
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let out = sb.out();
    let out = out.to_str().unwrap();
    // 64 MB dies; the first retry gets 128 MB and dies again; the second compounds to 256.
    assert_exit(
        &sb.run(&[
            "batch",
            "retry-failed",
            "--batch-id",
            "hog",
            "--output-dir",
            out,
        ]),
        4,
    );
    let first = sb.case_result("hog-retry1", "hog");
    assert_eq!(first["memory_boost_mb"], 128, "{first:#}");
    assert_eq!(first["failure"]["code"], "OOM_KILLED");
    assert_exit(
        &sb.run(&[
            "batch",
            "retry-failed",
            "--batch-id",
            "hog-retry1",
            "--output-dir",
            out,
        ]),
        0,
    );
    let second = sb.case_result("hog-retry1-retry1", "hog");
    assert_eq!(second["memory_boost_mb"], 256, "{second:#}");
    assert_eq!(second["state"], "succeeded");
    assert_eq!(sb.lines("hog.runs"), 3);
    for batch in ["hog", "hog-retry1", "hog-retry1-retry1"] {
        let plan = sb.json(&sb.bundle(batch).join("batch_plan.json"));
        assert_eq!(
            plan["cases"][0]["resources"]["memory_mb"], 64,
            "the spec still reads 64"
        );
    }
}

#[test]
fn in_batch_oom_auto_boost_doubles_memory_inside_the_running_batch() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "auto.yaml",
        r#"batch_id: auto
defaults:
  runtime: local-process
  max_retries: 0
  oom_auto_boost: true
  resources: {memory_mb: 64}
  harness: 'python3 -c "b = bytearray(150 * 1024 * 1024)"'
tasks: [{task_id: hog}]
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 0);
    let r = sb.case_result("auto", "hog");
    assert_eq!(r["attempts"], 3, "64 → 128 → 256 in one batch");
    assert_eq!(r["memory_boost_mb"], 256);
    let status = sb.status("auto");
    assert_eq!(status["status"]["counters"]["oom_boosts"], 2, "{status:#}");
    let steps = status["status"]["timeline"].to_string();
    assert!(steps.contains("OOM auto-boost 64 → 128 MB"), "{steps}");
    assert!(steps.contains("OOM auto-boost 128 → 256 MB"), "{steps}");
}

#[test]
fn rerun_makes_new_attempts_in_the_same_batch_and_keeps_earlier_evidence() {
    let sb = Sandbox::engine();
    sb.write("broken", "");
    let manifest = sb.write(
        "again.yaml",
        r#"batch_id: again
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  harness: 'echo x >> "$SANDBOX/$CASEBATCH_CASE_ID.runs"; [ "$CASEBATCH_CASE_ID" = flaky ] && [ -f "$SANDBOX/broken" ] && exit 3; echo "{}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: steady}, {task_id: flaky}]
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let out = sb.out();
    let out = out.to_str().unwrap();
    let o = sb.run(&["batch", "rerun", "--batch-id", "again", "--output-dir", out]);
    assert_exit(&o, 2); // a selection is required
    std::fs::remove_file(sb.path("broken")).unwrap();

    // resume alone leaves a finished batch as it is; --retry-failed re-runs the failure.
    assert_exit(
        &sb.run(&[
            "batch",
            "resume",
            "--batch-id",
            "again",
            "--output-dir",
            out,
        ]),
        4,
    );
    assert_eq!(sb.lines("flaky.runs"), 1);
    assert_exit(
        &sb.run(&[
            "batch",
            "resume",
            "--batch-id",
            "again",
            "--retry-failed",
            "--output-dir",
            out,
        ]),
        0,
    );
    assert_eq!((sb.lines("flaky.runs"), sb.lines("steady.runs")), (2, 1));
    let flaky = sb.case_result("again", "flaky");
    assert_eq!(
        (flaky["state"].as_str(), flaky["attempts"].as_u64()),
        (Some("succeeded"), Some(2))
    );

    // A named rerun: only that case, as attempt 2, with attempt 1 kept.
    assert_exit(
        &sb.run(&[
            "batch",
            "rerun",
            "--batch-id",
            "again",
            "--case",
            "steady",
            "--output-dir",
            out,
        ]),
        0,
    );
    assert_eq!((sb.lines("flaky.runs"), sb.lines("steady.runs")), (2, 2));
    let attempts = sb.json(&sb.bundle("again").join("batch_attempts.json"));
    assert_eq!(
        attempts["attempts"].as_array().unwrap().len(),
        4,
        "{attempts:#}"
    );
    assert!(
        sb.bundle("again")
            .join("cases/steady/attempts/1/stdout.log")
            .exists()
    );
    assert!(
        sb.bundle("again")
            .join("cases/steady/attempts/2/stdout.log")
            .exists()
    );

    assert_exit(
        &sb.run(&[
            "batch",
            "rerun",
            "--batch-id",
            "again",
            "--all",
            "--output-dir",
            out,
        ]),
        0,
    );
    assert_eq!((sb.lines("flaky.runs"), sb.lines("steady.runs")), (3, 3));
}

/// Issue 58: `rerun --case Amazon--5` of an epochs batch was refused although `Amazon--5` is
/// the task id (only `Amazon--5#1` worked), and after `rerun --failed` a task's pass@k
/// counted the re-run epochs without saying so.
#[test]
fn rerun_of_a_task_id_reruns_all_its_runs_and_the_report_says_pass_at_k_includes_them() {
    let sb = Sandbox::engine();
    sb.write("broken", "");
    let manifest = sb.write(
        "epochs.yaml",
        r#"batch_id: reruns
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  epochs: 3
  harness: 'echo x >> "$SANDBOX/$CASEBATCH_CASE_ID.runs"; [ "$CASEBATCH_TASK_ID" = Flaky--2 ] && [ "$CASEBATCH_EPOCH" = 2 ] && [ -f "$SANDBOX/broken" ] && exit 3; echo "{}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: Amazon--5}, {task_id: Flaky--2}]
"#,
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let runs = |case: &str| sb.lines(&format!("{case}.runs"));
    let all_runs = || {
        [
            "Amazon--5#1",
            "Amazon--5#2",
            "Amazon--5#3",
            "Flaky--2#1",
            "Flaky--2#2",
            "Flaky--2#3",
        ]
        .map(runs)
    };
    assert_eq!(all_runs(), [1; 6]);

    // The task id: every run of the task, and nothing else.
    assert_exit(&sb.op_with("rerun", "reruns", &["--case", "Amazon--5"]), 4);
    assert_eq!(all_runs(), [2, 2, 2, 1, 1, 1]);
    // A case id: that run alone.
    assert_exit(
        &sb.op_with("rerun", "reruns", &["--case", "Amazon--5#3"]),
        4,
    );
    assert_eq!(all_runs(), [2, 2, 3, 1, 1, 1]);
    // A name that is neither: refused, saying what it takes.
    let o = sb.op_with("rerun", "reruns", &["--case", "Amazon--6"]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("name a task id (every run of the task) or a case id"),
        "{}",
        stderr(&o)
    );
    let help = sb.run(&["batch", "rerun", "--help"]);
    assert!(
        stdout(&help).contains("A task id selects every run of the task"),
        "{}",
        stdout(&help)
    );

    // The runs re-run by name are inside pass@k, and the report says so.
    let report = sb.op("report", "reruns");
    assert!(
        stdout(&report).contains("note: pass@k counts 3 re-run run(s) of 1 task(s)"),
        "{}",
        stdout(&report)
    );

    std::fs::remove_file(sb.path("broken")).unwrap();
    assert_exit(&sb.op_with("rerun", "reruns", &["--failed"]), 0);
    assert_eq!(all_runs(), [2, 2, 3, 1, 2, 1]);
    let report = sb.op("report", "reruns");
    let text = stdout(&report);
    assert!(text.contains("pass@3: 100.0%"), "{text}");
    // Amazon--5's runs were re-run by name too: 4 runs of 2 tasks in all.
    assert!(
        text.contains("note: pass@k counts 4 re-run run(s) of 2 task(s)"),
        "{text}"
    );
    let json = sb.op_with("report", "reruns", &["--json"]);
    let view: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(view["summary"]["lineage"]["rerun_in_place"], 4, "{view:#}");
}

#[test]
fn a_failed_trace_pull_keeps_the_work_and_retry_failed_recollects_without_rerunning() {
    let sb = Sandbox::engine();
    // A free loopback port with nothing on it yet: the trace source is down.
    let port = free_port();
    let manifest = sb.write(
        "traced.yaml",
        &format!(
            r#"batch_id: traced
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 2
  harness: 'echo x >> "$SANDBOX/actor.runs"; echo "{{\"scores\": {{\"accuracy\": 1.0}}, \"trace\": {{\"url\": \"http://127.0.0.1:{port}/traces/web-1?attempt=1\"}}}}" > "$CASEBATCH_RESULT"'
  evaluator: 'echo x >> "$SANDBOX/evaluator.runs"; echo "{{\"verdict\": \"pass\"}}" > "$CASEBATCH_RESULT"'
tasks: [{{task_id: traced-1}}, {{task_id: traced-2}}]
"#
        ),
    );
    assert_exit(&sb.run_batch(&manifest), 4);
    let r = sb.case_result("traced", "traced-1");
    assert_eq!(r["failure"]["stage"], "collect", "{r:#}");
    assert_eq!(r["failure"]["code"], "TRACE_COLLECT_FAILED");
    assert_eq!(r["failure"]["retryable"], true);
    assert_eq!(r["verdict"], "pass", "the work is kept");
    assert_eq!(r["scores"]["accuracy"], 1.0);
    assert_eq!(
        r["attempts"], 1,
        "a trace failure never re-runs the actor in the batch"
    );
    assert_eq!((sb.lines("actor.runs"), sb.lines("evaluator.runs")), (2, 2));

    // Bring the trace source up (the demo fixture serves /traces/...).
    let mut fixture = sb.spawn(
        &[
            "demo",
            "serve",
            "--directory",
            "fixture",
            "--port",
            &port.to_string(),
        ],
        "fixture.log",
    );
    wait_until(std::time::Duration::from_secs(30), "fixture ready", || {
        std::fs::read_to_string(sb.path("fixture.log"))
            .unwrap_or_default()
            .contains("ready: true")
    });
    let out = sb.out();
    let o = sb.run(&[
        "batch",
        "retry-failed",
        "--batch-id",
        "traced",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    let _ = fixture.kill();
    let _ = fixture.wait();
    assert_exit(&o, 0);
    assert!(
        stdout(&o).contains("2 collect-failed case(s) re-collected without re-run (2 recovered)"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        (sb.lines("actor.runs"), sb.lines("evaluator.runs")),
        (2, 2),
        "neither the actor nor the evaluator ran again"
    );
    let recovered = sb.case_result("traced-retry1", "traced-1");
    assert_eq!(recovered["state"], "succeeded", "{recovered:#}");
    assert_eq!(recovered["origin"]["recollected"], true);
    assert!(
        sb.bundle("traced-retry1")
            .join("cases/traced-1/trace.json")
            .exists()
    );
}
