//! The numbers about time stay true when the worker's wall clock steps or the engine stalls:
//! a job's deadline is measured on the host's boot clock (a wall-clock step moves none), a job
//! that ended before its deadline is never a timeout however long nobody looked, and an
//! attempt's record is on one clock (the engine's), its stages' durations measured on one that
//! does not step, adding up to the attempt's duration.
//!
//! The worker's clock is stepped with libfaketime (Debian's `faketime`) preloaded into the
//! runner, its offset read from a file the test rewrites mid-batch; the dev server (a Go
//! program, which reads the clock without libc) and the harnesses (started with a clean
//! environment) keep the real clock.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The preload that steps the runner's wall clock by what `offset_file` says, or `None` (the
/// test is skipped with a notice) where libfaketime is not installed, unless
/// `CASEBATCH_REQUIRE_FAKETIME` is set (CI sets it).
fn faketime(test: &str, offset_file: &Path) -> Option<Vec<(&'static str, String)>> {
    if !Path::new(LIBFAKETIME).exists() {
        assert!(
            std::env::var_os("CASEBATCH_REQUIRE_FAKETIME").is_none(),
            "{test}: libfaketime is not installed and CASEBATCH_REQUIRE_FAKETIME is set"
        );
        eprintln!("SKIPPED {test}: no libfaketime (Debian: apt-get install faketime)");
        return None;
    }
    std::fs::write(offset_file, "+0\n").unwrap();
    Some(vec![
        ("LD_PRELOAD", LIBFAKETIME.to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset_file.display().to_string()),
        // Read on every call: the step lands when the test writes it.
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ])
}

fn manifest(batch: &str, harness: &str, timeout_s: u64) -> String {
    cases(batch, 8, harness, timeout_s)
}

fn cases(batch: &str, n: usize, harness: &str, timeout_s: u64) -> String {
    let tasks: String = (0..n).map(|i| format!("  - task_id: c{i}\n")).collect();
    format!(
        "batch_id: {batch}\n\
         defaults:\n  \
           runtime: local-process\n  \
           concurrency: 8\n  \
           max_retries: 0\n  \
           timeout_seconds: {timeout_s}\n  \
           pass_env: [SANDBOX]\n  \
           harness: 'echo \"$CASEBATCH_CASE_ID\" >> \"$SANDBOX/runs\"; {harness}; echo \"{{}}\" > \"$CASEBATCH_RESULT\"'\n\
         tasks:\n{tasks}"
    )
}

/// The attempt's record: its summary and its stages.
fn record(sb: &Sandbox, batch: &str, case: &str) -> Value {
    sb.recorded(batch, case, 1, "record")
}

/// The attempt's duration, on its record's one clock.
fn duration_ms(record: &Value) -> u64 {
    let s = &record["summary"];
    let (start, end) = (
        s["started_at_ms"].as_u64().unwrap(),
        s["ended_at_ms"].as_u64().unwrap(),
    );
    assert!(
        end >= start,
        "an attempt ended before it started: {record:#}"
    );
    end - start
}

fn runs(sb: &Sandbox) -> usize {
    sb.read("runs").lines().count()
}

#[test]
fn a_wall_clock_stepped_an_hour_forward_times_out_no_job_and_stretches_no_duration() {
    let sb = Sandbox::engine();
    let offset = sb.path("clock-offset");
    let Some(env) = faketime("clocks::forward", &offset) else {
        return;
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let m = sb.write("forward.yaml", &manifest("forward", "sleep 10", 120));
    let mut runner = sb.spawn_batch_with_env(&m, "runner.log", &env);
    wait_until(Duration::from_secs(60), "8 jobs running", || runs(&sb) == 8);
    std::fs::write(&offset, "+1h\n").unwrap();
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        0,
        "{}",
        tail(&sb.path("runner.log"), 30)
    );
    assert_eq!(runs(&sb), 8, "one start per case");
    for i in 0..8 {
        let case = format!("c{i}");
        assert_eq!(sb.case_result("forward", &case)["state"], "succeeded");
        let r = record(&sb, "forward", &case);
        let ms = duration_ms(&r);
        assert!(
            (10_000..=15_000).contains(&ms),
            "{case}: {ms} ms for a 10 s job: {r:#}"
        );
        for stage in r["stages"].as_array().unwrap() {
            let d = stage["duration_ms"].as_u64().unwrap();
            assert!(d <= 15_000, "{case}: a stage of {d} ms: {r:#}");
        }
    }
}

