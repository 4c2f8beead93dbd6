//! The executor seam: what every runtime does with an attempt, implemented once per runtime
//! (`local::LocalProcess`, containers, the agent client, the simulation), and the properties
//! in which runtimes differ. The worker picks one executor per attempt in one place
//! (`casebatch_runtime::Runtimes::executor`), an agent in its own (`--sandbox`); the stages
//! above never ask which runtime they hold.
//!
//! Every operation is keyed by the attempt: `submit` is idempotent (a retried submit returns
//! the job it already started), `await_job` reports liveness through heartbeats, `adopt`
//! finds a job by its key without trusting a stale pid, and `cleanup` confirms that nothing
//! of the attempt is left.

use async_trait::async_trait;
use casebatch_proto::{ActorReport, Failure, JobRef};

use crate::Attempt;
use crate::records::{CleanupReceipt, EvaluationRecord};

/// One place where attempts run.
#[async_trait]
pub trait Executor: Send + Sync {
    /// Prepare a fresh environment for the attempt.
    async fn provision(&self, attempt: &Attempt) -> Result<(), Failure>;
    /// Start the attempt's job; if it was already started, return that job instead.
    async fn submit(&self, attempt: &Attempt) -> Result<JobRef, NotStarted>;
    /// Wait for the job to end, heartbeating its reference; kills it past its timeout, and on
    /// cancel does what [`Liveness::on_cancel`] says.
    async fn await_job(&self, attempt: &Attempt, job: &JobRef, live: &dyn Liveness) -> ActorReport;
    /// Run the job's evaluator for an attempt whose actor ended, where the actor ran and
    /// under the attempt's control (its cgroup or sandbox, so cleanup's kill and receipt
    /// cover it; its memory limit; the harness's environment allowlist), heartbeating `job`
    /// while it waits. Returns the attempt's evaluation record.
    async fn evaluate(
        &self,
        attempt: &Attempt,
        job: &JobRef,
        live: &dyn Liveness,
    ) -> EvaluationRecord;
    /// Find the attempt's job (still running or finished) by its key.
    fn adopt(&self, attempt: &Attempt) -> Option<JobRef>;
    /// Stop the attempt's job, verifying identity first.
    fn kill(&self, attempt: &Attempt);
    /// Stop everything of the attempt and confirm it is gone.
    async fn cleanup(&self, attempt: &Attempt) -> CleanupReceipt;

    // What differs by runtime, asked of the executor instead of matched on its kind.

    /// Whether `start` may settle the job it started: the wait can end early (handing the job
    /// back untouched) and nothing long follows the actor.
    fn settles_at_start(&self, attempt: &Attempt) -> bool;
    /// The task queue of the host whose processes hold the job (`settle` and `cleanup` are
    /// routed there), or `None` when any worker can reach it.
    fn host_queue(&self) -> Option<String>;
    /// Processes started for the attempt's job, as the runtime counts them (`None` where it
    /// starts none, or cannot tell).
    fn job_starts(&self, attempt: &Attempt) -> Option<u32>;
    /// Whether a start of the attempt's job was attempted (its intent is recorded).
    fn start_attempted(&self, attempt: &Attempt) -> bool;
    /// Whether the job lives on another host that keeps its own record of it (an agent):
    /// a submit that never reached it left nothing to clean up there, and a retried wait
    /// stands for re-attaching to the job.
    fn is_remote(&self) -> bool;
    /// Whether the runtime itself tells, in its report, when a wait re-attached to a job
    /// another process started (`ActorReport::adopted`).
    fn tells_adoption(&self) -> bool;
}

/// How an awaiting stage reports liveness and learns of cancellation.
#[async_trait]
pub trait Liveness: Sync {
    async fn heartbeat(&self, job: &JobRef);
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
