//! Issue 13, the runner-kill chaos test: one batch, the runner (which hosts the worker)
//! SIGKILLed again and again at random moments of progress and resumed each time, as a tester
//! did it. It guards against the replay wedge (`TMPRL1100 Activity type of recorded marker
//! ... does not match ...`, after which every resume re-attaches and nothing moves) and
//! against a finished case running twice; then it exports the history of every run and
//! replays it with the SDK's replayer, checking that each stage activity is issued for the
//! same case and attempt as in the live run (a replay can hand one case another case's result without any error).
//!
//! Reproduce a failure with the seed it prints: `CASEBATCH_CHAOS_SEED=<seed> cargo test
//! --release -p casebatch-cli --test integration -- chaos_kills --nocapture`. The histories
//! of a run are kept under `target/tmp/chaos-<seed>/` for `workflows/tests/replay.rs`.
//! `CASEBATCH_CHAOS_KILLS=N` asks for N kills instead of 20.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use casebatch_proto::{
    AttemptKey, AwaitInput, CleanupInput, ReleaseInput, SettleInput, StartInput,
};
use casebatch_workflows::BatchWorkflow;
use serde_json::Value;
use temporalio_client::WorkflowHistory;
use temporalio_sdk::WorkflowContextView;
use temporalio_sdk::workflow_interceptors::{
    CancellableWorkflowOutboundFuture, ScheduleActivityInput, ScheduleActivityResult,
    WorkflowInterceptor, WorkflowInterceptorConstructor, WorkflowInterceptorContext, WorkflowNext,
};
use temporalio_sdk::workflow_replayer::{WorkflowReplayer, WorkflowReplayerOptions};

use crate::support::*;

