//! `local-process`: a fresh child process per attempt, on the worker's host.
//!
//! The harness runs under a small `sh` wrapper that leads its own process group, joins the
//! attempt's cgroups (the one that tracks its processes, see [`crate::local::cgroup`], and the memory
//! one), runs the harness, and appends the exit status to the attempt's journal
//! (`attempt.jsonl`, [`crate::journal`]). The wrapper does not die with the worker, so after a worker crash the
//! attempt's job is still running (or has left its exit status behind) and the retried
//! `await` adopts it. Identity is pid + start time, and membership of the attempt's cgroup
//! (or, where no cgroup is writable, the allocation marker in the environment); a pid from old
//! state alone is never signalled.
//!
//! Exactly one start per attempt, across crashes (the submit window):
//! 1. `submit` holds a flock on the attempt's journal (released when its holder dies) while
//!    it decides, so two submits of one attempt never both start it.
//! 2. Before anything is spawned, a `job` entry is appended as an intent (`state: starting`,
//!    `starts: n`, the memory limit, the deadline's start, the owner: this worker process).
//! 3. The wrapper's first act, before the harness can run, is appending its `wrapper` entry
//!    (`[pid, start ticks]`); then the job is recorded again, completed (`state: running`,
//!    pid, ticks).
//! 4. A submit (or adopt, or await) that finds an intent looks for the start's own traces: a
//!    child this process holds, the `wrapper` entry, an `exit` entry, a live process carrying
//!    the marker. Any of them means the start happened: the record is completed from them and
//!    the job adopted, never started again.
//! 5. None of them, [`SPAWN_GRACE`] after the intent was written, proves the harness never ran
//!    (it only runs after the `wrapper` entry is written, and a wrapper that has not written it
//!    yet is a live marked process). Only then is the attempt started again, as `starts: n + 1`
//!    with a `job_restarted` event: visible in the job entry, the case's `result.json`
//!    (`job_starts`) and `events.jsonl`, never hidden behind `attempts: 1`.
//!
//! Logs are opened for appending, so no later start can truncate an earlier one's output.
//! An attempt reports `adopted` only when its result was harvested from a process started by
//! another worker process that is gone (not a child of this process, not a live replica's).
//!
//! This is not an OS sandbox: it shares the host's filesystem, user and network.

pub mod boot_clock;
pub mod cgroup;
pub mod evaluate;
pub mod job;
pub mod kernel;
pub mod marker_walks;
pub mod memlimit;
pub mod plain_command;
pub mod procfs;
pub mod spawned;
mod stat_cache;
pub mod wrapper;

use std::collections::HashMap;
use std::fs;
use std::process::Stdio;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use casebatch_proto::{ActorReport, ActorStatus, Failure, FailureCode, JobRef, Stage};
use nix::fcntl::{Flock, FlockArg};
use tokio::process::{Child, Command};

use crate::executor::{Executor, Liveness, NotStarted, OnCancel};
use crate::files;
use crate::harness;
use crate::journal;
use crate::layout::attempt_files;
use crate::local::cgroup::Tracking;
use crate::local::job::{
    cgroup_name, exit_status, job_ref, members, read_job, read_job_checked, recorded_starts,
    submit_failure, tracking_of, write_job,
};
use crate::local::memlimit::MemoryLimit;
use crate::local::procfs::ProcessId;
use crate::local::wrapper::{WRAPPER, WRAPPER_NAME};
use crate::records::{
    CleanupReceipt, EvaluationRecord, JobRecord, JobState, RECORD_SCHEMA_VERSION,
};
use crate::scratch::Scratch;
use crate::{Attempt, hostname, now_ms};

/// How often an adopted job (one this process did not spawn) is polled.
const POLL: Duration = Duration::from_millis(100);
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How long after an intent was written a start with no trace counts as never having run:
/// far longer than fork → exec → the wrapper's first `printf` takes on a loaded host.
pub const SPAWN_GRACE: Duration = Duration::from_secs(3);
/// Test hook, see [`fault_point`].
pub const FAULT_POINT_ENV: &str = "CASEBATCH_FAULT_POINT";

/// Children this process spawned, by the marker their processes carry: awaited directly
/// instead of polled, and so reaped. Process-wide because both of the process's workers (task
/// queue and host queue) share it. Reached only through [`Held`], so that what is held under
/// one key is found under the same key.
static CHILDREN: LazyLock<Mutex<HashMap<String, Child>>> = LazyLock::new(Default::default);

/// The child this process holds for an attempt, if any.
struct Held;

impl Held {
    fn put(env: &Attempt, child: Child) {
        CHILDREN
            .lock()
            .expect("lock")
            .insert(env.process_marker(), child);
    }

    fn take(env: &Attempt) -> Option<Child> {
        CHILDREN.lock().expect("lock").remove(&env.process_marker())
    }

    fn pid(env: &Attempt) -> Option<u32> {
        CHILDREN
            .lock()
            .expect("lock")
            .get(&env.process_marker())
            .and_then(Child::id)
    }
}

#[derive(Default)]
pub struct LocalProcess;

