//! The evaluator: a command that observes the actor's effect and writes
//! `{"verdict": "pass"|"fail", "scores": {...}}` to `CASEBATCH_RESULT`. It runs where the actor
//! ran and under the attempt's control, like the actor: it joins the attempt's cgroups (the
//! tracking one and the memory one, named in the job record) before it runs, so cleanup's kill and
//! receipt cover it and everything it starts, and its memory counts against the attempt's
//! limit; it runs in the attempt's working directory with the harness's environment allowlist
//! ([`crate::case_env`]). On an agent, the agent runs it with this same code.
//!
//! Its result is untrusted input, read like the harness's ([`attempt_io`]), and the record it
//! becomes crosses the agent's wire as typed fields ([`to_wire`], [`from_wire`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use casebatch_bundle::{EvaluationRecord, RECORD_SCHEMA_VERSION, layout::attempt_files};
use casebatch_manifest::model::FakeOutcome;
use casebatch_proto::runtime_v1 as wire;
use casebatch_proto::{Evaluation, Failure, FailureCode, JobRef, Stage, Verdict};
use serde::Deserialize;
use tokio::process::{Child, Command};

use crate::local_process::{JobRecord, LocalProcess};
use crate::memlimit::MemoryLimit;
use crate::scratch::Scratch;
use crate::{Attempt, Liveness, OnCancel, attempt_io, cgroup::Tracking, procfs};

/// Joins the attempt's cgroups (`:`-separated `cgroup.procs` files), then becomes the
/// evaluator (`exec`): it is a member before any of its code runs, and so is all it starts.
const JOIN: &str = r#"
if [ -n "$CASEBATCH_CGROUP_PROCS" ]; then
  IFS=:; for procs in $CASEBATCH_CGROUP_PROCS; do
    echo $$ > "$procs" || { echo "casebatch: cannot join the attempt's cgroup ($procs)" >&2; exit 96; }
  done; unset IFS
fi
unset CASEBATCH_CGROUP_PROCS
exec "$@"
"#;
/// The exit status of [`JOIN`] when a cgroup could not be joined.
const JOIN_FAILED: i32 = 96;

/// How often the wait looks at the clock, the memory and the liveness.
const TICK: Duration = Duration::from_millis(200);
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
struct EvaluatorOutput {
    verdict: String,
    #[serde(default)]
    scores: BTreeMap<String, serde_json::Value>,
}

fn eval_failure(message: String) -> Failure {
    Failure::harness(Stage::Evaluate, FailureCode::EvaluatorFailed, message)
}

/// The record of a case with no evaluator.
pub fn not_configured() -> EvaluationRecord {
    EvaluationRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        configured: false,
        verdict: None,
        scores: BTreeMap::new(),
        failure: None,
        exit_code: None,
    }
}

/// The record of an evaluation that gave no verdict.
pub fn failed(failure: Failure) -> EvaluationRecord {
    EvaluationRecord {
        configured: true,
        failure: Some(failure),
        ..not_configured()
    }
}

/// The simulated evaluator of the `fake` runtime.
pub fn simulated(outcome: FakeOutcome) -> EvaluationRecord {
    EvaluationRecord {
        configured: true,
        verdict: Some(if outcome == FakeOutcome::Fail {
            Verdict::Fail
        } else {
            Verdict::Pass
        }),
        ..not_configured()
    }
}

/// What the workflow needs of an evaluation record.
pub fn to_evaluation(r: &EvaluationRecord) -> Evaluation {
    // A fail verdict is an agent outcome, carried as a failure so reports break it down.
    let failure = r.failure.clone().or_else(|| {
        (r.verdict == Some(Verdict::Fail))
            .then(|| Failure::agent("the evaluator's verdict is fail"))
    });
    Evaluation {
        configured: r.configured,
        verdict: r.verdict,
        failure,
    }
}