const BATCH: &str = "chaos";
/// Each restart adopts a burst of in-flight cases (5-8 per round measured on today's code, at
/// most about `CONCURRENCY`), so the batch must hold enough cases for `MIN_KILLS` rounds of
/// progress: `MIN_KILLS * CONCURRENCY`. A smaller batch (48) completed after ~8 kills.
const CASES: usize = MIN_KILLS * CONCURRENCY as usize;
const CONCURRENCY: u32 = 12;
/// Harness run time per case, drawn from the seed.
const SLEEP_MS: (u64, u64) = (1_000, 3_000);
/// Runner lifetime after the first progress of a round, drawn from the seed.
const KILL_AFTER_MS: (u64, u64) = (200, 1_200);
const MIN_KILLS: usize = 20;
/// A runner that makes no progress for this long is wedged.
const ROUND_DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn chaos_kills_repeated_runner_sigkills_neither_wedge_the_batch_nor_rerun_a_finished_case() {
    let seed = chaos_seed();
    // CASEBATCH_CHAOS_KILLS=0 runs the batch without kills (the export and replay steps alone).
    let min_kills: usize = std::env::var("CASEBATCH_CHAOS_KILLS")
        .map(|k| k.trim().parse().expect("CASEBATCH_CHAOS_KILLS is a number"))
        .unwrap_or(MIN_KILLS);
    println!(
        "chaos seed {seed} (replay this run with CASEBATCH_CHAOS_SEED={seed}); {CASES} cases, concurrency {CONCURRENCY}, at least {min_kills} runner SIGKILLs"
    );
    let sb = Sandbox::engine();
    let keep = kept_dir(seed);
    let mut sleeps = SplitMix64::new(seed);
    let mut delays = SplitMix64::new(seed ^ 0x6b69_6c6c_5f64_656c);
    std::fs::create_dir_all(sb.path("effects")).unwrap();
    let manifest = sb.write("chaos.yaml", &manifest(&mut sleeps));
    let cases: Vec<String> = (0..CASES).map(case_id).collect();
    let bundle = sb.bundle(BATCH);

    let mut kills = 0usize;
    let mut to_progress: Vec<Duration> = Vec::new();
    let mut per_round: Vec<usize> = Vec::new();
    let mut finished_at_kill: BTreeSet<String> = BTreeSet::new();
    let mut completed_early = false;
    let mut round = 0usize;
    while kills < min_kills {
        round += 1;
        let (mut runner, log) = start_runner(&sb, &manifest, round);
        let started = Instant::now();
        match wait_for_progress(&mut runner, &bundle, &cases, &finished_at_kill) {
            Waited::Progress => to_progress.push(started.elapsed()),
            Waited::Exited(0) => {
                // The batch completed before this round saw a new case finish: it was done
                // but for bookkeeping. Nothing left to kill.
                completed_early = true;
                break;
            }
            Waited::Exited(code) => panic!(
                "round {round}: the runner exited {code} before any progress\n{}",
                tail(&log, 50)
            ),
            Waited::Wedged => {
                panic!(
                    "{}",
                    wedge_report(&sb, &keep, &mut runner, &log, round, kills)
                )
            }
        }
        // The chaos itself: a seeded random lifetime, not a synchronization.
        let delay = Duration::from_millis(delays.between(KILL_AFTER_MS));
        std::thread::sleep(delay);
        if let Some(status) = runner.try_wait().unwrap() {
            if status.code() == Some(0) {
                completed_early = true;
                break;
            }
            panic!(
                "round {round}: the runner exited {status}\n{}",
                tail(&log, 50)
            );
        }
        let in_flight = in_flight(&sb, &cases);
        runner.kill().unwrap(); // SIGKILL, the whole runner; its engine lives on
        runner.wait().unwrap();
        kills += 1;
        // The harnesses run in their own process groups, outside the runner: the kill
        // must leave each of them running (or done by itself, with its `finished` line).
        for (case, attempt, pid) in &in_flight {
            let ok = alive(*pid) || effects(&sb, case).iter().any(|e| e.is_finish_of(*attempt));
            assert!(
                ok,
                "round {round}: harness of {case} (attempt {attempt}, pid {pid}) died with the runner and never finished: effects {:?}",
                effects(&sb, case)
            );
        }
        let now = finished_cases(&bundle, &cases);
        per_round.push(now.len().saturating_sub(finished_at_kill.len()));
        println!(
            "round {round:02} ({}): progress after {:.1}s, SIGKILL {}ms later; {}/{CASES} cases finished, {} harness(es) in flight survived",
            if round == 1 { "run" } else { "resume" },
            to_progress.last().unwrap().as_secs_f64(),
            delay.as_millis(),
            now.len(),
            in_flight.len()
        );
        finished_at_kill = now;
        if finished_at_kill.len() == CASES {
            break;
        }
    }

    // The final resume runs the batch to the end, with the same wedge guard.
    round += 1;
    let (mut runner, log) = start_runner(&sb, &manifest, round);
    let started = Instant::now();
    let mut known = finished_at_kill.clone();
    let code = loop {
        match wait_for_progress(&mut runner, &bundle, &cases, &known) {
            Waited::Progress => {
                if known == finished_at_kill && !completed_early {
                    to_progress.push(started.elapsed());
                }
                known = finished_cases(&bundle, &cases);
            }
            Waited::Exited(code) => break code,
            Waited::Wedged => {
                panic!(
                    "{}",
                    wedge_report(&sb, &keep, &mut runner, &log, round, kills)
                )
            }
        }
    };
    assert_eq!(
        code,
        0,
        "the final resume (round {round}) did not complete the batch\n{}",
        tail(&log, 50)
    );

    // Figures: workflow counters, side effects, restart-to-progress times.
    let status = sb.status(BATCH);
    let counters = &status["status"]["counters"];
    let adopted = counters["adopted"].as_u64().unwrap_or(0);
    let redispatched = counters["redispatched"].as_u64().unwrap_or(0);
    // (Not `batch report --json`: for this many cases it outgrows the pipe `Sandbox::run` reads
    // only at exit. finalize wrote the same summary into the bundle.)
    let summary = sb.json(&bundle.join("batch_summary.json"));
    let (extra_starts, reruns) = tally(&sb, &cases);
    to_progress.sort();
    let max = to_progress.last().copied().unwrap_or_default();
    let median = to_progress
        .get(to_progress.len() / 2)
        .copied()
        .unwrap_or_default();
    println!(
        "CHAOS FIGURES seed={seed} kills={kills} adopted={adopted} redispatched={redispatched} extra_starts={extra_starts} restart_to_progress max={:.1}s median={:.1}s cases_per_round={per_round:?}",
        max.as_secs_f64(),
        median.as_secs_f64()
    );

    for case in &cases {
        let r = sb.case_result(BATCH, case);
        assert_eq!(r["state"], "succeeded", "{case}: {r:#}");
        assert_eq!(r["outputs"]["case"], case.as_str(), "{case}: {r:#}");
    }
    assert_eq!(
        summary["counts"]["succeeded"], CASES,
        "batch_summary.json: {summary:#}"
    );
    assert!(
        reruns.is_empty(),
        "finished cases ran again (a `started` after the case's first `finished`), seed {seed}:\n{}",
        reruns.join("\n")
    );
    assert!(
        extra_starts as u64 <= redispatched,
        "{extra_starts} harness start(s) beyond one per case, but the workflow re-dispatched only {redispatched} job(s) (adopted {adopted}; bundle: {} adopted attempt(s)), seed {seed}",
        summary["adopted_attempts"]
    );

    // Every run of the workflow replays against the current code, and each stage goes to
    // the case it went to live.
    let runs = export_runs(&sb, &keep);
    assert!(!runs.is_empty(), "no history exported");
    let mut failures = Vec::new();
    for (i, (run_id, json)) in runs.iter().enumerate() {
        match replay(json) {
            Ok(n) => {
                println!("run {i} ({run_id}): replayed {n} stage activities deterministically")
            }
            Err(e) => failures.push(format!("run {i} ({run_id}): {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "the histories do not replay (kept in {}), seed {seed}:\n{}",
        keep.display(),
        failures.join("\n")
    );
    assert!(
        kills >= min_kills,
        "the batch completed after only {kills} kill(s) (fewer than {min_kills}): too few cases for the chaos rounds, seed {seed}"
    );
}

/// The replay check itself: the recorded histories of `workflows/tests/histories` replay and
/// each of their stage activities is issued for the case it went to live (no engine needed).
#[test]
fn chaos_kills_replay_check_accepts_the_recorded_histories() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/tests/histories");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let json = std::fs::read(&path).unwrap();
            // A runtime's breaker schedules no stage activities (replay.rs replays it).
            if workflow_type(&json).as_deref() != Some("BatchWorkflow") {
                continue;
            }
            let stages = replay(&json).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(stages > 0, "{}: no stage activity checked", path.display());
            checked += 1;
        }
    }
    assert!(checked > 0, "no history in {}", dir.display());
}

