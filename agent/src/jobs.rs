//! The agent's jobs: admission under the envelope, one task per job that starts and awaits it
//! with `LocalProcess`, and the live view (a `watch` channel per job not ended) that Watch,
//! Kill and Cleanup use.
//!
//! ```text
//! Submit ─admit (one lock: envelope, insert row `starting`, live entry)─► task:
//!    provision (unless a job is recorded) → LocalProcess::submit → row `running` (pid, ticks)
//!    → LocalProcess::await_job (kill flag = Liveness::is_cancelled) → row `ended` (report)
//!    → live entry removed; reads go to the table from then on
//! restart: every row not `ended` gets the same task again (submit is idempotent by the
//!    attempt's files, and await adopts by /proc identity)
//! Evaluate (ended job) ─► task: LocalProcess::evaluate in the job's cgroup → row's
//!    `evaluation` (see evaluations.rs); Cleanup stops a running one before its kill
//! ```
//!
//! Lock order: the table's connection, then the live map; the live map is never held across
//! a database call. Because a row and its live entry are created under the table lock, a
//! reader that finds a row not ended without a live entry finds the entry on a second look
//! (or the row ended meanwhile).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use casebatch_attempt::local::LocalProcess;
use casebatch_attempt::{Attempt, CleanupReceipt, EvaluationRecord, Executor, Liveness, OnCancel};
use casebatch_container::ContainerRuntime;
use casebatch_proto::runtime_v1::{self as pb, CONTRACT_VERSION, contract_of};
use casebatch_proto::{ActorReport, AttemptKey, Failure, FailureCode, JobRef, Stage};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::evaluations::{Begin, Evaluations};
use crate::table::{self, InFlight, JobRow, RowState, Table};

/// The most the agent takes on: jobs not yet ended, and their declared memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Envelope {
    pub max_concurrent: u32,
    pub memory_budget_mb: Option<u64>,
}

/// Why a call on the jobs could not be answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobError {
    #[error("no job {0:?} on this agent")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    /// A request of another contract version (`runtime.proto`): it names both.
    #[error("{0}")]
    Contract(String),
    #[error(
        "attempt key {key} belongs to another bundle ({existing}), not {submitted}: a batch id is used by two bundles"
    )]
    OtherBundle {
        key: String,
        existing: String,
        submitted: String,
    },
    /// Beyond the envelope: retryable (RUNTIME_FULL).
    #[error("{0}")]
    Full(String),
    /// Beyond the envelope whatever else ends: retrying cannot help.
    #[error("{0}")]
    NeverFits(String),
    #[error("job {0} has not ended yet; its files are fetched once it has")]
    NotEnded(String),
    /// The job is not in a state the call needs (an evaluation before the end or after
    /// cleanup).
    #[error("{0}")]
    Precondition(String),
    #[error("{0}")]
    Internal(String),
    #[error("job table: {0}")]
    Table(#[from] rusqlite::Error),
}

/// A job not yet ended: its current state for watchers, and its kill flag.
struct Live {
    batch_id: String,
    kill: Arc<AtomicBool>,
    tx: watch::Sender<pb::Job>,
}

/// `LocalProcess::await_job`'s liveness: no heartbeat (nothing to report to), cancelled by
/// Kill or Cleanup.
struct KillFlag(Arc<AtomicBool>);

#[async_trait]
impl Liveness for KillFlag {
    async fn heartbeat(&self, _job: &JobRef) {}

    fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn on_cancel(&self) -> OnCancel {
        OnCancel::Kill
    }
}

