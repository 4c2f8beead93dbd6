//! Runtimes: where an attempt's job actually runs, and the local machinery that runs it
//! (processes, their identity in `/proc`, memory limits, the harness contract).
//!
//! The [`Runtime`] trait is shaped for remote runtimes ([`agent::AgentRuntime`]): every
//! operation is keyed by the attempt, `submit` is idempotent, `await_job` reports liveness
//! through heartbeats, `adopt` finds a job by its case key without trusting a stale pid, and
//! `cleanup` confirms that nothing of the attempt is left.

pub mod agent;
pub mod attempt_io;
pub mod case_env;
pub mod cgroup;
pub mod evaluator;
pub mod fake;
pub mod harness;
pub mod job_spec;
pub mod local_process;
pub mod marker_walks;
pub mod memlimit;
pub mod plain_command;
pub mod procfs;
pub mod scratch;
pub mod spawned;
mod stat_cache;
pub mod token;

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Deref;
use std::path::PathBuf;

use casebatch_bundle::Bundle;
use casebatch_manifest::model::{PlannedCase, RuntimeSpec};
use casebatch_proto::runtime_v1::JobSpec;
use casebatch_proto::{ActorReport, AttemptKey, Failure, JobRef};

// What the local machinery hands back and the names of the files it lays out in an attempt
// directory: re-exported so that the agent, which serves attempt directories this machinery
// made, sees them here and needs nothing of the bundle crate.
pub use casebatch_bundle::layout::attempt_files;
pub use casebatch_bundle::{AttemptJournal, CleanupReceipt, EvaluationRecord};

/// One attempt as the local machinery runs it (on a worker's host or on an agent's): its
/// key, its job, and where its files go. Nothing of the manifest.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub key: AttemptKey,
    pub job: JobSpec,
    pub bundle: Bundle,
    /// `cases/<case_dir>/attempts/<n>/`.
    pub dir: PathBuf,
}

impl Attempt {
    /// The attempt of `job` under the bundle (or agent directory) `key.bundle_dir`.
    pub fn new(key: AttemptKey, job: JobSpec) -> Self {
        let bundle = Bundle::at(&key.bundle_dir);
        let dir = bundle.attempt(&job.case_dir, key.attempt);
        Self {
            key,
            job,
            bundle,
            dir,
        }
    }

    pub fn marker(&self) -> String {
        self.key.marker()
    }

    /// The value of [`procfs::MARKER_ENV`] in the attempt's processes, which cleanup's scans
    /// look for: the marker with a hash of the attempt's directory, as its cgroup is named.
    /// The marker alone (`batch/case/attempt`) is the same in two bundles of one batch id on a
    /// host (a copied manifest, a second checkout), and one's cleanup killed the other's
    /// processes.
    pub fn process_marker(&self) -> String {
        cgroup::name_for(&self.marker(), &self.dir)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The attempt's working directory and input file on this host, outside the bundle.
    pub fn scratch(&self) -> scratch::Scratch {
        scratch::Scratch::for_attempt(&self.marker(), &self.dir)
    }

    /// Reads the attempt's journal (its engine records), as this process keeps it.
    pub fn journal(
        &self,
    ) -> Result<std::sync::Arc<casebatch_bundle::AttemptJournal>, casebatch_bundle::BundleError>
    {
        casebatch_bundle::AttemptJournal::read(&self.dir)
    }

    /// Appends to the attempt's journal.
    pub fn record(
        &self,
        entries: &[casebatch_bundle::Entry],
    ) -> Result<(), casebatch_bundle::BundleError> {
        casebatch_bundle::journal::append(&self.dir, entries)
    }

    /// Memory limit for this attempt: the job's declared one, or the boosted one.
    pub fn memory_mb(&self) -> Option<u64> {
        self.key.memory_boost_mb.or(self.job.memory_mb())
    }

    /// The job's harness: `config/NO_HARNESS` when the case has none (every runtime that
    /// starts one refuses alike).
    pub fn harness(&self) -> Result<&casebatch_proto::runtime_v1::Command, Failure> {
        self.job
            .harness
            .as_ref()
            .filter(|c| !c.argv.is_empty())
            .ok_or_else(|| {
                Failure::config(
                    casebatch_proto::Stage::Submit,
                    casebatch_proto::FailureCode::NoHarness,
                    format!(
                        "case {} has no harness command: set defaults.harness",
                        self.job.case_id
                    ),
                )
            })
    }

    /// The harness contract's environment variables (see docs/harness.md).
    pub fn contract_env(&self) -> BTreeMap<String, String> {
        let path = |name: &str| self.file(name).display().to_string();
        let mut env = BTreeMap::new();
        env.insert("CASEBATCH_BATCH_ID".into(), self.key.batch_id.clone());
        env.insert("CASEBATCH_CASE_ID".into(), self.job.case_id.clone());
        env.insert("CASEBATCH_ATTEMPT".into(), self.key.attempt.to_string());
        env.insert(
            "CASEBATCH_INPUT".into(),
            self.scratch().input.display().to_string(),
        );
        env.insert("CASEBATCH_OUTPUT_DIR".into(), path(attempt_files::OUTPUT));
        env.insert("CASEBATCH_RESULT".into(), path(attempt_files::RESULT));
        env.insert(crate::procfs::MARKER_ENV.into(), self.process_marker());
        env
    }
}

/// An attempt on the worker: the [`Attempt`] the machinery runs (its job built from the
/// planned case at this one edge, [`job_spec::from_planned`]), plus what only the worker
/// uses: the planned case itself (routing, the fake runtime's script, the bundle's records)
/// and the runtimes-table entry it names. Derefs to the [`Attempt`].
#[derive(Debug, Clone)]
pub struct AttemptEnv {
    pub attempt: Attempt,
    pub case: PlannedCase,
    /// The runtimes-table entry the case names (`PlannedCase::runtime_name`), for runtimes
    /// reached through one (an agent); `None` for the built-in ones.
    pub runtime_spec: Option<RuntimeSpec>,
}

impl Deref for AttemptEnv {
    type Target = Attempt;

