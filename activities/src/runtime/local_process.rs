//! `local-process`: a fresh child process per attempt, on the worker's host.
//!
//! The harness runs under a small `sh` wrapper that leads its own process group, joins the
//! attempt's memory cgroup, runs the harness, and writes the exit status to a file with an
//! atomic rename. The wrapper does not die with the worker, so after a worker crash the
//! attempt's job is still running (or has left its exit status behind) and the retried
//! `await` adopts it. Identity is pid + start time + the allocation marker in the
//! environment; a pid from old state alone is never signalled.
//!
//! This is not an OS sandbox: it shares the host's filesystem, user and network.

use std::collections::HashMap;
use std::fs;
use std::process::Stdio;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use casebatch_bundle::{
    CleanupReceipt, RECORD_SCHEMA_VERSION, layout::attempt_files, write_json_atomic,
};
use casebatch_manifest::model::CommandSpec;
use casebatch_proto::{ActorReport, ActorStatus, Failure, JobRef, Stage, codes};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use super::{AttemptEnv, Liveness, Runtime};
use crate::attempt_io;
use crate::harness;
use crate::memlimit::MemoryLimit;
use crate::procfs;

/// Joins the cgroup, runs the harness, records its exit status durably.
const WRAPPER: &str = r#"
if [ -n "$CASEBATCH_CGROUP_PROCS" ]; then echo $$ > "$CASEBATCH_CGROUP_PROCS" || exit 96; fi
"$@"
code=$?
printf '%s\n' "$code" > "$CASEBATCH_EXIT_FILE.tmp" && mv "$CASEBATCH_EXIT_FILE.tmp" "$CASEBATCH_EXIT_FILE"
exit $code
"#;

/// How often an adopted job (one this process did not spawn) is polled.
const POLL: Duration = Duration::from_millis(100);
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// `job.json`: the runtime's record of the job it started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    pub schema_version: String,
    pub marker: String,
    pub pid: u32,
    pub start_ticks: u64,
    pub started_at_ms: u64,
    pub timeout_seconds: u64,
    pub memory: MemoryLimit,
}

/// Children this process spawned, by marker: awaited directly instead of polled. Process-wide
/// because both of the process's workers (task queue and host queue) share it.
static CHILDREN: LazyLock<Mutex<HashMap<String, Child>>> = LazyLock::new(Default::default);

#[derive(Default)]
pub struct LocalProcess;

/// This host's name, as used in its activity task queue.
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn submit_failure(msg: String) -> Failure {
    Failure::infra(Stage::Submit, codes::SPAWN_FAILED, msg)
}

impl LocalProcess {
    fn read_job(env: &AttemptEnv) -> Option<JobRecord> {
        attempt_io::read_json_now(&env.file(attempt_files::JOB), attempt_io::RECORD_LIMIT)
            .ok()
            .flatten()
    }

    fn exit_status(env: &AttemptEnv) -> Option<i32> {
        attempt_io::read_text_now(&env.file(attempt_files::EXIT), 64)
            .ok()??
            .trim()
            .parse()
            .ok()
    }

    fn spawn(&self, env: &AttemptEnv) -> Result<JobRef, Failure> {
        let harness = env.case.harness.as_ref().ok_or_else(|| {
            Failure::config(
                Stage::Submit,
                "NO_HARNESS",
                format!(
                    "case {} has no harness command: set defaults.harness",
                    env.case.case_id
                ),
            )
        })?;
        let open = |name: &str| {
            fs::File::create(env.file(name))
                .map_err(|e| submit_failure(format!("failed to create {name}: {e}")))
        };
        let (stdout, stderr) = (open(attempt_files::STDOUT)?, open(attempt_files::STDERR)?);
        let cgroup_name = env.marker().replace('/', "_");
        let memory = MemoryLimit::create(&cgroup_name, env.memory_mb());

        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(WRAPPER).arg("casebatch-wrapper");
        match harness {
            CommandSpec::Shell(s) => cmd.args(["sh", "-c", s]),
            CommandSpec::Argv(argv) => cmd.args(argv),
        };
        cmd.current_dir(env.file(attempt_files::WORKDIR))
            .envs(env.contract_env())
            .env("CASEBATCH_EXIT_FILE", env.file(attempt_files::EXIT))
            .env(
                "CASEBATCH_CGROUP_PROCS",
                memory
                    .procs_file()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            )
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // Its own group: signals to the worker's group do not reach it, and the whole
            // group can be stopped at once.
            .process_group(0);
        if let Some(url) = env
            .case
            .input
            .get("controller_url")
            .and_then(|v| v.as_str())
        {
            cmd.env("CASEBATCH_CONTROLLER_URL", url);
        }
        let child = cmd
            .spawn()
            .map_err(|e| submit_failure(format!("failed to start the harness: {e}")))?;
        let pid = child
            .id()
            .ok_or_else(|| submit_failure("the harness exited at once".into()))?;
        let start_ticks = procfs::start_ticks(pid).unwrap_or(0);
        let record = JobRecord {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker: env.marker(),
            pid,
            start_ticks,
            started_at_ms: now_ms(),
            timeout_seconds: env.case.timeout_seconds,
            memory,
        };
        write_json_atomic(&env.file(attempt_files::JOB), &record)
            .map_err(|e| submit_failure(e.to_string()))?;
        CHILDREN.lock().expect("lock").insert(env.marker(), child);
        Ok(job_ref(&record))
    }