pub(crate) struct Jobs {
    table: Table,
    live: Arc<Mutex<HashMap<String, Arc<Live>>>>,
    envelope: Envelope,
    /// `D/batches`.
    batches: PathBuf,
    /// The variable holding the agent's token: never passed to a harness.
    token_env: Option<String>,
    /// `--sandbox container`: jobs that ask for a container get one on this host's engine.
    containers: Option<ContainerRuntime>,
    reattached: AtomicU32,
    /// Ended jobs removed by retention since this agent started.
    pruned: AtomicU64,
    started: std::time::Instant,
    stopping: watch::Sender<bool>,
    evaluations: Evaluations,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The wire view of a row.
pub(crate) fn to_pb(row: &JobRow) -> pb::Job {
    pb::Job {
        job_key: row.job_key.clone(),
        state: match row.state {
            RowState::Starting => pb::JobState::Starting,
            RowState::Running => pb::JobState::Running,
            RowState::Ended => pb::JobState::Ended,
        } as i32,
        pid: row.pid,
        start_ticks: row.start_ticks,
        starts: row.starts,
        report: row.report.as_ref().map(pb::ActorReport::from),
        submitted_at_ms: row.submitted_at_ms,
        ended_at_ms: row.ended_at_ms,
        memory_mb: row.memory_mb,
    }
}

pub(crate) fn receipt_to_pb(key: &str, r: &CleanupReceipt) -> pb::CleanupReceipt {
    pb::CleanupReceipt {
        job_key: key.to_string(),
        cleanup_confirmed: r.cleanup_confirmed,
        killed: r.killed.clone(),
        remaining: r.remaining.clone(),
        scans: r.scans,
        message: r.message.clone(),
        method: r.method.clone().unwrap_or_default(),
        checks: r.checks.clone(),
        escaped: r.escaped.clone(),
    }
}

fn is_ended(job: &pb::Job) -> bool {
    job.state == pb::JobState::Ended as i32
}

/// The agent's directory for a batch: readable by its batch id, unique by batch id and
/// submitted bundle (two bundles under one batch id never share attempt directories).
pub(crate) fn local_bundle(batches: &Path, batch_id: &str, bundle_dir: &str) -> PathBuf {
    let hash = hex::encode(Sha256::digest(format!("{batch_id}\0{bundle_dir}")));
    let readable: String = batch_id
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    batches.join(format!("{readable}-{}", &hash[..16]))
}

impl JobRow {
    /// The attempt as `LocalProcess` sees it: the agent's directory in place of the bundle.
    pub(crate) fn env(&self) -> Result<Attempt, String> {
        let job = self.job.clone().ok_or_else(|| {
            format!(
                "the stored job of {} is unreadable (a row from before contract v2 whose \
                 planned case could not be read)",
                self.job_key
            )
        })?;
        Ok(Attempt::new(
            AttemptKey {
                batch_id: self.batch_id.clone(),
                bundle_dir: self.local_bundle.clone(),
                case_index: self.case_index,
                attempt: self.attempt,
                memory_boost_mb: self.memory_boost_mb,
                runtime: None,
            },
            job,
        ))
    }
}

/// A submit of another contract version, refused before anything else is read: a v1 worker
/// sends its planned case as JSON and no version; a newer one a version this agent does not
/// know. The message names both versions and the side to upgrade (a worker recognises it).
pub(crate) fn contract_refusal(req: &pb::SubmitRequest) -> Option<String> {
    let theirs = contract_of(req.contract_version);
    if theirs == CONTRACT_VERSION {
        return None;
    }
    let upgrade = if theirs < CONTRACT_VERSION {
        "upgrade the worker (casebatch on the worker hosts) to this agent's version"
    } else {
        "upgrade the agent to the worker's version"
    };
    Some(format!(
        "this worker speaks contract v{theirs}, this agent speaks contract v{CONTRACT_VERSION} \
         (casebatch {}): {upgrade}",
        env!("CARGO_PKG_VERSION")
    ))
}

fn check_key(key: &pb::AttemptKey) -> Result<(), JobError> {
    let bad = |m: String| Err(JobError::Invalid(m));
    if key.batch_id.is_empty() || key.batch_id.len() > 256 {
        return bad("key.batch_id must be 1 to 256 characters".into());
    }
    if key.batch_id.contains('/') || key.batch_id.chars().any(char::is_control) {
        return bad(format!(
            "key.batch_id {:?} contains '/' or a control character",
            key.batch_id
        ));
    }
    if key.attempt == 0 {
        return bad("key.attempt starts at 1".into());
    }
    if key.bundle_dir.is_empty() {
        return bad("key.bundle_dir is empty: name the submitting batch's bundle".into());
    }
    Ok(())
}

/// The job as sent: its case index the key's, `case_dir` exactly one normal path component
/// (it becomes one under the agent's data dir), commands with a program, input one JSON object,
/// and no sandbox unless this agent provides containers (`--sandbox container`; a worker that
/// sets one must not have its job run unsandboxed).
fn check_job(job: &pb::JobSpec, key: &pb::AttemptKey, containers: bool) -> Result<(), JobError> {
    let bad = |m: String| Err(JobError::Invalid(m));
    if job.case_index != key.case_index {
        return bad(format!(
            "job.case_index is {} but key.case_index is {}",
            job.case_index, key.case_index
        ));
    }
    let mut parts = Path::new(&job.case_dir).components();
    if !matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    ) || job.case_dir.contains('\0')
    {
        return bad(format!(
            "job.case_dir {:?} is not a single directory name",
            job.case_dir
        ));
    }
    for (field, command) in [("harness", &job.harness), ("evaluator", &job.evaluator)] {
        if command.as_ref().is_some_and(|c| c.argv.is_empty()) {
            return bad(format!(
                "job.{field}.argv is empty: send the command, or leave {field} unset"
            ));
        }
    }
    job.input().map_err(JobError::Invalid)?;
    if job.sandbox.is_some() && !containers {
        return bad(
            "job.sandbox is set, but this agent runs jobs on its host only: start it with \
             `--sandbox container` (and a container engine at DOCKER_HOST) to run them in \
             containers"
                .into(),
        );
    }
    Ok(())
}