impl LocalProcess {
    /// Writes the intent record of start number `starts`, before anything is spawned.
    fn write_intent(env: &Attempt, starts: u32) -> Result<JobRecord, Failure> {
        let cgroup_name = cgroup_name(env);
        let memory = MemoryLimit::create(&cgroup_name, env.memory_mb());
        let tracking = Tracking::create(&cgroup_name);
        let intent = JobRecord {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker: env.marker(),
            state: JobState::Starting,
            pid: None,
            start_ticks: None,
            started_at_ms: now_ms(),
            started_at_boot_ms: boot_clock::now_ms(),
            timeout_seconds: env.job.timeout_seconds,
            memory,
            tracking,
            starts,
            owner: ProcessId::this(),
            recovered: false,
            scratch: Some(env.scratch().workdir),
        };
        write_job(env, &intent)?;
        Ok(intent)
    }

    /// Spawns the wrapper for an intent already on disk.
    fn spawn(&self, env: &Attempt, intent: &JobRecord) -> Result<Child, Failure> {
        let harness = env.harness()?;
        let scratch = Scratch::recorded(Some(intent), env);
        let case_env = crate::case_env::for_attempt(env, &scratch)
            .map_err(|m| Failure::config(Stage::Submit, FailureCode::PassEnvUnset, m))?;
        // Appended: a start never truncates what an earlier one of the attempt wrote.
        let open = |name: &str| {
            files::open_log(&env.file(name))
                .map_err(|e| submit_failure(format!("failed to open {name}: {e}")))
        };
        let (stdout, stderr) = (open(attempt_files::STDOUT)?, open(attempt_files::STDERR)?);
        let procs: Vec<String> = [intent.tracking.procs_file(), intent.memory.procs_file()]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();

        // A path, not `sh`: with PATH in the child's environment, std would fork (copying this
        // process's page tables) to search it; with a path it uses posix_spawn (vfork).
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(WRAPPER).arg(WRAPPER_NAME);
        cmd.arg(journal::path(&env.dir));
        // A plain command string's words, run by the wrapper itself: one exec of the shell
        // fewer per attempt (see `plain_command`).
        match plain_command::words(&harness.argv) {
            Some(words) => cmd.args(words),
            None => cmd.args(&harness.argv),
        };
        cmd.current_dir(&scratch.workdir)
            .env_clear()
            .envs(case_env)
            .env("CASEBATCH_CGROUP_PROCS", procs.join(":"))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // Its own group: signals to the worker's group do not reach it, and the whole
            // group can be stopped at once.
            .process_group(0);
        if let Some(url) = env
            .job
            .input()
            .ok()
            .and_then(|input| input.get("controller_url")?.as_str().map(str::to_owned))
        {
            cmd.env("CASEBATCH_CONTROLLER_URL", url);
        }
        cmd.spawn()
            .map_err(|e| submit_failure(format!("failed to start the harness: {e}")))
    }

    /// Completes an intent from what is known of its process, and writes it.
    fn complete(
        env: &Attempt,
        intent: &JobRecord,
        pid: Option<u32>,
        ticks: Option<u64>,
        recovered: bool,
    ) -> Result<JobRecord, Failure> {
        let record = JobRecord {
            state: JobState::Running,
            pid,
            start_ticks: ticks,
            recovered,
            ..intent.clone()
        };
        write_job(env, &record)?;
        Ok(record)
    }

    /// Starts the attempt's process (start number `starts`): intent, spawn, completed record.
    async fn start(&self, env: &Attempt, starts: u32) -> Result<JobRef, Failure> {
        let intent = Self::write_intent(env, starts)?;
        fault_point("before-spawn").await;
        let child = self.spawn(env, &intent)?;
        fault_point("after-spawn").await;
        let pid = child
            .id()
            .ok_or_else(|| submit_failure("the harness exited at once".into()))?;
        // Joined here as well as by the wrapper (which joins itself before the harness runs,
        // should this process die now): a cleanup right after the submit (a batch cancelled as
        // the case starts) must find the wrapper in its cgroup, not outside it before its own
        // join, where it reads as an escape. Unreaped, the pid is still the child's.
        for procs in [intent.tracking.procs_file(), intent.memory.procs_file()]
            .into_iter()
            .flatten()
        {
            let _ = std::fs::write(procs, pid.to_string());
        }
        // A zombie (the harness already ended) still has its stat: the identity is readable.
        let ticks = procfs::start_ticks(pid);
        if let Some(ticks) = ticks {
            spawned::record(pid, ticks, &env.process_marker());
        }
        // Held before the record is written: a failed write leaves the intent, and the child
        // is still found (and awaited directly) through this map.
        Held::put(env, child);
        let record = Self::complete(env, &intent, Some(pid), ticks, false)?;
        Ok(job_ref(&record))
    }
    /// Kills the job's group (if it is still the same process) and every process of the
    /// attempt: its whole cgroup at once, or each marked process.
    fn kill_all(&self, env: &Attempt, job: Option<&JobRecord>) -> Vec<u32> {
        if let Some((pid, ticks)) = job.and_then(|j| j.pid.zip(j.start_ticks)) {
            procfs::kill_group_if_same(pid, ticks);
        }
        if let Some(killed) = tracking_of(env, job).kill() {
            return killed;
        }
        let scan = procfs::scan_marker(&env.process_marker());
        for pid in &scan.marked {
            procfs::kill_pid(*pid);
        }
        scan.marked
    }

