//! One attempt as it goes through its stages, and its `settle`.

use std::time::Duration;

use casebatch_proto::share::HeldSlot;
use casebatch_proto::{
    ActorStatus, AttemptKey, AttemptSummary, JobRef, SettleInput, Settled, Stage,
};
use futures::future::LocalBoxFuture;
use temporalio_sdk::{
    ActivityCancellationType, ActivityExecutionError, WorkflowCancellationToken, WorkflowContext,
};

use super::options::{retry_policy, stage_options};
use super::outcome::{apply_settled, is_timeout, mark_error, mark_job_lost};
use super::params::CaseParams;
use crate::contracts::Settle;
use crate::decide::Next;
use crate::shared::{Host, cost, workflow_ms};

/// How an attempt ended: its summary, what comes next, and the attempts it leaves behind
/// (stranded, or a speculation's loser) whose cleanup is still to run.
pub(super) struct AttemptEnd {
    pub(super) summary: AttemptSummary,
    pub(super) next: Next,
    pub(super) left_behind: Vec<InFlight>,
}

/// An attempt in flight, as the workflow follows it through its stages: where it runs and
/// what it reported so far.
pub(super) struct InFlight {
    pub(super) key: AttemptKey,
    pub(super) host_queue: Option<String>,
    pub(super) summary: AttemptSummary,
    /// `settle` cleaned up and recorded the attempt (its summary is the recorded one).
    pub(super) closed: bool,
    /// `start` started a job for it (a loser that held one was paid for twice).
    pub(super) held_job: bool,
    /// `start` never reached the runtime: its cleanup asks nothing of it.
    pub(super) never_submitted: bool,
    /// `settle` gave the attempt's slot back, and the slots have it.
    pub(super) slot_returned: bool,
}

impl InFlight {
    /// Folds `settle`'s outcome into the summary (`token`: the one the settle ran under).
    pub(super) fn settled<H: Host>(
        &mut self,
        ctx: &WorkflowContext<H>,
        token: &WorkflowCancellationToken,
        result: Result<Settled, ActivityExecutionError>,
    ) {
        let s = &mut self.summary;
        let mut recorded = None;
        match result {
            Ok(settled) => {
                cost(ctx, |a| a.heartbeats += settled.heartbeats);
                self.slot_returned = settled.slot_returned;
                apply_settled(s, &self.key, &settled);
                recorded = settled.closed;
            }
            Err(e) if !token.is_cancelled() && is_timeout(&e) => mark_job_lost(s, &e),
            Err(e) => mark_error(s, token, Stage::Await, &e),
        }
        s.ended_at_ms = Some(workflow_ms(ctx));
        if let Some(recorded) = recorded {
            // settle closed it: exactly what the bundle holds, end time and cleanup included.
            *s = recorded;
            self.closed = true;
        }
        // The tail's median learns from every attempt that ran to its end.
        if s.actor == Some(ActorStatus::Finished)
            && let Some(ms) = s.duration_ms()
        {
            ctx.state_mut(|st| {
                if let Some(t) = st.shared_mut().tail.as_mut() {
                    t.ran(ms);
                }
            });
        }
    }

    pub(super) fn ran_to_end(&self) -> bool {
        self.summary.actor == Some(ActorStatus::Finished)
    }
}

/// How long `settle` may wait for a job its runtime's scheduler queues (`JobRef::queued`):
/// its deadline is the scheduler's, from when the job runs; a dead worker's wait is still
/// noticed by its heartbeats within seconds.
const QUEUED_WAIT: Duration = Duration::from_secs(30 * 24 * 3600);

/// `settle` of a started job, as an owned future (it may race a duplicate's).
#[allow(clippy::too_many_arguments)]
pub(super) fn settle_job<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    stage: &str,
    key: &AttemptKey,
    job: JobRef,
    close_from: Option<AttemptSummary>,
    host_queue: Option<String>,
    token: &WorkflowCancellationToken,
    slot: Option<HeldSlot>,
) -> LocalBoxFuture<'static, Result<Settled, ActivityExecutionError>> {
    // The actor's limit, then the evaluator's (at least a minute), then slack; a job queued
    // by its runtime's scheduler waits there as long as it takes, watched by heartbeats.
    let timeout = if job.queued {
        QUEUED_WAIT
    } else {
        Duration::from_secs(2 * p.max_timeout_seconds.max(60) + 120)
    };
    let mut opts = stage_options(ctx, stage, key, timeout, host_queue, token);
    // On cancel, wait until the activity has stopped its job, so cleanup never races a
    // process that is still being killed.
    opts.cancellation_type = ActivityCancellationType::WaitCancellationCompleted;
    opts.retry_policy = Some(retry_policy(Duration::from_millis(500), 20));
    let input = SettleInput {
        key: key.clone(),
        job,
        close_from,
        slot,
    };
    let ctx = ctx.clone();
    Box::pin(async move {
        cost(&ctx, |a| a.activities += 1);
        ctx.execute_activity(Settle, input, opts).await
    })
}