enum Admission {
    Existing(JobRow),
    Admitted(JobRow, Arc<Live>),
}

impl Jobs {
    pub(crate) fn new(
        table: Table,
        envelope: Envelope,
        batches: PathBuf,
        token_env: Option<String>,
        containers: Option<ContainerRuntime>,
    ) -> Self {
        Self {
            table,
            live: Default::default(),
            envelope,
            batches,
            token_env,
            containers,
            reattached: AtomicU32::new(0),
            pruned: AtomicU64::new(0),
            started: std::time::Instant::now(),
            stopping: watch::Sender::new(false),
            evaluations: Evaluations::default(),
        }
    }

    /// What runs `env`'s job here: the host's processes (in the job's cgroup), or, on an
    /// agent started with `--sandbox container`, a container on this host's engine for a job
    /// whose `JobSpec` asks for one (named from the job, so a restarted agent re-attaches to
    /// it by name, as a worker does). It follows from the job and the agent's setting alone,
    /// so every stage of a job (and every life of the agent) picks the same one.
    pub(crate) fn exec(&self, env: &Attempt) -> &dyn Executor {
        match &self.containers {
            Some(c) if env.job.sandbox.is_some() => c,
            _ => &LocalProcess,
        }
    }

    pub(crate) fn table(&self) -> &Table {
        &self.table
    }

    /// `D/batches`: every attempt directory of this agent is under it.
    pub(crate) fn batches(&self) -> &Path {
        &self.batches
    }

    pub(crate) fn count_pruned(&self, n: u64) {
        self.pruned.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn reattached(&self) -> u32 {
        self.reattached.load(Ordering::SeqCst)
    }

    pub(crate) fn uptime_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub(crate) fn envelope(&self) -> Envelope {
        self.envelope
    }

    /// The Prometheus text exposition of the table and the envelope, read at each scrape.
    pub(crate) async fn exposition(&self) -> String {
        let counts = self
            .table
            .with(table::count_by_state)
            .await
            .unwrap_or_default();
        let in_flight = self.table.with(table::in_flight).await.unwrap_or_default();
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, lines: Vec<(String, u64)>| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
            for (labels, value) in lines {
                out.push_str(&format!("{name}{labels} {value}\n"));
            }
        };
        let count_of = |state: RowState| {
            counts
                .iter()
                .find(|(s, _)| s == state.as_str())
                .map_or(0, |(_, n)| *n)
        };
        gauge(
            "casebatch_agent_jobs",
            "Jobs in the agent's table, by state",
            [RowState::Starting, RowState::Running, RowState::Ended]
                .into_iter()
                .map(|s| (format!("{{state=\"{}\"}}", s.as_str()), count_of(s)))
                .collect(),
        );
        gauge(
            "casebatch_agent_envelope_jobs",
            "Jobs counted against the envelope now (not ended)",
            vec![(String::new(), u64::from(in_flight.jobs))],
        );
        gauge(
            "casebatch_agent_envelope_max_jobs",
            "The envelope's job limit (--max-concurrent)",
            vec![(String::new(), u64::from(self.envelope.max_concurrent))],
        );
        gauge(
            "casebatch_agent_envelope_memory_mb",
            "Memory declared by the jobs not ended, in MB",
            vec![(String::new(), in_flight.memory_mb)],
        );
        if let Some(budget) = self.envelope.memory_budget_mb {
            gauge(
                "casebatch_agent_envelope_memory_budget_mb",
                "The envelope's declared-memory budget (--memory-budget-mb)",
                vec![(String::new(), budget)],
            );
        }
        gauge(
            "casebatch_agent_jobs_reattached",
            "Jobs not ended when this agent started, awaited again",
            vec![(String::new(), u64::from(self.reattached()))],
        );
        out.push_str(&format!(
            "# HELP casebatch_agent_jobs_pruned_total Ended jobs removed after --keep-ended, since start\n\
             # TYPE casebatch_agent_jobs_pruned_total counter\n\
             casebatch_agent_jobs_pruned_total {}\n",
            self.pruned.load(Ordering::Relaxed)
        ));
        out
    }