/// The record as the agent sends it.
pub fn to_wire(job_key: &str, r: &EvaluationRecord) -> wire::Evaluation {
    wire::Evaluation {
        job_key: job_key.to_string(),
        configured: r.configured,
        verdict: match r.verdict {
            None => wire::Verdict::Unspecified,
            Some(Verdict::Pass) => wire::Verdict::Pass,
            Some(Verdict::Fail) => wire::Verdict::Fail,
        } as i32,
        // A score is any JSON value the evaluator chose: kept as its own JSON text, so `1`
        // stays `1` (not `1.0`) in the bundle.
        scores_json: r
            .scores
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
        failure: r.failure.as_ref().map(Into::into),
        exit_code: r.exit_code,
    }
}

/// The record an agent sent; `Err` says what of it is unusable.
pub fn from_wire(e: wire::Evaluation) -> Result<EvaluationRecord, String> {
    let verdict = match wire::Verdict::try_from(e.verdict) {
        Ok(wire::Verdict::Unspecified) => None,
        Ok(wire::Verdict::Pass) => Some(Verdict::Pass),
        Ok(wire::Verdict::Fail) => Some(Verdict::Fail),
        Err(_) => return Err(format!("unknown verdict {}", e.verdict)),
    };
    let scores = e
        .scores_json
        .into_iter()
        .map(|(k, v)| match serde_json::from_str(&v) {
            Ok(value) => Ok((k, value)),
            Err(err) => Err(format!("score {k:?} is not JSON: {err}")),
        })
        .collect::<Result<_, _>>()?;
    Ok(EvaluationRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        configured: e.configured,
        verdict,
        scores,
        failure: e.failure.map(TryInto::try_into).transpose()?,
        exit_code: e.exit_code,
    })
}

/// The attempt's cgroups, memory limit and scratch space, as its job record names them;
/// without a record (a start known only by its traces), its cgroup found by name, no memory
/// limit and this host's scratch path.
fn controls(env: &Attempt) -> (Tracking, MemoryLimit, Scratch) {
    let job = LocalProcess::read_job(env);
    let scratch = JobRecord::scratch_of(job.as_ref(), env);
    match job {
        Some(JobRecord {
            tracking, memory, ..
        }) => (tracking, memory, scratch),
        None => (
            crate::local_process::tracking_of(env, None),
            MemoryLimit::None,
            scratch,
        ),
    }
}

/// How the evaluator's wait ended, when it did not end by itself.
enum Stopped {
    Timeout,
    OverMemory,
    /// The caller's liveness asked for a kill (an agent's cleanup).
    Cancelled,
}