    async fn finish(
        &self,
        env: &Attempt,
        job: &JobRecord,
        exit: i32,
        adopted: bool,
    ) -> ActorReport {
        let mut report = if job.memory.oom_killed() {
            oom_report(job, exit)
        } else {
            let stderr = env.file(attempt_files::STDERR);
            harness::classify(exit, &env.file(attempt_files::RESULT), &stderr).await
        };
        report.adopted = adopted;
        report.memory_limit_mb = job.memory.limit_mb();
        report
    }
}

fn oom_report(job: &JobRecord, exit: i32) -> ActorReport {
    ActorReport {
        status: ActorStatus::Failed,
        exit_code: Some(exit),
        failure: Some(Failure::oom(job.memory.limit_mb())),
        adopted: false,
        memory_limit_mb: job.memory.limit_mb(),
        usage: None,
        retry_after_ms: None,
        logs_capped: None,
    }
}

enum Waited {
    Exited(i32),
    TimedOut,
    /// The wait was cancelled; the child this process holds, if any, is handed back.
    Cancelled(Option<Child>),
    OverMemory,
    Lost,
}

/// The machinery itself: what a worker's host and an agent both run.
#[async_trait]
impl Executor for LocalProcess {
    async fn provision(&self, env: &Attempt) -> Result<(), Failure> {
        let fail = |e: std::io::Error| {
            Failure::infra(
                Stage::Provision,
                FailureCode::ProvisionIo,
                format!("{}: {e}", env.dir.display()),
            )
        };
        fs::create_dir_all(env.file(attempt_files::OUTPUT)).map_err(fail)?;
        let input = env
            .job
            .input()
            .map_err(|m| Failure::infra(Stage::Provision, FailureCode::ProvisionIo, m))?;
        let scratch = env.scratch();
        let scratch_fail = |e: std::io::Error| {
            Failure::infra(
                Stage::Provision,
                FailureCode::ProvisionIo,
                format!("{}: {e}", scratch.workdir.display()),
            )
        };
        scratch.create().map_err(scratch_fail)?;
        let bytes = serde_json::to_vec(&input).expect("inputs always serialize");
        fs::write(&scratch.input, bytes).map_err(scratch_fail)?;
        Ok(())
    }

    async fn submit(&self, env: &Attempt) -> Result<JobRef, NotStarted> {
        Ok(self.submit_job(env).await?)
    }

    async fn await_job(&self, env: &Attempt, job: &JobRef, live: &dyn Liveness) -> ActorReport {
        let record = match read_job(env) {
            Some(r) if r.state == JobState::Running => Some(r),
            // An intent left by a submit that died: its traces name the process.
            Some(r) => start_traces(env).map(|t| JobRecord {
                state: JobState::Running,
                pid: t.pid,
                start_ticks: t.ticks,
                recovered: true,
                ..r
            }),
            // The job record lost but the heartbeat named the process: trust it only if the
            // marker still identifies it.
            None => job.pid.zip(job.start_ticks).and_then(|(pid, ticks)| {
                members(env, &tracking_of(env, None))
                    .contains(&pid)
                    .then(|| {
                        recovered_record(
                            env,
                            Trace {
                                pid: Some(pid),
                                ticks: Some(ticks),
                            },
                        )
                    })
            }),
        };
        let Some(record) = record else {
            return lost(env, "its job record is missing or its start left no trace");
        };
        let child = Held::take(env);
        // Adopted: harvested from a process another worker process started and is gone.
        // Not when this process holds the child, or started it (and lost the handle), or
        // the starter is a live replica on this host.
        let adopted = child.is_none() && !record.owner.is_some_and(|o| o.is_alive());
        let deadline = Deadline::of(&record);
        let rss_limit = match record.memory {
            MemoryLimit::RssPoll { limit_mb } => Some(limit_mb * 1024 * 1024),
            _ => None,
        };

        let waited = wait(env, &record, child, live, deadline, rss_limit).await;
        let job_ended =
            !matches!(waited, Waited::Cancelled(_)) || live.on_cancel() == OnCancel::Kill;
        let mut report = match waited {
            Waited::Exited(code) => self.finish(env, &record, code, adopted).await,
            Waited::TimedOut => {
                self.kill_all(env, Some(&record));
                let mut r = lost(env, "");
                r.failure = Some(Failure::infra(
                    Stage::Await,
                    FailureCode::Timeout,
                    format!(
                        "the harness ran past timeout_seconds ({})",
                        record.timeout_seconds
                    ),
                ));
                r.adopted = adopted;
                r
            }
            Waited::OverMemory => {
                self.kill_all(env, Some(&record));
                let mut r = oom_report(&record, 137);
                r.adopted = adopted;
                r
            }
            Waited::Cancelled(child) => {
                match live.on_cancel() {
                    OnCancel::Kill => {
                        self.kill_all(env, Some(&record));
                    }
                    // The next wait in this process awaits the child directly again.
                    OnCancel::EndWait => {
                        if let Some(child) = child {
                            Held::put(env, child);
                        }
                    }
                }
                ActorReport {
                    status: ActorStatus::Cancelled,
                    exit_code: None,
                    failure: None,
                    adopted,
                    memory_limit_mb: record.memory.limit_mb(),
                    usage: None,
                    retry_after_ms: None,
                    logs_capped: None,
                }
            }
            Waited::Lost => lost(env, "its process is gone and left no exit status"),
        };
        if job_ended {
            report.logs_capped = crate::logs::cap_attempt(env).map(Box::new);
        }
        report
    }

