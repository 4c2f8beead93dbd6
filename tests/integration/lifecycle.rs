//! A batch's life on the embedded engine: run, resume, drain, pause, cancel, continue-as-new.

use std::time::Duration;

use crate::support::*;

fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// An attempt that ran and succeeded is six inodes in the bundle (its directory, the journal,
/// both logs, the result, `output/`): every engine record is a line of `attempt.jsonl`, and the
/// working directory, input file and `TMPDIR` are scratch outside the bundle, removed by
/// cleanup.
#[test]
fn a_succeeded_attempt_is_six_inodes_and_leaves_no_scratch() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "lean.yaml",
        r#"batch_id: lean
defaults:
  runtime: local-process
  concurrency: 2
  harness: 'test "$(cat "$CASEBATCH_INPUT")" = "{\"query\":\"q\",\"task_id\":\"$CASEBATCH_CASE_ID\"}" && touch scratch-file && mktemp > "$CASEBATCH_OUTPUT_DIR/tmp-path" && echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - {task_id: a, query: q}
  - {task_id: b, query: q}
"#,
    );
    let scratch = sb.path("scratch");
    let mut runner = sb.spawn_batch_with_env(
        &manifest,
        "run.log",
        &[("CASEBATCH_SCRATCH_DIR", scratch.to_str().unwrap())],
    );
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        0,
        "{}",
        tail(&sb.path("run.log"), 20)
    );
    for case in ["a", "b"] {
        let dir = sb.attempt_file("lean", case, 1, "");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "attempt.jsonl",
                "output",
                "result.json",
                "stderr.log",
                "stdout.log"
            ],
            "{case}: the attempt directory and these five"
        );
        let journal = journal_at(&dir);
        for kind in ["spec", "job", "wrapper", "exit", "cleanup", "record"] {
            assert!(!journal[kind].is_null(), "{case}: no {kind}: {journal:#}");
        }
        assert_eq!(journal["spec"]["case"]["input"]["query"], "q");
        // Its temporary file went to the attempt's own TMPDIR, not the host's.
        let tmp_file = std::fs::read_to_string(dir.join("output/tmp-path")).unwrap();
        let tmp_file = std::path::Path::new(tmp_file.trim());
        assert!(tmp_file.starts_with(&scratch), "{case}: {tmp_file:?}");
        assert!(!tmp_file.exists(), "{case}: {tmp_file:?} outlived cleanup");
        let stages: Vec<&str> = journal["record"]["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["stage"].as_str().unwrap())
            .collect();
        assert_eq!(
            stages,
            [
                "provision",
                "submit",
                "await",
                "evaluate",
                "collect",
                "cleanup"
            ],
            "{case}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
    assert_exit(&sb.op("report", "lean"), 0);
}

#[test]
fn run_writes_the_bundle_and_resume_of_a_completed_batch_changes_nothing() {
    let sb = Sandbox::engine();
    let out = sb.out();
    let out = out.to_str().unwrap();
    let manifest = example("batch-local.yaml");
    let o = sb.run(&["batch", "run", "--manifest", &manifest, "--output-dir", out]);
    assert_exit(&o, 0);

    let b = sb.bundle("local-example");
    for f in [
        "manifest.json",
        "run_config.json",
        "batch_plan.json",
        "batch_results.json",
        "batch_attempts.json",
        "batch_summary.json",
        "batch_summary.csv",
        "events.jsonl",
    ] {
        assert!(b.join(f).exists(), "{f} missing from the bundle");
    }
    let summary = sb.json(&b.join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 3, "{summary:#}");
    assert_eq!(summary["attempts_total"], 3);
    for row in summary["rows"].as_array().unwrap() {
        let dir = row["case_dir"].as_str().unwrap();
        let attempt = b.join("cases").join(dir).join("attempts/1");
        for f in [
            "attempt.jsonl",
            "result.json",
            "stdout.log",
            "stderr.log",
            "evaluator_result.json",
        ] {
            assert!(attempt.join(f).exists(), "{dir}: {f} missing");
        }
        let journal = journal_at(&attempt);
        for kind in ["spec", "job", "evaluation", "cleanup", "record"] {
            assert!(!journal[kind].is_null(), "{dir}: no {kind} recorded");
        }
        let cleanup = &journal["cleanup"];
        assert_eq!(cleanup["cleanup_confirmed"], true, "{cleanup:#}");
        let result = sb.case_result("local-example", dir);
        assert_eq!(result["verdict"], "pass");
        assert_eq!(result["actor_status"], "finished");
        assert_eq!(result["scores"]["accuracy"], 1.0);
    }
    let csv = std::fs::read_to_string(b.join("batch_summary.csv")).unwrap();
    assert!(
        csv.lines().next().unwrap().ends_with("scores.accuracy"),
        "{csv}"
    );
    let run_config = std::fs::read_to_string(b.join("run_config.json")).unwrap();
    assert!(run_config.contains("\"embedded\""), "{run_config}");

    // Resume after completion: a no-op that keeps every result and attempt count.
    let o = sb.run(&[
        "batch",
        "resume",
        "--batch-id",
        "local-example",
        "--output-dir",
        out,
    ]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("already complete"), "{}", stdout(&o));
    let again = sb.json(&b.join("batch_summary.json"));
    assert_eq!(again["attempts_total"], 3);
    assert_eq!(again["counts"], summary["counts"]);
}

const SLOW: &str = r#"
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ran.log"; {work}; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: a
  - task_id: b
  - task_id: c
  - task_id: d
"#;

fn slow_manifest(sb: &Sandbox, batch: &str, concurrency: u32, secs: u32) -> String {
    manifest_doing(sb, batch, concurrency, &format!("sleep {secs}"))
}

/// Cases that wait for the test to create `$SANDBOX/go`: the test decides when they end.
fn gated_manifest(sb: &Sandbox, batch: &str) -> String {
    let wait = r#"while [ ! -e "$SANDBOX/go" ]; do sleep 0.05; done"#;
    manifest_doing(sb, batch, 1, wait)
}

fn manifest_doing(sb: &Sandbox, batch: &str, concurrency: u32, work: &str) -> String {
    let body = SLOW.replace("{work}", work);
    let text = format!("batch_id: {batch}\n{body}").replace(
        "defaults:\n",
        &format!("defaults:\n  concurrency: {concurrency}\n"),
    );
    sb.write(&format!("{batch}.yaml"), &text)
        .display()
        .to_string()
}

/// Waits until the batch's live status reports this phase.
fn wait_phase(sb: &Sandbox, batch: &str, phase: &str) {
    wait_until(Duration::from_secs(60), phase, || {
        sb.status(batch)["status"]["phase"] == phase
    });
}

#[test]
fn drain_leaves_queued_work_and_resume_finishes_it_without_repeats() {
    let sb = Sandbox::engine();
    let manifest = gated_manifest(&sb, "drainme");
    let mut runner = sb.spawn_batch(std::path::Path::new(&manifest), "run.log");
    wait_until(Duration::from_secs(60), "first case starts", || {
        sb.lines("ran.log") >= 1
    });
    let o = sb.op("drain", "drainme");
    assert_exit(&o, 0);
    wait_phase(&sb, "drainme", "draining");
    sb.write("go", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        1,
        "a drained runner exits 1"
    );

    let status = sb.status("drainme");
    assert_eq!(status["end"], "drained", "{status:#}");
    assert_eq!(status["status"]["counts"]["succeeded"], 1, "{status:#}");
    assert_eq!(status["status"]["counts"]["queued"], 3, "{status:#}");
    assert_eq!(sb.lines("ran.log"), 1, "only the admitted case ran");

    let o = sb.op("resume", "drainme");
    assert_exit(&o, 0);
    assert_eq!(sb.lines("ran.log"), 4, "every case ran exactly once");
    let summary = sb.json(&sb.bundle("drainme").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 4);
    assert_eq!(
        summary["attempts_total"], 4,
        "no case ran twice: {summary:#}"
    );
}

#[test]
fn pause_stops_admissions_until_unpause() {
    let sb = Sandbox::engine();
    let manifest = gated_manifest(&sb, "pauseme");
    let mut runner = sb.spawn_batch(std::path::Path::new(&manifest), "run.log");
    wait_until(Duration::from_secs(60), "first case starts", || {
        sb.lines("ran.log") >= 1
    });
    assert_exit(&sb.op("pause", "pauseme"), 0);
    wait_phase(&sb, "pauseme", "paused");
    // The first case ends while paused. The workflow admits in the same step that records a
    // completion, so once it counts the success, a running batch would already show case b.
    sb.write("go", "");
    wait_until(
        Duration::from_secs(60),
        "the first case is recorded",
        || sb.status("pauseme")["status"]["counts"]["succeeded"] == 1,
    );
    let status = sb.status("pauseme");
    assert_eq!(status["status"]["phase"], "paused", "{status:#}");
    assert_eq!(status["status"]["counts"]["running"], 0, "{status:#}");
    assert_eq!(sb.lines("ran.log"), 1, "nothing admitted while paused");
    assert!(
        runner.try_wait().unwrap().is_none(),
        "the runner keeps waiting while paused"
    );

    assert_exit(&sb.op("unpause", "pauseme"), 0);
    assert_eq!(wait_child(&mut runner, Duration::from_secs(120)), 0);
    assert_eq!(sb.lines("ran.log"), 4);
}

#[test]
fn cancel_stops_in_flight_cases_and_still_cleans_them_up() {
    let sb = Sandbox::engine();
    // `sleep 3041`: a needle no other test's process contains (unit tests of the runtime and
    // the agent run `sleep 300` beside this one).
    let manifest = slow_manifest(&sb, "cancelme", 2, 3041);
    let mut runner = sb.spawn_batch(std::path::Path::new(&manifest), "run.log");
    wait_until(Duration::from_secs(60), "two cases start", || {
        sb.lines("ran.log") >= 2
    });
    assert_exit(&sb.op("cancel", "cancelme"), 0);
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        4,
        "cancelled = not all succeeded"
    );

    let summary = sb.json(&sb.bundle("cancelme").join("batch_summary.json"));
    assert_eq!(summary["counts"]["cancelled"], 2, "{summary:#}");
    assert_eq!(
        summary["counts"]["queued"], 2,
        "queued cases were never started: {summary:#}"
    );
    for case in ["a", "b"] {
        let receipt = sb.recorded("cancelme", case, 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    }
    assert!(
        no_process_matches("sleep 3041"),
        "no harness process survives the cancel"
    );
}

/// Issue 14: `temporal workflow cancel` (also the Web UI's cancel button) once spun the
/// workflow task forever (WorkflowTaskTimedOut, a worker at 100 % CPU). It must do what
/// `casebatch batch cancel` does: cancel in-flight cases, clean them up, end the run.
#[test]
fn native_temporal_cancel_ends_the_batch_like_casebatch_cancel() {
    let sb = Sandbox::engine();
    let manifest = slow_manifest(&sb, "nativecancel", 2, 301);
    let mut runner = sb.spawn_batch(std::path::Path::new(&manifest), "run.log");
    wait_until(Duration::from_secs(60), "two cases start", || {
        sb.lines("ran.log") >= 2
    });
    let engine = sb.json(&sb.out().join(".casebatch-engine/engine.json"));
    let address = engine["address"].as_str().expect("engine address");
    let address = address.trim_start_matches("http://");
    let temporal = std::env::var("CASEBATCH_TEMPORAL_BIN").unwrap_or_else(|_| "temporal".into());
    let o = std::process::Command::new(temporal)
        .args([
            "workflow",
            "cancel",
            "--workflow-id",
            "casebatch-nativecancel",
        ])
        .args(["--address", address])
        .output()
        .expect("temporal CLI runs");
    assert_exit(&o, 0);
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        4,
        "cancelled = not all succeeded"
    );

    let summary = sb.json(&sb.bundle("nativecancel").join("batch_summary.json"));
    assert_eq!(summary["counts"]["cancelled"], 2, "{summary:#}");
    for case in ["a", "b"] {
        let receipt = sb.recorded("nativecancel", case, 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    }
    assert!(
        no_process_matches("sleep 301"),
        "no harness process survives the cancel"
    );
}

#[test]
fn a_different_task_list_under_an_existing_batch_id_is_refused() {
    let sb = Sandbox::engine();
    let m1 = sb.write(
        "one.yaml",
        "batch_id: same\ndefaults: {runtime: fake}\ntasks:\n  - task_id: x\n",
    );
    let m2 = sb.write(
        "two.yaml",
        "batch_id: same\ndefaults: {runtime: fake}\ntasks:\n  - task_id: y\n",
    );
    assert_exit(&sb.run_batch(&m1), 0);
    let o = sb.run_batch(&m2);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("different task list"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--batch-id"),
        "says what to do: {}",
        stderr(&o)
    );
}

#[test]
fn large_fake_batch_continues_as_new_and_says_it_is_a_simulation() {
    let sb = Sandbox::engine();
    let out = sb.out().display().to_string();
    let mut text =
        String::from("batch_id: many\ndefaults:\n  runtime: fake\n  concurrency: 32\ntasks:\n");
    for i in 0..300 {
        text.push_str(&format!("  - task_id: case-{i}\n"));
    }
    let manifest = sb.write("many.yaml", &text);
    let o = sb.run(&[
        "batch",
        "run",
        "--manifest",
        manifest.to_str().unwrap(),
        "--output-dir",
        &out,
        "--history-budget",
        "300",
    ]);
    assert_exit(&o, 0);
    assert!(
        stdout(&o).contains("simulation"),
        "fake runs are named as simulations: {}",
        stdout(&o)
    );
    let status = sb.status("many");
    assert_eq!(status["status"]["counts"]["succeeded"], 300, "{status:#}");
    assert!(
        status["status"]["segment"].as_u64().unwrap() >= 3,
        "continued as new: {status:#}"
    );
    let summary = sb.json(&sb.bundle("many").join("batch_summary.json"));
    assert_eq!(summary["simulated"], true);
    assert_eq!(summary["attempts_total"], 300);
}

#[test]
fn set_concurrency_changes_a_running_batch_at_once_and_invalid_requests_are_refused() {
    let sb = Sandbox::engine();
    let tasks: String = (0..8).map(|i| format!("  - task_id: t{i}\n")).collect();
    let manifest = sb.write(
        "widen.yaml",
        &format!(
            "batch_id: widen\n\
             defaults:\n  concurrency: 2\n  pass_env: [SANDBOX]\n  runtime: local-process\n  \
             harness: 'echo \"$CASEBATCH_CASE_ID\" >> \"$SANDBOX/ran.log\"; \
             while [ ! -e \"$SANDBOX/go\" ]; do sleep 0.05; done; echo \"{{}}\" > \"$CASEBATCH_RESULT\"'\n\
             tasks:\n{tasks}"
        ),
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    wait_until(Duration::from_secs(60), "two cases start", || {
        sb.lines("ran.log") >= 2
    });

    // The batch's validators refuse what makes no sense, and change nothing.
    let o = set_concurrency(&sb, "widen", "0");
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("outside 1..=512"), "{}", stderr(&o));
    let o = sb.op("unpause", "widen");
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("not paused"), "{}", stderr(&o));
    assert_eq!(sb.status("widen")["status"]["concurrency"], 2);

    let o = set_concurrency(&sb, "widen", "6");
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("concurrency 2 → 6"), "{}", stdout(&o));
    wait_until(Duration::from_secs(60), "six cases run", || {
        sb.status("widen")["status"]["counts"]["running"] == 6
    });
    let status = sb.status("widen");
    assert_eq!(status["status"]["concurrency"], 6, "{status:#}");
    assert_eq!(
        sb.lines("ran.log"),
        6,
        "admitted up to the new limit, not past it"
    );
    let timeline = status["status"]["timeline"].to_string();
    assert!(timeline.contains("concurrency 2 → 6"), "{timeline}");

    sb.write("go", "");
    assert_eq!(wait_child(&mut runner, Duration::from_secs(120)), 0);
    assert_eq!(sb.lines("ran.log"), 8, "every case ran once");
}