/// Runs the case's evaluator on this host, under the attempt's control (see the module doc).
pub(crate) async fn run_local<L: Liveness>(
    env: &Attempt,
    job: &JobRef,
    live: &L,
) -> EvaluationRecord {
    let Some(command) = env.job.evaluator.as_ref().filter(|c| !c.argv.is_empty()) else {
        return not_configured();
    };
    let stopping = || live.on_cancel() == OnCancel::Kill && live.is_cancelled();
    if stopping() {
        return failed(stopped_by_cleanup());
    }
    let (tracking, memory, scratch) = controls(env);
    let mut child = match spawn(env, command, &tracking, &memory, &scratch) {
        Ok(c) => c,
        Err(f) => return failed(f),
    };
    // The evaluator's group: it leads it (`process_group(0)`), and the unreaped child's pid
    // cannot be reused, so the group is ours to signal.
    let group = child.id();
    if let Some(pid) = group
        && let Some(ticks) = procfs::start_ticks(pid)
    {
        crate::spawned::record(pid, ticks, &env.process_marker());
    }
    let ooms_before = memory.oom_kills();
    let rss_limit = match memory {
        MemoryLimit::RssPoll { limit_mb } => Some(limit_mb * 1024 * 1024),
        _ => None,
    };
    let timeout = Duration::from_secs(env.job.timeout_seconds.max(1));
    let deadline = Instant::now() + timeout;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_beat: Option<Instant> = None;
    let ended = loop {
        tokio::select! {
            status = child.wait() => break Ok(status),
            _ = tick.tick() => {
                if last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY) {
                    live.heartbeat(job).await;
                    last_beat = Some(Instant::now());
                }
                if stopping() {
                    break Err(Stopped::Cancelled);
                }
                if Instant::now() >= deadline {
                    break Err(Stopped::Timeout);
                }
                if let Some(limit) = rss_limit {
                    let members = tracking
                        .members()
                        .unwrap_or_else(|| procfs::scan_marker(&env.process_marker()).marked);
                    let used: u64 = members.iter().filter_map(|p| procfs::rss_bytes(*p)).sum();
                    if used > limit {
                        break Err(Stopped::OverMemory);
                    }
                }
            }
        }
    };
    let status = match ended {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => {
            return failed(eval_failure(format!(
                "failed to wait for the evaluator: {e}"
            )));
        }
        Err(why) => {
            // What it started is left to the attempt's cleanup, which kills the cgroup.
            if let Some(pid) = group {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.wait().await;
            return failed(match why {
                Stopped::Timeout => {
                    eval_failure(format!("the evaluator ran past {}s", timeout.as_secs()))
                }
                Stopped::OverMemory => oom(memory.limit_mb()),
                Stopped::Cancelled => stopped_by_cleanup(),
            });
        }
    };
    if memory.oom_kills() > ooms_before {
        return EvaluationRecord {
            exit_code: status.code(),
            ..failed(oom(memory.limit_mb()))
        };
    }
    read_result(&env.file(attempt_files::EVAL_RESULT), status.code()).await
}

/// A kill of the evaluator by the attempt's memory limit: the same failure as the actor's.
fn oom(limit_mb: Option<u64>) -> Failure {
    let f = Failure::oom(limit_mb);
    Failure {
        stage: Stage::Evaluate,
        message: format!("the evaluator was {}", f.message),
        ..f
    }
}

fn stopped_by_cleanup() -> Failure {
    Failure::infra(
        Stage::Evaluate,
        FailureCode::Cancelled,
        "the attempt's cleanup stopped the evaluator before it gave a verdict",
    )
}

/// Spawns the evaluator through [`JOIN`], its logs appended to the attempt's evaluator logs.
fn spawn(
    env: &Attempt,
    command: &casebatch_proto::runtime_v1::Command,
    tracking: &Tracking,
    memory: &MemoryLimit,
    scratch: &Scratch,
) -> Result<Child, Failure> {
    // Appended, and only as regular files: the harness ran before and could have planted a
    // FIFO or a symlink at these paths.
    let open = |name: &str| attempt_io::open_log(&env.file(name));
    let (out, err) = match (
        open(attempt_files::EVAL_STDOUT),
        open(attempt_files::EVAL_STDERR),
    ) {
        (Ok(out), Ok(err)) => (out, err),
        (Err(e), _) | (_, Err(e)) => {
            return Err(eval_failure(format!(
                "failed to open the evaluator's log files: {e}"
            )));
        }
    };
    let case_env = crate::case_env::for_attempt(env, scratch)
        .map_err(|m| Failure::config(Stage::Evaluate, FailureCode::PassEnvUnset, m))?;
    let result_path = env.file(attempt_files::EVAL_RESULT);
    let _ = fs::remove_file(&result_path);
    let workdir = &scratch.workdir;
    for dir in [workdir, &scratch.tmp] {
        if let Err(e) = fs::create_dir_all(dir) {
            return Err(eval_failure(format!(
                "cannot create the evaluator's scratch directory {}: {e}",
                dir.display()
            )));
        }
    }
    let procs: Vec<String> = [tracking.procs_file(), memory.procs_file()]
        .into_iter()
        .flatten()
        .map(|p| p.display().to_string())
        .collect();
    // A path, not `sh`: std then spawns without searching PATH (posix_spawn, no fork).
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(JOIN).arg("casebatch-evaluator");
    cmd.args(&command.argv);
    cmd.current_dir(workdir)
        .env_clear()
        .envs(case_env)
        .env("CASEBATCH_INPUT", &scratch.input)
        .env("CASEBATCH_ACTOR_RESULT", env.file(attempt_files::RESULT))
        .env("CASEBATCH_RESULT", &result_path)
        .env("CASEBATCH_CGROUP_PROCS", procs.join(":"))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    cmd.spawn()
        .map_err(|e| eval_failure(format!("failed to start the evaluator: {e}")))
}

