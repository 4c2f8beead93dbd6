//! Runs a job's evaluator on this host, where the actor ran and under the attempt's control,
//! like the actor: it joins the attempt's cgroups (the tracking one and the memory one, named
//! in the job record) before it runs, so cleanup's kill and receipt cover it and everything it
//! starts, and its memory counts against the attempt's limit; it runs in the attempt's working
//! directory with the harness's environment allowlist ([`crate::case_env`]). On an agent, the
//! agent runs it with this same code.

use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use casebatch_proto::{Failure, FailureCode, JobRef, Stage};
use tokio::process::{Child, Command};

use crate::Attempt;
use crate::evaluation::{eval_failure, read_result};
use crate::executor::{Liveness, OnCancel};
use crate::files;
use crate::layout::attempt_files;
use crate::local::cgroup::Tracking;
use crate::local::job::{read_job, tracking_of};
use crate::local::memlimit::MemoryLimit;
use crate::local::procfs;
use crate::local::spawned;
use crate::records::{EvaluationRecord, JobRecord};
use crate::scratch::Scratch;

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

/// How often the wait looks at the clock, the memory and the liveness.
const TICK: Duration = Duration::from_millis(200);
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// The attempt's cgroups, memory limit and scratch space, as its job record names them;
/// without a record (a start known only by its traces), its cgroup found by name, no memory
/// limit and this host's scratch path.
fn controls(env: &Attempt) -> (Tracking, MemoryLimit, Scratch) {
    let job = read_job(env);
    let scratch = Scratch::recorded(job.as_ref(), env);
    match job {
        Some(JobRecord {
            tracking, memory, ..
        }) => (tracking, memory, scratch),
        None => (tracking_of(env, None), MemoryLimit::None, scratch),
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
pub(crate) async fn run_local(
    env: &Attempt,
    job: &JobRef,
    live: &dyn Liveness,
) -> EvaluationRecord {
    let Some(command) = env.job.evaluator.as_ref().filter(|c| !c.argv.is_empty()) else {
        return EvaluationRecord::not_configured();
    };
    let stopping = || live.on_cancel() == OnCancel::Kill && live.is_cancelled();
    if stopping() {
        return EvaluationRecord::failed(stopped_by_cleanup());
    }
    let (tracking, memory, scratch) = controls(env);
    let mut child = match spawn(env, command, &tracking, &memory, &scratch) {
        Ok(c) => c,
        Err(f) => return EvaluationRecord::failed(f),
    };
    // The evaluator's group: it leads it (`process_group(0)`), and the unreaped child's pid
    // cannot be reused, so the group is ours to signal.
    let group = child.id();
    if let Some(pid) = group
        && let Some(ticks) = procfs::start_ticks(pid)
    {
        spawned::record(pid, ticks, &env.process_marker());
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
            return EvaluationRecord::failed(eval_failure(format!(
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
            return EvaluationRecord::failed(match why {
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
            ..EvaluationRecord::failed(oom(memory.limit_mb()))
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
    let open = |name: &str| files::open_log(&env.file(name));
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