#[test]
fn an_operation_no_worker_answers_is_sent_as_a_signal_and_applied_when_one_runs_the_batch() {
    let sb = Sandbox::engine();
    let manifest = gated_manifest(&sb, "orphaned");
    let mut runner = sb.spawn_batch(std::path::Path::new(&manifest), "run.log");
    wait_until(Duration::from_secs(60), "first case starts", || {
        sb.lines("ran.log") >= 1
    });
    // The runner hosted the only worker: nothing can answer an update now.
    runner.kill().unwrap();
    runner.wait().unwrap();
    let o = set_concurrency(&sb, "orphaned", "3");
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("sent as a signal"), "{}", stdout(&o));

    // A resume re-attaches to the still-running batch and hosts a worker: the signal applies.
    sb.write("go", "");
    assert_exit(&sb.op("resume", "orphaned"), 0);
    let status = sb.status("orphaned");
    let timeline = status["status"]["timeline"].to_string();
    assert!(timeline.contains("concurrency 1 → 3"), "{timeline}");
    assert_eq!(sb.lines("ran.log"), 4, "every case ran once");
}

/// `casebatch batch set-concurrency --batch-id BATCH LIMIT`.
fn set_concurrency(sb: &Sandbox, batch: &str, limit: &str) -> std::process::Output {
    let out = sb.out();
    let out = out.to_str().unwrap();
    sb.run(&[
        "batch",
        "set-concurrency",
        "--batch-id",
        batch,
        "--output-dir",
        out,
        limit,
    ])
}