    /// Set when the agent stops serving: open Watch streams end.
    pub(crate) fn stopping(&self) -> &watch::Sender<bool> {
        &self.stopping
    }

    fn live(&self, key: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Gives every row not ended its task again. Called once, before serving.
    pub(crate) async fn reattach(self: &Arc<Self>) -> rusqlite::Result<()> {
        let live = self.live.clone();
        let rows = self
            .table
            .with(move |conn| {
                let rows = table::unfinished(conn)?;
                let mut map = live.lock().unwrap_or_else(|p| p.into_inner());
                Ok(rows
                    .into_iter()
                    .map(|row| {
                        let entry = Arc::new(Live {
                            batch_id: row.batch_id.clone(),
                            kill: Default::default(),
                            tx: watch::Sender::new(to_pb(&row)),
                        });
                        map.insert(row.job_key.clone(), entry.clone());
                        (row, entry)
                    })
                    .collect::<Vec<_>>())
            })
            .await?;
        self.reattached.store(rows.len() as u32, Ordering::SeqCst);
        for (row, entry) in rows {
            tracing::info!(job = %row.job_key, state = row.state.as_str(), "re-attaching");
            tokio::spawn(self.clone().drive(row, entry));
        }
        Ok(())
    }

    /// Admits the attempt (or finds it), and returns once its process is known or it ended.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        req: pb::SubmitRequest,
    ) -> Result<pb::Job, JobError> {
        if let Some(m) = contract_refusal(&req) {
            return Err(JobError::Contract(m));
        }
        let key = req
            .key
            .ok_or_else(|| JobError::Invalid("key is missing: name the attempt".into()))?;
        check_key(&key)?;
        if !req.planned_case_json.is_empty() {
            return Err(JobError::Invalid(
                "planned_case_json is set, but contract v2 sends the job in `job` only".into(),
            ));
        }
        let job = req
            .job
            .ok_or_else(|| JobError::Invalid("job is missing: send the attempt's job".into()))?;
        check_job(&job, &key, self.containers.is_some())?;
        let local = local_bundle(&self.batches, &key.batch_id, &key.bundle_dir);
        let env = Attempt::new(
            AttemptKey {
                batch_id: key.batch_id.clone(),
                bundle_dir: local.display().to_string(),
                case_index: key.case_index,
                attempt: key.attempt,
                memory_boost_mb: key.memory_boost_mb,
                runtime: None,
            },
            job,
        );
        let memory_mb = env.memory_mb();
        if let Some(budget) = self.envelope.memory_budget_mb
            && memory_mb.unwrap_or(0) > budget
        {
            return Err(JobError::NeverFits(format!(
                "attempt {} declares {} MB of memory, more than this agent's whole budget ({budget} MB, --memory-budget-mb): it can never run here",
                env.marker(),
                memory_mb.unwrap_or(0)
            )));
        }
        let row = JobRow {
            job_key: env.marker(),
            batch_id: key.batch_id.clone(),
            bundle_dir: key.bundle_dir.clone(),
            case_index: key.case_index,
            attempt: key.attempt,
            memory_boost_mb: key.memory_boost_mb,
            job: Some(env.job.clone()),
            local_bundle: local.display().to_string(),
            attempt_dir: env.dir.display().to_string(),
            memory_mb,
            state: RowState::Starting,
            pid: None,
            start_ticks: None,
            starts: 0,
            report: None,
            submitted_at_ms: now_ms(),
            ended_at_ms: None,
            cleaned_at_ms: None,
            cleanup_receipt: None,
            evaluation: None,
        };
        let envelope = self.envelope;
        let live = self.live.clone();
        let admission = self
            .table
            .with(move |conn| {
                if let Some(existing) = table::get(conn, &row.job_key)? {
                    return Ok(Ok(Admission::Existing(existing)));
                }
                let InFlight {
                    jobs,
                    memory_mb: in_use,
                } = table::in_flight(conn)?;
                if jobs >= envelope.max_concurrent {
                    return Ok(Err(format!(
                        "runtime full: {jobs} of {} jobs in flight",
                        envelope.max_concurrent
                    )));
                }
                if let Some(budget) = envelope.memory_budget_mb {
                    let wanted = row.memory_mb.unwrap_or(0);
                    if in_use + wanted > budget {
                        return Ok(Err(format!(
                            "runtime full: {in_use} MB declared in flight + {wanted} MB > budget {budget} MB"
                        )));
                    }
                }
                table::insert(conn, &row)?;
                let entry = Arc::new(Live {
                    batch_id: row.batch_id.clone(),
                    kill: Default::default(),
                    tx: watch::Sender::new(to_pb(&row)),
                });
                live.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(row.job_key.clone(), entry.clone());
                Ok(Ok(Admission::Admitted(row, entry)))
            })
            .await?
            .map_err(JobError::Full)?;
        match admission {
            Admission::Existing(existing) => {
                if existing.bundle_dir != key.bundle_dir {
                    return Err(JobError::OtherBundle {
                        key: existing.job_key,
                        existing: existing.bundle_dir,
                        submitted: key.bundle_dir,
                    });
                }
                self.get(&existing.job_key).await
            }
            Admission::Admitted(row, entry) => {
                let mut rx = entry.tx.subscribe();
                tokio::spawn(self.clone().drive(row, entry));
                // The task goes on if this caller goes away; the answer waits for the start.
                let job = rx
                    .wait_for(|j| j.state != pb::JobState::Starting as i32)
                    .await
                    .map(|j| j.clone());
                match job {
                    Ok(job) => Ok(job),
                    Err(_) => self.get(&env.marker()).await,
                }
            }
        }
    }