/// The record of an evaluator that exited with `exit_code`, from the result it wrote at
/// `path` (same rules as the harness's result: regular file, size limit, off the async
/// threads).
pub async fn read_result(path: &Path, exit_code: Option<i32>) -> EvaluationRecord {
    let judged = |verdict, scores, failure| EvaluationRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        configured: true,
        verdict,
        scores,
        failure,
        exit_code,
    };
    let no_verdict = |failure| judged(None, BTreeMap::new(), Some(failure));
    let parsed = match attempt_io::read_json::<EvaluatorOutput>(
        path.to_path_buf(),
        attempt_io::max_result_bytes(),
    )
    .await
    {
        Ok(Some(o)) => Ok(o),
        Ok(None) if exit_code == Some(JOIN_FAILED) => Err(format!(
            "wrote no result at {} (exit {JOIN_FAILED}: it may not have joined the attempt's \
             cgroup; see {})",
            path.display(),
            attempt_files::EVAL_STDERR
        )),
        Ok(None) => Err(format!("it wrote no result at {}", path.display())),
        Err(e) if e.is_too_large() => {
            return no_verdict(Failure::harness(
                Stage::Evaluate,
                FailureCode::ResultTooLarge,
                format!("the evaluator's result was not read: {e}"),
            ));
        }
        Err(e @ attempt_io::FileError::Parse { .. }) => {
            Err(format!("its result is not {{\"verdict\": ...}}: {e}"))
        }
        Err(e) => Err(format!("its result is unusable: {e}")),
    };
    match parsed {
        Ok(o) if o.verdict == "pass" => judged(Some(Verdict::Pass), o.scores, None),
        Ok(o) if o.verdict == "fail" => judged(Some(Verdict::Fail), o.scores, None),
        Ok(o) => no_verdict(eval_failure(format!(
            "verdict must be \"pass\" or \"fail\", got {:?}",
            o.verdict
        ))),
        Err(why) => no_verdict(eval_failure(format!(
            "the evaluator exited with {exit_code:?} and {why}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_the_wire_scores_and_all() {
        let record = EvaluationRecord {
            scores: BTreeMap::from([
                ("accuracy".to_string(), serde_json::json!(1)),
                ("f1".to_string(), serde_json::json!(0.5)),
                ("notes".to_string(), serde_json::json!({"a": [1, "x"]})),
            ]),
            verdict: Some(Verdict::Pass),
            exit_code: Some(0),
            ..failed(eval_failure("x".into()))
        };
        let sent = to_wire("b/0/1", &record);
        assert_eq!(sent.scores_json["accuracy"], "1");
        assert_eq!(from_wire(sent).unwrap(), record);
        assert_eq!(
            from_wire(to_wire("b/0/1", &not_configured())).unwrap(),
            not_configured()
        );
    }

    #[test]
    fn an_unusable_record_from_the_wire_says_what_is_wrong() {
        let mut sent = to_wire("b/0/1", &simulated(FakeOutcome::Pass));
        sent.scores_json.insert("x".into(), "{not json".into());
        assert!(from_wire(sent).unwrap_err().contains("score \"x\""));
        let mut sent = to_wire("b/0/1", &simulated(FakeOutcome::Pass));
        sent.verdict = 9;
        assert!(from_wire(sent).unwrap_err().contains("verdict 9"));
    }
}