    async fn evaluate(&self, env: &Attempt, job: &JobRef, live: &dyn Liveness) -> EvaluationRecord {
        evaluate::run_local(env, job, live).await
    }

    fn adopt(&self, env: &Attempt) -> Option<JobRef> {
        // Read-only: finds the job by its record or its traces; await resolves the rest.
        match read_job(env) {
            Some(r) if r.state == JobState::Running => Some(job_ref(&r)),
            Some(r) => start_traces(env).map(|t| {
                job_ref(&JobRecord {
                    pid: t.pid,
                    start_ticks: t.ticks,
                    ..r
                })
            }),
            None => find_marked(env).map(|t| JobRef {
                marker: env.marker(),
                pid: t.pid,
                start_ticks: t.ticks,
                host_queue: Some(casebatch_proto::host_task_queue(&hostname())),
                runtime: None,
                queued: false,
            }),
        }
    }

    fn kill(&self, env: &Attempt) {
        self.kill_all(env, read_job(env).as_ref());
    }

    async fn cleanup(&self, env: &Attempt) -> CleanupReceipt {
        let job = read_job(env);
        let tracking = tracking_of(env, job.as_ref());
        let in_cgroup = tracking.procs_file().is_some();
        let mut checks = Vec::new();
        let (mut killed, mut remaining, scans) = if in_cgroup {
            let emptied = self.empty_cgroup(env, job.as_ref(), &tracking).await;
            if emptied.1.is_empty() {
                checks.push("cgroup_empty".to_string());
            }
            emptied
        } else {
            self.kill_marked(env, job.as_ref()).await
        };
        // An empty cgroup vouches only for its members: a process that moved itself out (as
        // root it can) still carries the marker, unless it also cleared its environment.
        let escaped = if in_cgroup {
            self.kill_escaped(env, job.as_ref()).await
        } else {
            Vec::new()
        };
        checks.push("marker_scan".to_string());
        let described: Vec<String> = escaped.iter().map(|p| p.1.clone()).collect();
        let escaped: Vec<u32> = escaped.iter().map(|p| p.0).collect();
        remaining.extend(escaped.iter().copied().filter(|p| procfs::is_alive(*p)));
        killed.extend(&escaped);
        tracking.remove();
        if let Some(job) = &job {
            job.memory.remove();
        }
        // A child still held (its wait was cancelled) is reaped by tokio once let go.
        drop(Held::take(env));
        // Its processes are gone: nothing uses the scratch space any more.
        Scratch::recorded(job.as_ref(), env).remove();
        killed.sort_unstable();
        killed.dedup();
        let confirmed = remaining.is_empty() && escaped.is_empty();
        let method = tracking.method();
        CleanupReceipt {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker: env.marker(),
            cleanup_confirmed: confirmed,
            killed,
            message: if !escaped.is_empty() {
                format!(
                    "{} left the attempt's cgroup ({method}) and carried its marker (killed): \
                     cleanup cannot vouch for what else left it",
                    described.join(", ")
                )
            } else {
                match (confirmed, &tracking) {
                    (true, Tracking::MarkerScan) => {
                        "no process carrying the allocation marker is left".into()
                    }
                    (true, _) => format!(
                        "the attempt's cgroup ({method}) is empty and removed, and no process \
                         carries its marker"
                    ),
                    (false, _) => format!("processes still alive or unreadable: {remaining:?}"),
                }
            },
            remaining,
            scans,
            method: Some(method.into()),
            checks,
            escaped,
            held_job: Some(job.is_some()),
            containers: Vec::new(),
            scheduler_job: None,
        }
    }

    /// A job on this host whose wait hands the child back when it ends early: settled at
    /// start unless an evaluator follows (whose own timeout `start`'s watch would cut).
    fn settles_at_start(&self, env: &Attempt) -> bool {
        !env.has_evaluator()
    }

    fn host_queue(&self) -> Option<String> {
        Some(casebatch_proto::host_task_queue(&hostname()))
    }

    /// The wrapper counts them: 1, or more when a start provably never ran (module doc).
    fn job_starts(&self, env: &Attempt) -> Option<u32> {
        recorded_starts(env)
    }

    fn start_attempted(&self, env: &Attempt) -> bool {
        // An unreadable journal: only the attempt's processes replace it, so it started.
        env.journal().map_or(true, |j| j.job.is_some())
    }

    fn is_remote(&self) -> bool {
        false
    }

    /// Its report says whether the process was started by a worker process that is gone.
    fn tells_adoption(&self) -> bool {
        true
    }
}