    /// Kills the job's group (if it is still the same process) and every marked process.
    fn kill_all(&self, env: &AttemptEnv, job: Option<&JobRecord>) -> Vec<u32> {
        if let Some(job) = job {
            procfs::kill_group_if_same(job.pid, job.start_ticks);
        }
        let scan = procfs::scan_marker(&env.marker());
        for pid in &scan.marked {
            procfs::kill_pid(*pid);
        }
        scan.marked
    }

    async fn finish(
        &self,
        env: &AttemptEnv,
        job: &JobRecord,
        exit: i32,
        adopted: bool,
    ) -> ActorReport {
        let mut report = if job.memory.oom_killed() {
            oom_report(job, exit)
        } else {
            harness::classify(exit, &env.file(attempt_files::RESULT)).await
        };
        report.adopted = adopted;
        report.memory_limit_mb = job.memory.limit_mb();
        report
    }
}

fn job_ref(r: &JobRecord) -> JobRef {
    JobRef {
        marker: r.marker.clone(),
        pid: Some(r.pid),
        start_ticks: Some(r.start_ticks),
        host_queue: Some(casebatch_proto::host_task_queue(&hostname())),
    }
}

fn oom_report(job: &JobRecord, exit: i32) -> ActorReport {
    ActorReport {
        status: ActorStatus::Failed,
        exit_code: Some(exit),
        failure: Some(Failure::oom(job.memory.limit_mb())),
        adopted: false,
        memory_limit_mb: job.memory.limit_mb(),
    }
}

enum Waited {
    Exited(i32),
    TimedOut,
    Cancelled,
    OverMemory,
    Lost,
}

impl Runtime for LocalProcess {
    async fn provision(&self, env: &AttemptEnv) -> Result<(), Failure> {
        let fail = |e: std::io::Error| {
            Failure::infra(
                Stage::Provision,
                "PROVISION_IO",
                format!("{}: {e}", env.dir.display()),
            )
        };
        for sub in [attempt_files::WORKDIR, attempt_files::OUTPUT] {
            fs::create_dir_all(env.file(sub)).map_err(fail)?;
        }
        write_json_atomic(&env.file(attempt_files::INPUT), &env.case.input)
            .map_err(|e| Failure::infra(Stage::Provision, "PROVISION_IO", e.to_string()))?;
        Ok(())
    }

    async fn submit(&self, env: &AttemptEnv) -> Result<JobRef, Failure> {
        // Idempotent: a retried submit finds the job it already started.
        if let Some(job) = self.adopt(env) {
            return Ok(job);
        }
        self.spawn(env)
    }