#[test]
fn a_wall_clock_stepped_an_hour_back_keeps_every_timeout() {
    let sb = Sandbox::engine();
    let offset = sb.path("clock-offset");
    let Some(env) = faketime("clocks::back", &offset) else {
        return;
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let m = sb.write("back.yaml", &manifest("back", "sleep 40", 20));
    let mut runner = sb.spawn_batch_with_env(&m, "runner.log", &env);
    wait_until(Duration::from_secs(60), "8 jobs running", || runs(&sb) == 8);
    std::fs::write(&offset, "-1h\n").unwrap();
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        4,
        "{}",
        tail(&sb.path("runner.log"), 30)
    );
    for i in 0..8 {
        let case = format!("c{i}");
        let result = sb.case_result("back", &case);
        assert_eq!(result["failure"]["code"], "TIMEOUT", "{result:#}");
        let ms = duration_ms(&record(&sb, "back", &case));
        assert!(
            (20_000..=26_000).contains(&ms),
            "{case}: timed out after {ms} ms"
        );
    }
}

/// The engine frozen past the jobs' timeout while they run and end: when it answers again,
/// each job's recorded end is read before its deadline, so none is a timeout and none runs
/// again. (The drill of the issue, scaled down: 60 s frozen, jobs of 10 s, a 30 s timeout.)
#[test]
fn jobs_that_end_while_the_engine_is_frozen_past_their_timeout_are_not_timeouts() {
    let sb = Sandbox::engine();
    let m = sb.write("stall.yaml", &manifest("stall", "sleep 10", 30));
    let mut runner = sb.spawn_batch(&m, "runner.log");
    wait_until(Duration::from_secs(60), "8 jobs running", || runs(&sb) == 8);
    let engine = engine_record(&sb.out()).expect("engine.json");
    let pid = engine["pid"].as_u64().unwrap() as u32;
    // The point is the time passing frozen: past every job's end and every deadline.
    freeze(pid, 60, || {});
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(180)),
        0,
        "{}",
        tail(&sb.path("runner.log"), 30)
    );
    assert_eq!(runs(&sb), 8, "8 starts for 8 cases");
    for i in 0..8 {
        assert_eq!(
            sb.case_result("stall", &format!("c{i}"))["state"],
            "succeeded"
        );
    }
}

#[test]
fn an_attempt_s_stages_add_up_to_its_duration_the_start_s_watch_included() {
    let sb = Sandbox::engine();
    let m = sb.write("sum.yaml", &cases("sum", 1, "sleep 20", 120));
    assert_exit(&sb.run_batch(&m), 0);
    let r = record(&sb, "sum", "c0");
    let total = duration_ms(&r);
    let stages = r["stages"].as_array().unwrap();
    let sum: u64 = stages
        .iter()
        .map(|s| s["duration_ms"].as_u64().unwrap())
        .sum();
    assert!(
        total.abs_diff(sum) <= 1_000,
        "stages sum to {sum} ms, the attempt took {total} ms: {r:#}"
    );
    let waits: Vec<&Value> = stages.iter().filter(|s| s["stage"] == "await").collect();
    let waited: u64 = waits
        .iter()
        .map(|s| s["duration_ms"].as_u64().unwrap())
        .sum();
    assert!(
        waits.len() >= 2 && waited >= 19_000,
        "the start's watch and settle's wait are both there: {r:#}"
    );
    let report = sb.json(&sb.bundle("sum").join("batch_summary.json"));
    let await_p50 = report["stats"]["stage_durations"]["await"]["p50_ms"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        await_p50 >= 19_000,
        "the report's await is the whole wait: {report:#}"
    );
}

/// The same step on an agent's host: its jobs' deadlines are on its boot clock too.
#[test]
fn an_agent_s_wall_clock_stepped_an_hour_forward_times_out_none_of_its_jobs() {
    let sb = Sandbox::engine();
    let offset = sb.path("clock-offset");
    let Some(env) = faketime("clocks::agent_forward", &offset) else {
        return;
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let port = free_port();
    let data = sb.path("agent-data");
    let (listen, data_arg) = (format!("127.0.0.1:{port}"), data.display().to_string());
    let mut agent = sb.spawn_env(
        &["agent", "--listen", &listen, "--data-dir", &data_arg],
        "agent.log",
        &env,
    );
    wait_until(Duration::from_secs(30), "the agent listens", || {
        data.join("agent.addr").exists()
    });
    let m = sb.write(
        "agent.yaml",
        &manifest("agent", "sleep 10", 120)
            .replace(
                "defaults:\n",
                &format!(
                    "runtimes: {{box: {{kind: agent, endpoint: 'http://{listen}'}}}}\ndefaults:\n"
                ),
            )
            .replace("runtime: local-process", "runtime: box"),
    );
    let mut runner = sb.spawn_batch(&m, "runner.log");
    wait_until(Duration::from_secs(60), "8 jobs running", || runs(&sb) == 8);
    std::fs::write(&offset, "+1h\n").unwrap();
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        0,
        "{}\n{}",
        tail(&sb.path("runner.log"), 30),
        tail(&sb.path("agent.log"), 30)
    );
    assert_eq!(runs(&sb), 8, "one start per case");
    for i in 0..8 {
        assert_eq!(
            sb.case_result("agent", &format!("c{i}"))["state"],
            "succeeded"
        );
    }
    let _ = agent.kill();
    let _ = agent.wait();
}