// --- the batch -----------------------------------------------------------------------------

fn case_id(i: usize) -> String {
    format!("k{i:03}")
}

/// The harness appends `started <case> <attempt> <pid>` to a side-effect file outside the
/// bundle, sleeps its case's time, writes its result, then appends `finished ...`.
fn manifest(rng: &mut SplitMix64) -> String {
    let mut m = format!(
        r#"batch_id: {BATCH}
defaults:
  concurrency: {CONCURRENCY}
  max_retries: 1
  timeout_seconds: 120
  runtime: local-process
  pass_env: [SANDBOX]
  harness: |
    e="$SANDBOX/effects/$CASEBATCH_CASE_ID.log"
    echo "started $CASEBATCH_CASE_ID $CASEBATCH_ATTEMPT $$" >> "$e"
    s=$(sed -n 's/.*"sleep_s": *"\([0-9.]*\)".*/\1/p' "$CASEBATCH_INPUT")
    sleep "${{s:-2}}"
    printf '{{"outputs": {{"case": "%s"}}, "scores": {{"ok": 1}}}}' "$CASEBATCH_CASE_ID" > "$CASEBATCH_RESULT"
    echo "finished $CASEBATCH_CASE_ID $CASEBATCH_ATTEMPT $$" >> "$e"
tasks:
"#
    );
    for i in 0..CASES {
        let ms = rng.between(SLEEP_MS);
        m.push_str(&format!(
            "  - {{task_id: {}, inputs: {{sleep_s: \"{}.{:03}\"}}}}\n",
            case_id(i),
            ms / 1000,
            ms % 1000
        ));
    }
    m
}

fn start_runner(sb: &Sandbox, manifest: &Path, round: usize) -> (Child, PathBuf) {
    let out = sb.out();
    let out = out.to_str().unwrap();
    let name = format!("round-{round:02}.log");
    let args: Vec<&str> = if round == 1 {
        vec![
            "batch",
            "run",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            out,
        ]
    } else {
        vec!["batch", "resume", "--batch-id", BATCH, "--output-dir", out]
    };
    // The SDK's warnings (a failing workflow task says why) go to the runner's log.
    let child = sb.spawn_env(&args, &name, &[("CASEBATCH_LOG", "warn")]);
    (child, sb.path(&name))
}