#[test]
fn status_shows_what_a_runtime_envelope_holds_back() {
    let sb = Sandbox::engine();
    // A simulated runtime that takes one case at a time; each case would take ten minutes.
    let manifest = sb.write(
        "held.yaml",
        "batch_id: held\n\
         runtimes:\n  sim: {kind: fake, max_concurrent: 1}\n\
         defaults: {runtime: sim, concurrency: 4, fake: {duration_ms: 600000}}\n\
         tasks: [{task_id: a}, {task_id: b}, {task_id: c}, {task_id: d}]\n",
    );
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    // The first case's attempt directory appears once the batch is running on its worker.
    let first = sb.bundle("held").join("cases/a/attempts/1");
    wait_until(Duration::from_secs(60), "the first case starts", || {
        first.exists()
    });
    wait_until(Duration::from_secs(60), "one case runs, three wait", || {
        let s = &sb.status("held")["status"];
        s["envelopes"][0]["running"] == 1 && s["envelopes"][0]["waiting"] == 3
    });
    let s = sb.status("held");
    assert_eq!(s["status"]["counts"]["running"], 1, "{s:#}");
    let out = sb.out();
    let text = sb.run(&[
        "batch",
        "status",
        "--batch-id",
        "held",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(
        stdout(&text).contains("runtime sim: running 1/1 · 0 MB declared · 3 waiting"),
        "{}",
        stdout(&text)
    );
    assert_exit(&sb.op("cancel", "held"), 0);
    assert_eq!(wait_child(&mut runner, Duration::from_secs(120)), 4);
}