    async fn await_job<L: Liveness>(
        &self,
        env: &AttemptEnv,
        job: &JobRef,
        live: &L,
    ) -> ActorReport {
        let Some(record) = Self::read_job(env).or_else(|| {
            // job.json lost but the heartbeat named the process: trust it only if the
            // marker still identifies it.
            let pid = job.pid?;
            let ticks = job.start_ticks?;
            procfs::scan_marker(&job.marker)
                .marked
                .contains(&pid)
                .then(|| JobRecord {
                    schema_version: RECORD_SCHEMA_VERSION.into(),
                    marker: job.marker.clone(),
                    pid,
                    start_ticks: ticks,
                    started_at_ms: now_ms(),
                    timeout_seconds: env.case.timeout_seconds,
                    memory: MemoryLimit::None,
                })
        }) else {
            return lost(env, "its job.json is missing");
        };
        let child = CHILDREN.lock().expect("lock").remove(&record.marker);
        let adopted = child.is_none();
        let deadline_ms = record.started_at_ms + record.timeout_seconds * 1000;
        let rss_limit = match record.memory {
            MemoryLimit::RssPoll { limit_mb } => Some(limit_mb * 1024 * 1024),
            _ => None,
        };

        let waited = wait(env, &record, child, live, deadline_ms, rss_limit).await;
        match waited {
            Waited::Exited(code) => self.finish(env, &record, code, adopted).await,
            Waited::TimedOut => {
                self.kill_all(env, Some(&record));
                let mut r = lost(env, "");
                r.failure = Some(Failure::infra(
                    Stage::Await,
                    codes::TIMEOUT,
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
            Waited::Cancelled => {
                self.kill_all(env, Some(&record));
                ActorReport {
                    status: ActorStatus::Cancelled,
                    exit_code: None,
                    failure: None,
                    adopted,
                    memory_limit_mb: record.memory.limit_mb(),
                }
            }
            Waited::Lost => lost(env, "its process is gone and left no exit status"),
        }
    }

    fn adopt(&self, env: &AttemptEnv) -> Option<JobRef> {
        if let Some(record) = Self::read_job(env) {
            return Some(job_ref(&record));
        }
        // Spawned but crashed before job.json was written: find the group leader by marker.
        let scan = procfs::scan_marker(&env.marker());
        let leader = scan.marked.iter().copied().min()?;
        let record = JobRecord {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker: env.marker(),
            pid: leader,
            start_ticks: procfs::start_ticks(leader)?,
            started_at_ms: now_ms(),
            timeout_seconds: env.case.timeout_seconds,
            memory: MemoryLimit::None,
        };
        write_json_atomic(&env.file(attempt_files::JOB), &record).ok()?;
        Some(job_ref(&record))
    }

    fn kill(&self, env: &AttemptEnv) {
        self.kill_all(env, Self::read_job(env).as_ref());
    }

    async fn cleanup(&self, env: &AttemptEnv) -> CleanupReceipt {
        let job = Self::read_job(env);
        let mut killed = Vec::new();
        let mut scans = 0;
        let mut remaining = Vec::new();
        // Scan again after each kill: a dying parent can leave children that re-parent.
        for round in 0..20 {
            scans += 1;
            let found = self.kill_all(env, job.as_ref());
            if found.is_empty() {
                let since = job.as_ref().map(|j| j.start_ticks);
                remaining = procfs::scan_marker_since(&env.marker(), since).unreadable;
                // Only a process that stays unreadable can keep cleanup unconfirmed.
                for _ in 0..5 {
                    if remaining.is_empty() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    remaining = procfs::recheck_unreadable(&env.marker(), &remaining);
                }
                break;
            }
            killed.extend(found.iter().copied());
            remaining = found;
            tokio::time::sleep(Duration::from_millis(20 * (round + 1))).await;
        }
        if let Some(job) = &job {
            job.memory.remove();
        }
        killed.sort_unstable();
        killed.dedup();
        let confirmed = remaining.is_empty();
        CleanupReceipt {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker: env.marker(),
            cleanup_confirmed: confirmed,
            killed,
            message: if confirmed {
                "no process carrying the allocation marker is left".into()
            } else {
                format!("processes still alive or unreadable: {remaining:?}")
            },
            remaining,
            scans,
        }
    }
}

/// Waits for the job: directly on the child when this process spawned it, else by polling
/// its exit-status file and identity (an adopted job).
async fn wait<L: Liveness>(
    env: &AttemptEnv,
    record: &JobRecord,
    mut child: Option<Child>,
    live: &L,
    deadline_ms: u64,
    rss_limit: Option<u64>,
) -> Waited {
    let job = job_ref(record);
    let mut last_beat: Option<Instant> = None;
    loop {
        if last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY) {
            live.heartbeat(&job).await;
            last_beat = Some(Instant::now());
        }
        if live.is_cancelled() {
            return Waited::Cancelled;
        }
        if now_ms() >= deadline_ms {
            return Waited::TimedOut;
        }
        if let Some(limit) = rss_limit {
            let used: u64 = procfs::scan_marker(&record.marker)
                .marked
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
                    let code = LocalProcess::exit_status(env).or_else(|| {
                        status.ok().map(|s| {
                            use std::os::unix::process::ExitStatusExt;
                            s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
                        })
                    });
                    return code.map_or(Waited::Lost, Waited::Exited);
                }
            }
            None => {
                if let Some(code) = LocalProcess::exit_status(env) {
                    return Waited::Exited(code);
                }
                if !procfs::is_same_process(record.pid, record.start_ticks) {
                    // It may have written its status just before exiting.
                    return LocalProcess::exit_status(env).map_or(Waited::Lost, Waited::Exited);
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

fn lost(env: &AttemptEnv, why: &str) -> ActorReport {
    ActorReport {
        status: ActorStatus::Failed,
        exit_code: None,
        failure: Some(Failure::infra(
            Stage::Await,
            codes::JOB_LOST,
            format!(
                "attempt {} of case {}: {why}",
                env.key.attempt, env.case.case_id
            ),
        )),
        adopted: false,
        memory_limit_mb: None,
    }
}