enum Waited {
    /// A case finished that had not when the round began.
    Progress,
    Exited(i32),
    Wedged,
}

/// Polls the bundle's per-case results (written by the last stage, so through the workflow,
/// unlike the harness's own lines) until a case not in `known` has finished.
fn wait_for_progress(
    runner: &mut Child,
    bundle: &Path,
    cases: &[String],
    known: &BTreeSet<String>,
) -> Waited {
    let start = Instant::now();
    loop {
        let exited = runner.try_wait().unwrap();
        if finished_cases(bundle, cases)
            .iter()
            .any(|c| !known.contains(c))
        {
            return Waited::Progress;
        }
        if let Some(s) = exited {
            return Waited::Exited(s.code().unwrap_or(-1));
        }
        if start.elapsed() > ROUND_DEADLINE {
            return Waited::Wedged;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Cases whose current result is terminal.
fn finished_cases(bundle: &Path, cases: &[String]) -> BTreeSet<String> {
    cases
        .iter()
        .filter(|c| {
            std::fs::read(bundle.join("cases").join(c).join("result.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|v| {
                    matches!(
                        v["state"].as_str(),
                        Some("succeeded" | "failed" | "cancelled")
                    )
                })
        })
        .cloned()
        .collect()
}

#[derive(Debug)]
struct Effect {
    started: bool,
    attempt: u32,
    pid: u32,
}

impl Effect {
    fn is_finish_of(&self, attempt: u32) -> bool {
        !self.started && self.attempt == attempt
    }
}

fn effects(sb: &Sandbox, case: &str) -> Vec<Effect> {
    let text = std::fs::read_to_string(sb.path(&format!("effects/{case}.log"))).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Effect {
                started: match *f.first()? {
                    "started" => true,
                    "finished" => false,
                    _ => return None,
                },
                attempt: f.get(2)?.parse().ok()?,
                pid: f.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

/// Harnesses started and not (yet) finished: (case, attempt, pid).
fn in_flight(sb: &Sandbox, cases: &[String]) -> Vec<(String, u32, u32)> {
    let mut v = Vec::new();
    for case in cases {
        let e = effects(sb, case);
        for s in e.iter().filter(|e| e.started) {
            if !e.iter().any(|f| f.is_finish_of(s.attempt)) {
                v.push((case.clone(), s.attempt, s.pid));
            }
        }
    }
    v
}

/// Harness starts beyond the first of each case, and the cases that started again after they
/// had finished (with their effect lines).
fn tally(sb: &Sandbox, cases: &[String]) -> (usize, Vec<String>) {
    let mut extra = 0usize;
    let mut reruns = Vec::new();
    for case in cases {
        let e = effects(sb, case);
        extra += e.iter().filter(|e| e.started).count().saturating_sub(1);
        if let Some(first_finish) = e.iter().position(|e| !e.started)
            && e[first_finish..].iter().any(|e| e.started)
        {
            let lines: Vec<String> = e
                .iter()
                .map(|e| {
                    let what = if e.started { "started" } else { "finished" };
                    format!("{what} attempt {} pid {}", e.attempt, e.pid)
                })
                .collect();
            reruns.push(format!("{case}: {}", lines.join(", ")));
        }
    }
    (extra, reruns)
}

// --- when it wedges ------------------------------------------------------------------------

/// Everything a wedge report needs: the round, the runner's last words, why the workflow
/// tasks fail (from the history), and what the offline replay says.
fn wedge_report(
    sb: &Sandbox,
    keep: &Path,
    runner: &mut Child,
    log: &Path,
    round: usize,
    kills: usize,
) -> String {
    let _ = runner.kill();
    let _ = runner.wait();
    let cases: Vec<String> = (0..CASES).map(case_id).collect();
    let finished = finished_cases(&sb.bundle(BATCH), &cases);
    let (extra_starts, reruns) = tally(sb, &cases);
    let mut report = format!(
        "WEDGE: round {round} (after {kills} kill(s)) made no progress in {ROUND_DEADLINE:?}; {}/{CASES} cases finished; so far {extra_starts} extra harness start(s), {} finished case(s) started again:\n{}\n--- last 50 lines of {} ---\n{}\n",
        finished.len(),
        reruns.len(),
        reruns.join("\n"),
        log.display(),
        tail(log, 50)
    );
    let runs = export_runs(sb, keep);
    for (i, (run_id, json)) in runs.iter().enumerate() {
        let h: Value = serde_json::from_slice(json).unwrap_or_default();
        let mut failed: BTreeMap<String, usize> = BTreeMap::new();
        for e in h["events"].as_array().into_iter().flatten() {
            if let Some(m) =
                e["attributes"]["WorkflowTaskFailedEventAttributes"]["failure"]["message"].as_str()
            {
                *failed.entry(m.chars().take(400).collect()).or_default() += 1;
            }
        }
        report.push_str(&format!(
            "--- run {i} ({run_id}): {} workflow task failure(s) in its history ---\n",
            failed.values().sum::<usize>()
        ));
        for (m, n) in failed.iter().take(5) {
            report.push_str(&format!("  {n}x {m}\n"));
        }
        report.push_str(&format!(
            "  offline replay: {}\n",
            match replay(json) {
                Ok(n) => format!("ok ({n} stage activities)"),
                Err(e) => e,
            }
        ));
    }
    report.push_str(&format!("histories kept in {}\n", keep.display()));
    report
}

// --- histories and replay ------------------------------------------------------------------

/// Where a run's histories are kept (the sandbox is deleted with the test).
fn kept_dir(seed: u64) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Exports the history of every run of the batch's workflow, oldest first: the latest run,
/// then back along `continued_execution_run_id` (continue-as-new; a resume of a running batch
/// re-attaches to its run).
fn export_runs(sb: &Sandbox, keep: &Path) -> Vec<(String, Vec<u8>)> {
    let out = sb.out();
    let mut runs = Vec::new();
    let mut run_id: Option<String> = None;
    for i in 0..50 {
        let file = keep.join(format!("history-{i:02}.json"));
        let mut args = vec![
            "batch",
            "history",
            "--batch-id",
            BATCH,
            "--output-dir",
            out.to_str().unwrap(),
            "--out",
            file.to_str().unwrap(),
        ];
        if let Some(r) = &run_id {
            args.extend(["--run-id", r.as_str()]);
        }
        let o = sb.run(&args);
        assert_exit(&o, 0);
        let json = std::fs::read(&file).unwrap();
        let h: Value = serde_json::from_slice(&json).expect("history JSON");
        let started = &h["events"][0]["attributes"]["WorkflowExecutionStartedEventAttributes"];
        let this = run_id
            .clone()
            .or_else(|| {
                started["original_execution_run_id"]
                    .as_str()
                    .map(String::from)
            })
            .unwrap_or_else(|| "latest".into());
        runs.push((this, json));
        match started["continued_execution_run_id"].as_str() {
            Some(prev) if !prev.is_empty() => run_id = Some(prev.to_string()),
            _ => break,
        }
    }
    runs.reverse();
    runs
}

/// Replays one history with the SDK's replayer. Besides nondeterminism errors, checks that
/// every regular activity (`start`, `settle`, `cleanup`; the legacy `await`) is issued for the
/// same case and attempt as in the live
/// run: replay matches activities by sequence number and type only, never by input.
/// Returns the number of activities checked.
fn replay(json: &[u8]) -> Result<usize, String> {
    let live = scheduled_activities(json);
    let replayed: Arc<Mutex<Vec<Scheduled>>> = Arc::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(async {
        let recorder = replayed.clone();
        let options = WorkflowReplayerOptions::new()
            .register_workflow::<BatchWorkflow>()
            .expect("BatchWorkflow registers")
            .workflow_interceptor(WorkflowInterceptorConstructor::new(
                move |_: &WorkflowContextView| {
                    // A new workflow instance replays from the start.
                    recorder.lock().unwrap().clear();
                    ActivityRecorder(recorder.clone())
                },
            ))
            .build();
        let replayer = WorkflowReplayer::new(options).map_err(|e| e.to_string())?;
        let history = WorkflowHistory::from_json(json).map_err(|e| e.to_string())?;
        replayer
            .replay_workflow(history)
            .await
            .map_err(|e| e.to_string())
    });
    let replayed = replayed.lock().unwrap().clone();
    let diverged = live
        .iter()
        .zip(replayed.iter())
        .position(|(l, r)| l != r)
        .map(|i| {
            format!(
                "activity #{i} was scheduled live as {:?} but replay issued {:?}",
                live[i], replayed[i]
            )
        });
    match (outcome, diverged) {
        (Ok(()), None) if replayed.len() == live.len() => Ok(live.len()),
        (Ok(()), None) => Err(format!(
            "replay issued {} activities, the live run {}",
            replayed.len(),
            live.len()
        )),
        (Ok(()), Some(d)) => Err(format!("silent case mix-up: {d}")),
        (Err(e), d) => Err(format!(
            "{e}{}",
            d.map(|d| format!(" (and before that: {d})"))
                .unwrap_or_default()
        )),
    }
}

/// One scheduled regular activity: its type, and the case and attempt it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scheduled {
    activity: String,
    case: Option<(u32, u32)>,
}

/// The live run's scheduled activities, in history order.
/// The workflow type a recorded history is of.
fn workflow_type(json: &[u8]) -> Option<String> {
    let h: Value = serde_json::from_slice(json).ok()?;
    let started = &h["events"][0]["attributes"]["WorkflowExecutionStartedEventAttributes"];
    Some(started["workflow_type"]["name"].as_str()?.to_string())
}

fn scheduled_activities(json: &[u8]) -> Vec<Scheduled> {
    let h: Value = serde_json::from_slice(json).unwrap_or_default();
    h["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let a = &e["attributes"]["ActivityTaskScheduledEventAttributes"];
            let activity = a["activity_type"]["name"].as_str()?.to_string();
            let input = a["input"]["payloads"][0]["data"]
                .as_str()
                .and_then(base64_decode)
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
            // `start` and `prepare` take the attempt key itself; `settle`, `cleanup`,
            // `release` and the legacy `await` carry it as `key`.
            let case = input.and_then(|v| {
                let key = if v.get("key").is_some() {
                    &v["key"]
                } else {
                    &v
                };
                Some((
                    key["case_index"].as_u64()? as u32,
                    key["attempt"].as_u64()? as u32,
                ))
            });
            Some(Scheduled { activity, case })
        })
        .collect()
}

/// Records the regular activities a replay schedules, in order.
struct ActivityRecorder(Arc<Mutex<Vec<Scheduled>>>);

impl WorkflowInterceptor for ActivityRecorder {
    fn schedule_activity(
        &self,
        _ctx: WorkflowInterceptorContext,
        input: ScheduleActivityInput,
        next: WorkflowNext<
            'static,
            ScheduleActivityInput,
            CancellableWorkflowOutboundFuture<ScheduleActivityResult>,
        >,
    ) -> CancellableWorkflowOutboundFuture<ScheduleActivityResult> {
        let key = input
            .input_ref::<AttemptKey>()
            .or_else(|| input.input_ref::<StartInput>().map(StartInput::key))
            .or_else(|| input.input_ref::<SettleInput>().map(|i| &i.key))
            .or_else(|| input.input_ref::<CleanupInput>().map(|i| &i.key))
            .or_else(|| input.input_ref::<AwaitInput>().map(|i| &i.key))
            .or_else(|| input.input_ref::<ReleaseInput>().map(|i| &i.key));
        let case = key.map(|k| (k.case_index, k.attempt));
        self.0.lock().unwrap().push(Scheduled {
            activity: input.activity_type().to_string(),
            case,
        });
        next.run(input)
    }
}

/// Standard base64 (with padding), as the history's JSON carries payloads.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

// --- seeded randomness ---------------------------------------------------------------------

/// `CASEBATCH_CHAOS_SEED` when set (decimal or 0x-hex), else a fresh one.
fn chaos_seed() -> u64 {
    if let Ok(s) = std::env::var("CASEBATCH_CHAOS_SEED") {
        let s = s.trim();
        let parsed = match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => s.parse(),
        };
        return parsed.unwrap_or_else(|e| panic!("CASEBATCH_CHAOS_SEED={s:?}: {e}"));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    SplitMix64::new(nanos ^ u64::from(std::process::id())).next_u64() % 1_000_000_000
}

/// SplitMix64: tiny, and the same numbers for the same seed everywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (the modulo bias is irrelevant here).
    fn between(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}
