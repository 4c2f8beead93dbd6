//! Inputs and outputs of the per-case stage activities.
//!
//! Every activity is keyed by [`AttemptKey`], which makes it idempotent by
//! `(batch_id, case_index, attempt)`: a retried `submit` finds the job it already started.

use serde::{Deserialize, Serialize};

use crate::breaker::Circuit;
use crate::failure::Failure;

/// Identity of one attempt of one case, plus where its bundle lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AttemptKey {
    pub batch_id: String,
    /// Absolute path of `<output-dir>/<batch_id>`; shared storage in cluster mode.
    pub bundle_dir: String,
    pub case_index: u32,
    /// Starts at 1.
    pub attempt: u32,
    /// Extra memory granted to this attempt only (OOM escalation); the manifest is unchanged.
    #[serde(default)]
    pub memory_boost_mb: Option<u64>,
    /// The runtime this attempt is routed to, for a case dealt from a `runtime:` list (the
    /// plan's share, or another runtime of the list after a spillover). `None`: the plan's
    /// runtime, and no circuit breaker is consulted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

impl AttemptKey {
    /// The allocation marker: inherited by every process of the attempt, so cleanup can find
    /// descendants that detached, and adoption can find a job without trusting a stale pid.
    pub fn marker(&self) -> String {
        format!("{}/{}/{}", self.batch_id, self.case_index, self.attempt)
    }
}

/// What `provision` and `submit` report. `Err` means the stage failed with a classified failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum StageResult {
    Ok,
    Failed(Failure),
}

/// A reference to a started job, heartbeated by `await` so a retry can re-attach to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobRef {
    pub marker: String,
    pub pid: Option<u32>,
    /// Process start time in clock ticks since boot (`/proc/<pid>/stat` field 22): with the
    /// pid it names one process, never a recycled pid.
    pub start_ticks: Option<u64>,
    /// Task queue of the host the job runs on: `await` must run where the process is.
    /// `None` for runtimes whose jobs can be awaited from anywhere.
    #[serde(default)]
    pub host_queue: Option<String>,
    /// The runtimes-table entry (an agent) holding the job: any worker can reach it there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The job waits in a queue of its runtime's own (a cluster scheduler's) before it runs,
    /// for as long as that takes: its wait has no deadline but its heartbeats, and its
    /// timeout counts from when it runs, as the scheduler enforces it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
}

/// Status of the actor, kept apart from the evaluator's verdict and cleanup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActorStatus {
    /// Exited 0 (or said it finished in its result JSON).
    Finished,
    /// Exited non-zero, was killed, timed out or could not start.
    Failed,
    /// Stopped by a batch cancel.
    Cancelled,
}

/// What `await` returns once the job is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ActorReport {
    pub status: ActorStatus,
    pub exit_code: Option<i32>,
    pub failure: Option<Failure>,
    /// True when this result was harvested from a job started before a crash.
    #[serde(default)]
    pub adopted: bool,
    /// The memory limit that was enforced on the job, if any.
    #[serde(default)]
    pub memory_limit_mb: Option<u64>,
    /// What the harness reported the attempt consumed (its result's `usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::Usage>,
    /// How long the harness asked to wait before the next attempt, with a declared
    /// `RATE_LIMITED` failure (`retry_after_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// What the log cap dropped of the job's `stdout.log` and `stderr.log` (`None`: both
    /// were within it). Boxed: rare, and every report in a workflow's memory carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_capped: Option<Box<LogsCapped>>,
}

/// Bytes the log cap dropped from the middle of an attempt's logs, and the cap (per file).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct LogsCapped {
    pub cap_bytes: u64,
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

impl ActorReport {
    /// A job that failed as `failure` says, with the exit status it ended with, if any.
    pub fn failed(failure: crate::Failure, exit_code: Option<i32>) -> Self {
        Self {
            status: ActorStatus::Failed,
            exit_code,
            failure: Some(failure),
            adopted: false,
            memory_limit_mb: None,
            usage: None,
            retry_after_ms: None,
            logs_capped: None,
        }
    }