    /// One job's life in this agent: start (or find) it, await it, record the end.
    async fn drive(self: Arc<Self>, row: JobRow, entry: Arc<Live>) {
        let key = row.job_key.clone();
        let env = match row.env() {
            Ok(env) => env,
            Err(m) => {
                let f = Failure::infra(Stage::Submit, FailureCode::SpawnFailed, m);
                return self.end(&key, &entry, failed(f), row.starts).await;
            }
        };
        let runtime = self.exec(&env);
        let (job_ref, starts) = if row.state == RowState::Running {
            // Its process was known to an earlier life: await it by its identity and files,
            // never submit again (a lost job record must not start a second process).
            let job_ref = JobRef {
                marker: key.clone(),
                pid: row.pid,
                start_ticks: row.start_ticks,
                host_queue: None,
                runtime: None,
                queued: false,
            };
            (job_ref, row.starts.max(1))
        } else {
            let started = runtime.start_attempted(&env);
            if !started && entry.kill.load(Ordering::SeqCst) {
                // Killed before anything of it could start: nothing to stop.
                return self.end(&key, &entry, ActorReport::cancelled(), 0).await;
            }
            let submitted = async {
                if !started {
                    runtime.provision(&env).await?;
                }
                self.refuse_token_env(&env)?;
                runtime.submit(&env).await.map_err(|n| n.failure)
            }
            .await;
            match submitted {
                Ok(j) => (j, runtime.job_starts(&env).unwrap_or(1)),
                Err(f) => {
                    let starts = runtime.job_starts(&env).unwrap_or(0);
                    return self.end(&key, &entry, failed(f), starts).await;
                }
            }
        };
        let (pid, ticks) = (job_ref.pid, job_ref.start_ticks);
        let k = key.clone();
        if let Err(e) = self
            .table
            .with(move |conn| table::set_running(conn, &k, pid, ticks, starts))
            .await
        {
            // The job runs all the same; a restart finds it by its files.
            tracing::error!(job = %key, "failed to record the running job: {e}");
        }
        entry.tx.send_modify(|j| {
            j.state = pb::JobState::Running as i32;
            j.pid = pid;
            j.start_ticks = ticks;
            j.starts = starts;
        });
        let report = runtime
            .await_job(&env, &job_ref, &KillFlag(entry.kill.clone()))
            .await;
        self.end(&key, &entry, report, starts).await;
    }