impl LocalProcess {
    /// Starts the attempt's job exactly once across crashes (see the module doc).
    async fn submit_job(&self, env: &Attempt) -> Result<JobRef, Failure> {
        // One decider per attempt at a time; released when this future ends or its process
        // dies.
        let _lock = lock_attempt(env).await?;
        let existing = match read_job_checked(env) {
            Ok(r) => r,
            // Only an attempt's own processes can replace an atomically written record, so
            // it started: rebuild the record from the start's traces, never start again.
            Err(e) => {
                let Some(t) = start_traces(env) else {
                    return Err(submit_failure(format!("job record unusable: {e}")));
                };
                let record = recovered_record(env, t);
                write_job(env, &record)?;
                return Ok(job_ref(&record));
            }
        };
        let Some(record) = existing else {
            // No intent: nothing of this version started. A marked process without one is
            // from an older version: adopt it rather than start another.
            if let Some(t) = find_marked(env) {
                let record = recovered_record(env, t);
                write_job(env, &record)?;
                return Ok(job_ref(&record));
            }
            return self.start(env, 1).await;
        };
        if record.state == JobState::Running {
            // Idempotent: a retried submit finds the job it already started.
            return Ok(job_ref(&record));
        }
        // An intent: its start may have happened. Look for its own traces first.
        if let Some(t) = start_traces(env) {
            return Self::complete(env, &record, t.pid, t.ticks, true).map(|r| job_ref(&r));
        }
        let written = match (record.started_at_boot_ms, boot_clock::now_ms()) {
            (Some(at), Some(now)) => Duration::from_millis(now.saturating_sub(at)),
            _ => Duration::from_millis(now_ms().saturating_sub(record.started_at_ms)),
        };
        if let Some(wait) = SPAWN_GRACE.checked_sub(written) {
            tokio::time::sleep(wait).await;
            if let Some(t) = start_traces(env) {
                return Self::complete(env, &record, t.pid, t.ticks, true).map(|r| job_ref(&r));
            }
        }
        // Provably never ran: no wrapper entry (written before the harness runs), no exit
        // status, no live marked process, SPAWN_GRACE after the intent. Start again, visibly.
        let starts = record.starts + 1;
        tracing::warn!(
            marker = %env.marker(),
            starts,
            "the attempt's intent was found with no trace of its start: starting it again"
        );
        env.event(
            "job_restarted",
            format!(
                "start {starts} of attempt {}: start {} left no wrapper entry, no exit status and no live process {}s after its intent, so the harness never ran",
                env.key.attempt,
                record.starts,
                SPAWN_GRACE.as_secs()
            ),
        );
        self.start(env, starts).await
    }

    /// Kills the attempt's cgroup until it is empty (bounded: about 4 s for a process stuck
    /// in the kernel). Returns (killed, remaining, rounds).
    async fn empty_cgroup(
        &self,
        env: &Attempt,
        job: Option<&JobRecord>,
        tracking: &Tracking,
    ) -> (Vec<u32>, Vec<u32>, u32) {
        const ROUNDS: u32 = 50;
        let mut killed = Vec::new();
        for round in 1..=ROUNDS {
            killed.extend(self.kill_all(env, job));
            if tracking.is_empty() {
                return (killed, Vec::new(), round);
            }
            tokio::time::sleep(Duration::from_millis(5 * u64::from(round.min(20)))).await;
        }
        (killed, tracking.members().unwrap_or_default(), ROUNDS)
    }

    /// After the cgroup is empty: the processes started since the job that still carry its
    /// marker left the cgroup. Each is named and killed (by the marker this very scan read).
    async fn kill_escaped(&self, env: &Attempt, job: Option<&JobRecord>) -> Vec<(u32, String)> {
        let since = job.and_then(|j| j.start_ticks);
        let marked = marker_walks::scan_marker_since(&env.process_marker(), since)
            .await
            .marked;
        let escaped: Vec<(u32, String)> =
            marked.iter().map(|&p| (p, procfs::describe(p))).collect();
        for &(pid, _) in &escaped {
            procfs::kill_pid(pid);
        }
        // A killed process leaves /proc within moments; the receipt names any that did not.
        for _ in 0..20 {
            if escaped.iter().all(|(p, _)| !procfs::is_alive(*p)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        escaped
    }

    /// Without a cgroup: kills every process carrying the marker, scanning `/proc` again after
    /// each kill (a dying parent can leave children that re-parent).
    async fn kill_marked(
        &self,
        env: &Attempt,
        job: Option<&JobRecord>,
    ) -> (Vec<u32>, Vec<u32>, u32) {
        let mut killed = Vec::new();
        let mut scans = 0;
        let mut remaining = Vec::new();
        for round in 0..20 {
            scans += 1;
            let found = self.kill_all(env, job);
            if found.is_empty() {
                let since = job.and_then(|j| j.start_ticks);
                remaining = marker_walks::scan_marker_since(&env.process_marker(), since)
                    .await
                    .unreadable;
                // Only a process that stays unreadable can keep cleanup unconfirmed.
                for _ in 0..5 {
                    if remaining.is_empty() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    remaining = procfs::recheck_unreadable(&env.process_marker(), &remaining);
                }
                break;
            }
            killed.extend(found.iter().copied());
            remaining = found;
            tokio::time::sleep(Duration::from_millis(20 * (round + 1))).await;
        }
        (killed, remaining, scans)
    }
}

/// Waits for the job: directly on the child when this process spawned it, else by polling
/// its exit-status file and identity (an adopted job).
/// A job's deadline: its timeout after its start, measured on the host's boot clock, which
/// a wall-clock step does not move. Records from before the boot clock was kept count from the
/// wrapper's start time (the same clock); only a record with neither falls back to the wall
/// clock.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    started_boot_ms: Option<u64>,
    started_wall_ms: u64,
    timeout_ms: u64,
}

impl Deadline {
    fn of(record: &JobRecord) -> Self {
        Self {
            started_boot_ms: record
                .started_at_boot_ms
                .or(record.start_ticks.map(boot_clock::ticks_to_ms)),
            started_wall_ms: record.started_at_ms,
            timeout_ms: record.timeout_seconds * 1000,
        }
    }