    /// A job stopped by a cancel, before it could end on its own.
    pub fn cancelled() -> Self {
        Self {
            status: ActorStatus::Cancelled,
            exit_code: None,
            failure: None,
            adopted: false,
            memory_limit_mb: None,
            usage: None,
            retry_after_ms: None,
            logs_capped: None,
        }
    }
}

/// The evaluator's verdict on the actor's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
}

/// What `evaluate` returns. `verdict: None` with no failure means no evaluator is configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Evaluation {
    pub configured: bool,
    pub verdict: Option<Verdict>,
    pub failure: Option<Failure>,
}

/// The compact record of one finished attempt: what the workflow decided from the stages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AttemptSummary {
    pub attempt: u32,
    pub actor: Option<ActorStatus>,
    pub exit_code: Option<i32>,
    pub evaluation_configured: bool,
    pub verdict: Option<Verdict>,
    /// The failure that decides this attempt's outcome (first one born), if any.
    pub failure: Option<Failure>,
    /// A trace-collection failure that kept the work (reported apart).
    #[serde(default)]
    pub collect_failure: Option<Failure>,
    #[serde(default)]
    pub adopted: bool,
    #[serde(default)]
    pub memory_boost_mb: Option<u64>,
    /// The memory limit the job ran under (what an OOM auto-boost doubles).
    #[serde(default)]
    pub memory_limit_mb: Option<u64>,
    /// Set once cleanup has run: whether it confirmed nothing of the attempt is left.
    #[serde(default)]
    pub cleanup_confirmed: Option<bool>,
    /// Workflow time (ms since the epoch) the attempt was dispatched, and the time its job
    /// settled; absent in records made before they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// One of two copies of the case raced by tail speculation that lost: its job was killed
    /// and cleaned up, and it is kept as evidence, never as the case's result.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub speculative_loser: bool,
    /// Dispatched as the one probe of a runtime whose circuit was open (its cooldown over).
    /// A probe that fails costs the case nothing: it moves on like any infra dispatch failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub probe: bool,
    /// Its runtime stopped answering for its job and the case moved to another runtime of its
    /// list: the job may have run on. It is cleaned up (killed) once that runtime answers, and
    /// kept as evidence, never as the case's result.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stranded: bool,
    /// What the harness reported the attempt consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::Usage>,
    /// The wait a rate-limited attempt's harness asked for before the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// What the log cap dropped of the job's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_capped: Option<Box<LogsCapped>>,
}

impl AttemptSummary {
    /// Folds `settle`'s report into the summary.
    pub fn apply_settled(&mut self, settled: &Settled) {
        let actor = &settled.actor;
        self.actor = Some(actor.status);
        self.exit_code = actor.exit_code;
        self.failure = actor.failure.clone();
        self.adopted = actor.adopted;
        self.memory_limit_mb = actor.memory_limit_mb;
        self.usage = actor.usage.clone();
        self.retry_after_ms = actor.retry_after_ms;
        self.logs_capped = actor.logs_capped.clone();
        if let Some(eval) = &settled.evaluation {
            self.evaluation_configured = eval.configured;
            self.verdict = eval.verdict;
            if eval.failure.is_some() {
                self.failure = eval.failure.clone();
            }
        }
        self.collect_failure = settled.collect_failure.clone();
    }

    /// The summary of an attempt before any stage has reported.
    pub fn new(key: &AttemptKey) -> Self {
        Self {
            attempt: key.attempt,
            actor: None,
            exit_code: None,
            evaluation_configured: false,
            verdict: None,
            failure: None,
            collect_failure: None,
            adopted: false,
            memory_boost_mb: key.memory_boost_mb,
            memory_limit_mb: None,
            cleanup_confirmed: None,
            started_at_ms: None,
            ended_at_ms: None,
            speculative_loser: false,
            probe: false,
            stranded: false,
            usage: None,
            retry_after_ms: None,
            logs_capped: None,
        }
    }