    /// The agent's token never reaches a harness, even when a manifest asks for it by name.
    fn refuse_token_env(&self, env: &Attempt) -> Result<(), Failure> {
        match &self.token_env {
            Some(name) if env.job.pass_env.iter().any(|n| n == name) => Err(Failure::config(
                Stage::Submit,
                FailureCode::PassEnvUnset,
                format!(
                    "pass_env names {name}, the variable holding this agent's own bearer token, which is never passed to a harness: remove it from pass_env"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Records the end, tells the watchers, and drops the live entry (when the row is
    /// written: otherwise reads keep being answered from memory until a restart harvests it
    /// again).
    async fn end(&self, key: &str, entry: &Arc<Live>, report: ActorReport, starts: u32) {
        let ended_at = now_ms();
        let (k, r) = (key.to_string(), report.clone());
        let written = self
            .table
            .with(move |conn| table::set_ended(conn, &k, &r, starts, ended_at))
            .await;
        entry.tx.send_modify(|j| {
            j.state = pb::JobState::Ended as i32;
            j.report = Some(pb::ActorReport::from(&report));
            j.starts = starts;
            j.ended_at_ms = Some(ended_at);
        });
        match written {
            Ok(()) => {
                self.live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(key);
            }
            Err(e) => tracing::error!(job = %key, "failed to record the job's end: {e}"),
        }
    }

    async fn row(&self, key: &str) -> Result<JobRow, JobError> {
        let k = key.to_string();
        self.table
            .with(move |conn| table::get(conn, &k))
            .await?
            .ok_or_else(|| JobError::NotFound(key.to_string()))
    }

    /// The job now: from its live entry while it has one, else from the table.
    pub(crate) async fn get(&self, key: &str) -> Result<pb::Job, JobError> {
        loop {
            if let Some(entry) = self.live(key) {
                return Ok(entry.tx.borrow().clone());
            }
            let row = self.row(key).await?;
            if row.state == RowState::Ended {
                return Ok(to_pb(&row));
            }
            // Not ended: its live entry existed before the row could be read (lock order),
            // so it is there now, or the job has ended since.
            if self.live(key).is_none() && self.row(key).await?.state != RowState::Ended {
                return Ok(to_pb(&row));
            }
        }
    }

    /// A receiver of the job's changes, or the job when it has ended already.
    pub(crate) async fn subscribe(
        &self,
        key: &str,
    ) -> Result<Result<watch::Receiver<pb::Job>, pb::Job>, JobError> {
        for _ in 0..3 {
            if let Some(entry) = self.live(key) {
                return Ok(Ok(entry.tx.subscribe()));
            }
            let row = self.row(key).await?;
            if row.state == RowState::Ended {
                return Ok(Err(to_pb(&row)));
            }
        }
        // A row not ended with no live entry: only when its end could not be written.
        Ok(Err(self.get(key).await?))
    }

    /// Sets the kill flag of one job; the keys of jobs that were not ended.
    pub(crate) async fn kill_job(&self, key: &str) -> Result<Vec<String>, JobError> {
        if let Some(entry) = self.live(key) {
            entry.kill.store(true, Ordering::SeqCst);
            return Ok(vec![key.to_string()]);
        }
        self.row(key).await?;
        Ok(Vec::new())
    }

    /// Sets the kill flag of every job of the batch that is not ended.
    pub(crate) fn kill_batch(&self, batch_id: &str) -> Vec<String> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys: Vec<String> = live
            .iter()
            .filter(|(_, e)| e.batch_id == batch_id)
            .map(|(k, e)| {
                e.kill.store(true, Ordering::SeqCst);
                k.clone()
            })
            .collect();
        keys.sort();
        keys
    }

    /// Kills the job if it is not ended and waits for its end, then confirms nothing of it
    /// is left. The first receipt is kept: a repeated Cleanup returns it.
    pub(crate) async fn cleanup(&self, key: &str) -> Result<pb::CleanupReceipt, JobError> {
        let row = self.row(key).await?;
        if let Some(receipt) = &row.cleanup_receipt {
            return Ok(receipt_to_pb(key, receipt));
        }
        if let Some(entry) = self.live(key) {
            entry.kill.store(true, Ordering::SeqCst);
            let mut rx = entry.tx.subscribe();
            let _ = rx.wait_for(is_ended).await;
        }
        // No evaluator starts from now on, and a running one ends before the cgroup kill, so
        // none can join the cgroup after it.
        if let Some(mut done) = self.evaluations.close(key) {
            let _ = done.wait_for(Option::is_some).await;
        }
        let env = row.env().map_err(JobError::Invalid)?;
        let receipt = self.exec(&env).cleanup(&env).await;
        let (k, r) = (key.to_string(), receipt.clone());
        self.table
            .with(move |conn| table::set_cleaned(conn, &k, &r, now_ms()))
            .await?;
        self.evaluations.forget(key);
        Ok(receipt_to_pb(key, &receipt))
    }

    /// Runs the case's evaluator for an ended job, at most once (`evaluations.rs`), with
    /// `LocalProcess` in the job's cgroup, and returns the recorded evaluation.
    pub(crate) async fn evaluate(self: &Arc<Self>, key: &str) -> Result<pb::Evaluation, JobError> {
        let row = self.row(key).await?;
        if let Some(done) = &row.evaluation {
            return Ok(done.to_wire(key));
        }
        if !is_ended(&self.get(key).await?) {
            return Err(JobError::Precondition(format!(
                "job {key} has not ended yet; it is evaluated once it has"
            )));
        }
        let cleaned = || {
            JobError::Precondition(format!(
                "job {key} was cleaned up before it was evaluated: its evaluator can no longer \
                 run under the job's control"
            ))
        };
        let unrecorded = || {
            JobError::Internal(format!(
                "the evaluation of job {key} ended without a record; ask again"
            ))
        };
        let run = match self.evaluations.begin(key) {
            Begin::Closed => return Err(cleaned()),
            Begin::Wait(mut done) => {
                if let Ok(record) = done.wait_for(Option::is_some).await
                    && let Some(record) = record.as_ref()
                {
                    return Ok(record.to_wire(key));
                }
                let row = self.row(key).await?;
                let record = row.evaluation.ok_or_else(unrecorded)?;
                return Ok(record.to_wire(key));
            }
            Begin::Run(run) => run,
        };
        // A run that ended between the first read and `begin` recorded its evaluation first.
        let row = self.row(key).await?;
        if let Some(done) = row.evaluation {
            return Ok(done.to_wire(key));
        }
        if row.cleanup_receipt.is_some() {
            return Err(cleaned());
        }
        let env = row.env().map_err(JobError::Invalid)?;
        let job = JobRef {
            marker: key.to_string(),
            pid: row.pid,
            start_ticks: row.start_ticks,
            host_queue: None,
            runtime: None,
            queued: false,
        };
        let jobs = self.clone();
        let k = key.to_string();
        // A task of its own: the evaluation ends and is recorded even if the caller goes away.
        let task = tokio::spawn(async move {
            let record = match jobs.refuse_token_env(&env) {
                Err(f) => EvaluationRecord::failed(Failure {
                    stage: Stage::Evaluate,
                    ..f
                }),
                Ok(()) => {
                    jobs.exec(&env)
                        .evaluate(&env, &job, &KillFlag(run.stop.clone()))
                        .await
                }
            };
            let recorded = jobs
                .table
                .with(move |conn| {
                    table::set_evaluation(conn, &k, &record)?;
                    table::get(conn, &k)
                })
                .await?
                .and_then(|row| row.evaluation);
            // The first record stands: the one just written, or one written before it.
            if let Some(r) = &recorded {
                run.finish(r.clone());
            }
            Ok::<_, JobError>(recorded)
        });
        let recorded = task.await.map_err(|e| {
            JobError::Internal(format!("the evaluation of job {key} failed: {e}"))
        })??;
        Ok(recorded.ok_or_else(unrecorded)?.to_wire(key))
    }

    /// The attempt directory of an ended job.
    pub(crate) async fn artifacts_dir(&self, key: &str) -> Result<PathBuf, JobError> {
        if !is_ended(&self.get(key).await?) {
            return Err(JobError::NotEnded(key.to_string()));
        }
        Ok(PathBuf::from(self.row(key).await?.attempt_dir))
    }

    pub(crate) async fn in_flight(&self) -> Result<InFlight, JobError> {
        Ok(self.table.with(table::in_flight).await?)
    }
}

fn failed(f: Failure) -> ActorReport {
    ActorReport::failed(f, None)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_batch_directory_is_readable_and_unique_per_bundle() {
        let root = Path::new("/d/batches");
        let a = local_bundle(root, "web eval/1", "/w/out/a");
        let b = local_bundle(root, "web eval/1", "/w/out/b");
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("web_eval_1-"), "{name}");
        assert_eq!(a.parent().unwrap(), root);
    }
}