    fn passed(&self) -> bool {
        match (self.started_boot_ms, boot_clock::now_ms()) {
            (Some(started), Some(now)) => now.saturating_sub(started) >= self.timeout_ms,
            _ => now_ms() >= self.started_wall_ms + self.timeout_ms,
        }
    }
}

/// A child's exit status as a shell would report it (128 + the signal when killed).
fn status_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

async fn wait(
    env: &Attempt,
    record: &JobRecord,
    mut child: Option<Child>,
    live: &dyn Liveness,
    deadline: Deadline,
    rss_limit: Option<u64>,
) -> Waited {
    let job = job_ref(record);
    let mut last_beat: Option<Instant> = None;
    loop {
        if last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY) {
            crate::logs::bound_running_attempt(env);
            live.heartbeat(&job).await;
            last_beat = Some(Instant::now());
        }
        if live.is_cancelled() {
            return Waited::Cancelled(child);
        }
        if deadline.passed() {
            // However long nobody looked (an engine stall, a worker restart), a job that has
            // ended is no timeout: its recorded end is read first.
            if let Some(code) = exit_status(env) {
                return Waited::Exited(code);
            }
            if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return exit_status(env)
                    .map_or_else(|| Waited::Exited(status_code(status)), Waited::Exited);
            }
            return Waited::TimedOut;
        }
        if let Some(limit) = rss_limit {
            let used: u64 = members(env, &record.tracking)
                .iter()
                .filter_map(|p| procfs::rss_bytes(*p))
                .sum();
            if used > limit {
                return Waited::OverMemory;
            }
        }
        match child.as_mut() {
            Some(c) => {
                let tick = if rss_limit.is_some() {
                    POLL * 2
                } else {
                    HEARTBEAT_EVERY
                };
                if let Ok(status) = tokio::time::timeout(tick, c.wait()).await {
                    // The wrapper's file is authoritative (it holds the harness's own status).
                    let code = exit_status(env).or_else(|| status.ok().map(status_code));
                    return code.map_or(Waited::Lost, Waited::Exited);
                }
            }
            None => {
                if let Some(code) = exit_status(env) {
                    return Waited::Exited(code);
                }
                let alive = match record.pid.zip(record.start_ticks) {
                    Some((pid, ticks)) => procfs::is_same_process(pid, ticks),
                    // Known only by its traces: alive while anything carries its marker.
                    None => !members(env, &record.tracking).is_empty(),
                };
                if !alive {
                    // It may have written its status just before exiting.
                    return exit_status(env).map_or(Waited::Lost, Waited::Exited);
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

/// What a start left behind: enough to know it happened, and its process if named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Trace {
    pid: Option<u32>,
    ticks: Option<u64>,
}

/// The traces of the attempt's latest start, if it happened: the child this process holds,
/// the wrapper's entry (written before the harness runs), the exit status, or a live
/// process carrying the marker. `None` means the harness of that start never ran (once
/// [`SPAWN_GRACE`] has passed since the intent; before, a wrapper may still be on its way).
fn start_traces(env: &Attempt) -> Option<Trace> {
    if let Some(pid) = Held::pid(env) {
        return Some(Trace {
            pid: Some(pid),
            ticks: procfs::start_ticks(pid),
        });
    }
    match env.journal() {
        Ok(journal) => {
            if let Some((pid, ticks)) = journal.wrapper {
                return Some(Trace {
                    pid: Some(pid),
                    ticks: ticks.or_else(|| procfs::start_ticks(pid)),
                });
            }
            if journal.exit.is_some() {
                return Some(Trace::default());
            }
        }
        // There, but not a readable regular file: only the attempt's processes replace it,
        // so it started; its process is unknown.
        Err(_) => return Some(Trace::default()),
    }
    find_marked(env)
}

/// A record rebuilt from a start's traces alone (no usable intent): the memory mechanism is
/// unknown, and the deadline counts from the wrapper's start where its process is known, else
/// from now.
fn recovered_record(env: &Attempt, t: Trace) -> JobRecord {
    JobRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        marker: env.marker(),
        state: JobState::Running,
        pid: t.pid,
        start_ticks: t.ticks,
        started_at_ms: now_ms(),
        started_at_boot_ms: match t.ticks {
            Some(ticks) => Some(boot_clock::ticks_to_ms(ticks)),
            None => boot_clock::now_ms(),
        },
        timeout_seconds: env.job.timeout_seconds,
        memory: MemoryLimit::None,
        tracking: tracking_of(env, None),
        starts: 1,
        owner: None,
        recovered: true,
        scratch: None,
    }
}

/// The attempt's group leader (or, failing that, any of its processes), found in its cgroup by
/// name, or by its marker where this host has no cgroup to look in.
fn find_marked(env: &Attempt) -> Option<Trace> {
    let found = match Tracking::find(&cgroup_name(env)) {
        Some(t) => t.members().unwrap_or_default(),
        None if Tracking::cgroups_available() => return None,
        None => procfs::scan_marker(&env.process_marker()).marked,
    };
    let leader = found
        .iter()
        .copied()
        .find(|p| procfs::process_group(*p) == Some(*p))
        .or_else(|| found.iter().copied().min())?;
    Some(Trace {
        pid: Some(leader),
        ticks: procfs::start_ticks(leader),
    })
}

/// Takes the flock on the attempt's journal, waiting for a holder that is still alive. The
/// container runtime decides its starts under the same lock.
pub async fn lock_attempt(env: &Attempt) -> Result<Flock<std::fs::File>, Failure> {
    let mut file = journal::open_for_append(&env.dir).map_err(|e| submit_failure(e.to_string()))?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                file = f;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err((_, e)) => {
                return Err(submit_failure(format!(
                    "failed to lock {}: {e}",
                    journal::path(&env.dir).display()
                )));
            }
        }
    }
}