    /// Evidence of the case, never its result: a speculation's loser, or a stranded attempt.
    pub fn is_evidence_only(&self) -> bool {
        self.speculative_loser || self.stranded
    }

    /// How long the attempt ran, dispatch to settle, when both ends are known.
    pub fn duration_ms(&self) -> Option<u64> {
        Some(self.ended_at_ms?.saturating_sub(self.started_at_ms?))
    }
}

/// The longest the cleanup of an attempt whose runtime did not answer for its job waits for
/// that runtime to answer (a job that ran on there is stopped once it does): five times the
/// runtime's `unreachable_grace_s`, capped here, all of it when it declares none. Its
/// activity's deadline is a minute more.
pub const UNANSWERED_WAIT_S: u64 = 300;

/// Input of `cleanup`: it also records the attempt (cleanup runs for every provisioned attempt,
/// so it is the one stage that sees every outcome).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CleanupInput {
    pub key: AttemptKey,
    pub summary: AttemptSummary,
    /// Whether the workflow will run another attempt of this case.
    pub will_retry: bool,
    /// `start` failed without reaching the runtime (every try was refused a connection, or
    /// the runtime answered with a refusal): the runtime holds nothing to stop or ask about.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub never_submitted: bool,
    /// The runtime did not answer for the attempt's job: cleanup waits longer for it to
    /// answer, so a job that ran on there is found and stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub patient: bool,
}

/// The cleanup receipt's essentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CleanupReport {
    pub cleanup_confirmed: bool,
    pub failure: Option<Failure>,
    /// The runtime held a job of this attempt when it was cleaned up (for a stranded attempt:
    /// a job paid for twice).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held_job: bool,
    /// Heartbeats the cleanup sent (Temporal actions).
    #[serde(default, skip_serializing_if = "crate::is_zero_u32")]
    pub heartbeats: u32,
}

/// Input of `finalize`: writes the batch-level files of the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FinalizeInput {
    pub batch_id: String,
    pub bundle_dir: String,
    pub status: crate::batch::BatchStatus,
}

/// What `submit` returns: the started (or already running) job, or a classified failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum SubmitResult {
    Started(JobRef),
    Failed(Failure),
}

/// Input of `await`: the attempt and the job `submit` started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AwaitInput {
    pub key: AttemptKey,
    pub job: JobRef,
}

/// What `start` (provision + submit in one activity) reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum StartResult {
    /// The job runs (or already ran) for this attempt.
    Started(JobRef),
    /// Provision or submit failed with a classified failure (its stage says which). Cleanup is
    /// still due, on `host_queue` where the attempt's environment was made.
    Failed {
        failure: Failure,
        host_queue: Option<String>,
        /// The runtime's circuit after this failure was reported to its breaker (routed
        /// attempts only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        circuit: Option<Circuit>,
        /// The runtime may hold a job of this attempt all the same: a submit whose request may
        /// have reached it and got no answer. `false`: nothing of the attempt can run there.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        job_may_exist: bool,
    },
    /// The runtime's circuit is open: nothing was provisioned or started, and nothing needs
    /// cleaning up. The attempt goes elsewhere (or waits for the circuit).
    Skipped { circuit: Circuit },
    /// `start` watched the job ([`SettleShort`]) and it still runs: as `Started`, with the
    /// heartbeats the watch sent (Temporal actions).
    Watched { job: JobRef, heartbeats: u32 },
    /// The job ended while `start` watched it ([`SettleShort`]), and `start` settled it as
    /// `settle` would have (closed too, when final): no `settle` follows.
    Settled { job: JobRef, settled: Box<Settled> },
}