    fn deref(&self) -> &Attempt {
        &self.attempt
    }
}

impl AttemptEnv {
    pub fn new(key: AttemptKey, case: PlannedCase) -> Self {
        Self {
            attempt: Attempt::new(key, job_spec::from_planned(&case)),
            case,
            runtime_spec: None,
        }
    }

    /// The same attempt, on the runtimes-table entry `spec` (the one the case names).
    pub fn with_runtime_spec(mut self, spec: RuntimeSpec) -> Self {
        self.runtime_spec = Some(spec);
        self
    }

    /// The same attempt, reaching its runtime with `secs` of patience for an agent that does
    /// not answer (the cleanup of an attempt whose agent stopped answering for its job).
    pub fn with_unreachable_grace(mut self, secs: u64) -> Self {
        if let Some(spec) = self.runtime_spec.as_mut() {
            spec.unreachable_grace_s = Some(secs);
        }
        self
    }
}

/// How an awaiting activity reports liveness and learns of cancellation.
pub trait Liveness: Sync {
    fn heartbeat(&self, job: &JobRef) -> impl Future<Output = ()> + Send;
    fn is_cancelled(&self) -> bool;
    /// What a cancel means for the job ([`OnCancel::EndWait`] unless said otherwise).
    fn on_cancel(&self) -> OnCancel {
        OnCancel::EndWait
    }
}

/// A submit that started nothing the runtime confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotStarted {
    pub failure: Failure,
    /// The request may have reached the runtime without an answer coming back, so a job of
    /// the attempt may run there all the same (a remote runtime that stopped answering).
    pub job_may_exist: bool,
}

impl From<Failure> for NotStarted {
    /// A failure of the runtime's own making: nothing was started.
    fn from(failure: Failure) -> Self {
        Self {
            failure,
            job_may_exist: false,
        }
    }
}

/// What a cancelled wait does with its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCancel {
    /// Only the wait ends; the job runs on. A worker's wait is cancelled by the engine for
    /// reasons that say nothing about the job: a batch cancel (the attempt's cleanup kills it
    /// next), a worker stopping, or heartbeats the engine did not answer in time (a stalled
    /// engine, whose retry of the wait re-attaches to the job). Killing there would turn an
    /// engine stall into a re-run of every job in flight.
    EndWait,
    /// The cancel is a request to stop the job itself (an agent's Kill or Cleanup).
    Kill,
}

/// One place where attempts run.
pub trait Runtime: Send + Sync {
    /// Prepare a fresh environment for the attempt.
    fn provision(&self, env: &AttemptEnv) -> impl Future<Output = Result<(), Failure>> + Send;
    /// Start the attempt's job; if it was already started, return that job instead.
    fn submit(&self, env: &AttemptEnv) -> impl Future<Output = Result<JobRef, NotStarted>> + Send;
    /// Wait for the job to end, heartbeating its reference; kills it past its timeout, and on
    /// cancel does what [`Liveness::on_cancel`] says.
    fn await_job<L: Liveness>(
        &self,
        env: &AttemptEnv,
        job: &JobRef,
        live: &L,
    ) -> impl Future<Output = ActorReport> + Send;
    /// Run the job's evaluator (`env.job.evaluator`) for an attempt whose actor ended, where
    /// the actor ran and under the attempt's control: its cgroup (so cleanup's kill and
    /// receipt cover it), its memory limit, its working directory, the harness's environment
    /// allowlist; heartbeating `job` while it waits. Returns the attempt's evaluation record.
    fn evaluate<L: Liveness>(
        &self,
        env: &AttemptEnv,
        job: &JobRef,
        live: &L,
    ) -> impl Future<Output = EvaluationRecord> + Send;
    /// Find the attempt's job (still running or finished) by its case key.
    fn adopt(&self, env: &AttemptEnv) -> Option<JobRef>;
    /// Stop the attempt's job, verifying identity first.
    fn kill(&self, env: &AttemptEnv);
    /// Stop everything of the attempt and confirm it is gone.
    fn cleanup(&self, env: &AttemptEnv) -> impl Future<Output = CleanupReceipt> + Send;
}