/// TEST HOOK, for integration tests of crash recovery; never set in production, where it
/// does nothing. `CASEBATCH_FAULT_POINT=<point>[:<n>]` in the worker's environment makes the
/// worker SIGKILL its own process when the `n`-th submit (default 1) reaches `<point>`; the
/// submits that reach it before wait there, so `n` attempts are caught inside the same window.
/// Points: `before-spawn` (intent written, nothing spawned) and `after-spawn` (process
/// spawned, job record not yet completed).
pub async fn fault_point(point: &str) {
    static REACHED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let Ok(spec) = std::env::var(FAULT_POINT_ENV) else {
        return;
    };
    let (name, n) = match spec.split_once(':') {
        Some((name, n)) => (name, n.parse::<u32>().unwrap_or(1)),
        None => (spec.as_str(), 1),
    };
    if name != point {
        return;
    }
    let reached = REACHED.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    tracing::warn!("{FAULT_POINT_ENV}: reached {point} ({reached} of {n})");
    if reached >= n {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    }
    std::future::pending::<()>().await;
}

fn lost(env: &Attempt, why: &str) -> ActorReport {
    ActorReport {
        status: ActorStatus::Failed,
        exit_code: None,
        failure: Some(Failure::infra(
            Stage::Await,
            FailureCode::JobLost,
            format!(
                "attempt {} of case {}: {why}",
                env.key.attempt, env.job.case_id
            ),
        )),
        adopted: false,
        memory_limit_mb: None,
        usage: None,
        retry_after_ms: None,
        logs_capped: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSpec;

    #[test]
    fn the_wrapper_records_its_own_identity_before_the_harness_runs() {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal::path(dir.path());
        let seen = dir.path().join("seen");
        // The harness checks that the wrapper's entry is already there when it runs.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg(WRAPPER_NAME)
            .arg(&journal)
            .args([
                "sh",
                "-c",
                r#"grep -q '"wrapper"' "$0" && echo yes > "$1"; sleep 1; exit 3"#,
            ])
            .arg(&journal)
            .arg(&seen)
            .env("CASEBATCH_CGROUP_PROCS", "")
            .spawn()
            .unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        // The redirection creates the file before `echo` writes into it: wait for the line.
        let written = || std::fs::read_to_string(&seen).is_ok_and(|s| s.ends_with('\n'));
        while !written() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let ticks = procfs::start_ticks(pid).unwrap();
        let read = || crate::journal::AttemptJournal::read(dir.path()).unwrap();
        assert_eq!(read().wrapper, Some((pid, Some(ticks))));
        assert_eq!(read().exit, None, "not before the harness ends");
        assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), "yes");
        assert_eq!(child.wait().unwrap().code(), Some(3));
        assert_eq!(read().exit, Some(3));
        assert!(read().unreadable_lines.is_empty());
    }

    /// A wait that is cancelled or not, and otherwise watches quietly.
    struct Watch {
        cancelled: bool,
    }

    #[async_trait]
    impl Liveness for Watch {
        async fn heartbeat(&self, _: &JobRef) {}
        fn is_cancelled(&self) -> bool {
            self.cancelled
        }
    }

    /// Waits (on events: the process table) until `pid` is no longer there, zombie or not.
    async fn reaped(pid: u32) -> bool {
        let gone = || !std::path::Path::new(&format!("/proc/{pid}")).exists();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gone() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        gone()
    }

    fn attempt(root: &std::path::Path, harness: &str) -> Attempt {
        let job = JobSpec {
            case_id: "c".into(),
            case_dir: "c".into(),
            harness: Some(casebatch_proto::runtime_v1::Command::shell(harness)),
            input_json: r#"{"query": "q"}"#.into(),
            timeout_seconds: 60,
            ..JobSpec::default()
        };
        let key = casebatch_proto::AttemptKey {
            batch_id: "held".into(),
            bundle_dir: root.display().to_string(),
            case_index: 0,
            attempt: 1,
            memory_boost_mb: None,
            runtime: None,
        };
        Attempt::new(key, job)
    }

    /// An attempt of `harness` under `root`, provisioned and submitted: its job and process.
    async fn started(
        root: &std::path::Path,
        harness: &str,
    ) -> (LocalProcess, Attempt, JobRef, u32) {
        let env = attempt(root, harness);
        let rt = LocalProcess;
        rt.provision(&env).await.unwrap();
        let job = rt.submit(&env).await.unwrap();
        let pid = job.pid.expect("a local job names its process");
        (rt, env, job, pid)
    }

    /// The wrapper this process spawned is awaited as its child, so it is reaped when it ends:
    /// polled instead (a child held under one key and looked for under another), it stayed a
    /// zombie for as long as the worker ran, one per case, until pids ran out.
    #[tokio::test]
    async fn the_wrapper_a_submit_spawned_is_awaited_and_reaped() {
        let root = tempfile::tempdir().unwrap();
        let (rt, env, job, pid) = started(root.path(), "exit 7").await;
        assert_eq!(Held::pid(&env), Some(pid), "held as this process's child");

        let report = rt.await_job(&env, &job, &Watch { cancelled: false }).await;
        assert_eq!(
            (report.status, report.exit_code, report.adopted),
            (ActorStatus::Failed, Some(7), false)
        );
        assert_eq!(Held::pid(&env), None, "no longer held once it ended");
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the wrapper {pid} was not reaped: {:?}",
            kernel::stat(pid)
        );
        assert!(rt.cleanup(&env).await.cleanup_confirmed);
    }

    /// The submit puts the wrapper in the attempt's cgroup itself, so a cleanup right after it
    /// (a batch cancelled as the case starts) finds it there. Left to join on its own, the
    /// wrapper was still outside for the first millisecond of its life, and a cleanup then
    /// killed it as an escape and could not vouch for the attempt (one run in six of the test
    /// below, on a loaded host).
    #[tokio::test]
    async fn a_submitted_wrapper_is_in_its_cgroup_when_the_submit_returns() {
        let root = tempfile::tempdir().unwrap();
        let (rt, env, _job, pid) = started(root.path(), "sleep 60").await;
        let tracking = tracking_of(&env, read_job(&env).as_ref());
        if tracking.procs_file().is_none() {
            eprintln!("skipped: no cgroup to track attempts in on this host");
            return;
        }
        let members = tracking.members().unwrap_or_default();
        let receipt = rt.cleanup(&env).await;
        assert!(members.contains(&pid), "{pid} not among {members:?}");
        assert!(receipt.cleanup_confirmed, "{receipt:?}");
    }

    /// A plain command string's words go to the wrapper itself; a string the shell does more
    /// with still goes through `sh -c`.
    #[tokio::test]
    async fn the_wrapper_runs_a_plain_command_without_another_shell() {
        for (harness, tail) in [
            ("sleep 60", &["sleep", "60"][..]),
            ("sleep ${N:-60}", &["sh", "-c", "sleep ${N:-60}"][..]),
        ] {
            let root = tempfile::tempdir().unwrap();
            let (rt, env, _job, pid) = started(root.path(), harness).await;
            // Empty until the exec has set up the new image (the spawn returns before that).
            let deadline = Instant::now() + Duration::from_secs(10);
            let cmdline = loop {
                let read = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
                if !read.is_empty() || Instant::now() > deadline {
                    break read;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            let args: Vec<&[u8]> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .collect();
            let ran: Vec<&[u8]> = tail.iter().map(|a| a.as_bytes()).collect();
            assert!(
                args.ends_with(&ran),
                "{harness}: {:?}",
                String::from_utf8_lossy(&cmdline)
            );
            assert!(rt.cleanup(&env).await.cleanup_confirmed);
        }
    }

    /// A wait that was cancelled hands the child back for the next wait; the attempt's cleanup
    /// kills it and lets it go, so it is reaped and not left a zombie of the worker.
    #[tokio::test]
    async fn a_child_held_past_a_cancelled_wait_is_reaped_after_cleanup() {
        let root = tempfile::tempdir().unwrap();
        let (rt, env, job, pid) = started(root.path(), "sleep 60").await;

        let report = rt.await_job(&env, &job, &Watch { cancelled: true }).await;
        assert_eq!(report.status, ActorStatus::Cancelled);
        assert_eq!(Held::pid(&env), Some(pid), "held again for the next wait");

        let receipt = rt.cleanup(&env).await;
        assert!(receipt.cleanup_confirmed, "{receipt:?}");
        assert_eq!(Held::pid(&env), None);
        assert!(
            reaped(pid).await,
            "the wrapper {pid} stayed: {:?}",
            kernel::stat(pid)
        );
    }

    #[test]
    fn records_from_before_intents_still_read() {
        let old = r#"{"schema_version": "casebatch_v1", "marker": "b/0/1", "pid": 42,
            "start_ticks": 7, "started_at_ms": 1, "timeout_seconds": 60,
            "memory": {"mechanism": "none"}}"#;
        let r: JobRecord = serde_json::from_str(old).unwrap();
        assert_eq!(
            (r.state, r.pid, r.start_ticks, r.starts, r.owner),
            (JobState::Running, Some(42), Some(7), 1, None)
        );
    }
}