/// Input of `start`. A run that lets `start` settle a short job sends [`StartInput::Settling`];
/// runs recorded before that, and dispatches that may not settle, send the bare key (which is
/// what every `start` input was before).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum StartInput {
    Settling {
        key: AttemptKey,
        settle: Box<SettleShort>,
    },
    Key(AttemptKey),
}

impl StartInput {
    pub fn key(&self) -> &AttemptKey {
        match self {
            StartInput::Settling { key, .. } | StartInput::Key(key) => key,
        }
    }

    /// How `start` may settle its job, if it may.
    pub fn settle(&self) -> Option<&SettleShort> {
        match self {
            StartInput::Settling { settle, .. } => Some(settle),
            StartInput::Key(_) => None,
        }
    }
}

impl From<AttemptKey> for StartInput {
    fn from(key: AttemptKey) -> Self {
        StartInput::Key(key)
    }
}

/// `start` may wait up to `within_ms` for the job it started; a job that ends by then is
/// settled (and, when final, closed from `close_from`) by `start` itself: one engine round
/// trip for a short case instead of two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SettleShort {
    pub within_ms: u64,
    /// The attempt's summary so far, as for [`SettleInput::close_from`].
    pub close_from: AttemptSummary,
}

/// What `prepare` (provision ahead of need) reports: where the environment was made, so the
/// release of an unused one runs there; or why it could not be made (its `start` then
/// provisions again, and fails as provision failures always do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Prepared {
    pub host_queue: Option<String>,
    pub failure: Option<Failure>,
}

/// Input of `release`: an environment provisioned ahead for an attempt that will not start in
/// this run (the batch drains, is cancelled or superseded first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReleaseInput {
    pub key: AttemptKey,
    /// Why it is released, for its record: `drain`, `cancel` or `supersede`.
    pub why: String,
}

/// Input of `settle`: the attempt and the job `start` started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SettleInput {
    pub key: AttemptKey,
    pub job: JobRef,
    /// The attempt's summary so far, when the workflow lets `settle` close a final attempt:
    /// one that ran to its end and succeeded, or failed for a reason no retry, boost or
    /// spillover changes. `settle` then cleans it up and records it itself, and the
    /// `cleanup` round trip through the engine is saved. `None`: `cleanup` follows as ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_from: Option<AttemptSummary>,
    /// The slot the job holds on a shared runtime: `settle` gives it back the moment the job
    /// has ended, before it evaluates and records, so the next case starts at once (the
    /// batch gives it back again once the attempt closes unless `settle` says the slots have
    /// it; a second return is a no-op).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<crate::share::HeldSlot>,
}

/// What `settle` returns: the actor's report and, for a finished actor, the evaluation and
/// the trace pull. Echoes its attempt key, so the workflow can check that a result belongs to
/// the case it resolves (a guard against any replay mix-up).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Settled {
    pub key: AttemptKey,
    pub actor: ActorReport,
    /// `None` when the actor did not finish (nothing to judge).
    pub evaluation: Option<Evaluation>,
    /// A trace-collection failure that kept the work.
    pub collect_failure: Option<Failure>,
    /// The attempt as recorded, when `settle` closed it (see [`SettleInput::close_from`]):
    /// the final summary, its end time and cleanup confirmation included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<AttemptSummary>,
    /// Heartbeats the settle sent (Temporal actions).
    #[serde(default, skip_serializing_if = "crate::is_zero_u32")]
    pub heartbeats: u32,
    /// `settle` gave the attempt's slot on a shared runtime back, and the slots have it: the
    /// batch gives it back no more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slot_returned: bool,
}

/// Input of `sweep`: kill every job of a batch on every runtime of its plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SweepInput {
    pub batch_id: String,
    pub bundle_dir: String,
}

/// What `sweep` did, per runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SweepReport {
    /// Jobs killed, as `<runtime>: <job key>`.
    pub killed: Vec<String>,
    /// Runtimes that could not be asked, with why (their jobs end with their cases' cleanup).
    pub unreachable: Vec<String>,
}
