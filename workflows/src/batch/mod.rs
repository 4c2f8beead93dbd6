//! `BatchWorkflow`: one workflow per batch. Admits cases up to the concurrency limit (which an
//! operator can change while it runs), obeys drain / pause / unpause / cancel / supersede (as
//! signals, or as updates that a validator can refuse), answers the `status` query, and
//! continues as new before history grows large.
//!
//! Its lifecycle is [`Lifecycle`] (one enum, one transition function); the run itself
//! ([`run`]) is a loop of three steps: admit what the policies allow, wait for the first
//! event, record it; when nothing is in flight it ends, continues as new, or sleeps:
//!
//! ```text
//!  start → Running ⇄ Paused
//!            │ drain → Draining ──(in-flight done)──→ end: Drained   (queued work kept)
//!            │ cancel → Cancelling ─(cleanup done)──→ end: Cancelled (done work kept)
//!            │ supersede → sweep (kill by batch) + Cancelling → end: Superseded (killed cases queued)
//!            │ history budget → stop admitting ─────→ continue-as-new (state carried)
//!            └─ every case terminal ────────────────→ end: Completed
//! ```

mod queue_limit;
mod run;
mod state;

use casebatch_proto::share::{ShareChange, ShareSettings, Ticket};
use casebatch_proto::{BatchInput, BatchOutcome, BatchStatus, CONCURRENCY_RANGE, Phase};
use temporalio_macros::workflow_methods;
use temporalio_sdk::{SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult};

pub use self::state::BatchWorkflow;
use self::state::Verdict;
use crate::lifecycle::Control;

#[workflow_methods]
impl BatchWorkflow {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, input: BatchInput) -> Self {
        Self::from_input(input)
    }

    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<BatchOutcome> {
        run::run(ctx).await
    }

    /// Admit nothing new; admitted cases finish; the run then ends as drained.
    #[signal(name = "drain")]
    pub fn drain(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply(ctx, Control::Drain);
    }

    /// Stop admissions; the run keeps waiting.
    #[signal(name = "pause")]
    pub fn pause(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply(ctx, Control::Pause);
    }

    /// Restart admissions after a pause.
    #[signal(name = "unpause")]
    pub fn unpause(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply(ctx, Control::Unpause);
    }

    /// Cancel in-flight cases (their cleanup still runs) and end as cancelled.
    #[signal(name = "cancel")]
    pub fn cancel(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply(ctx, Control::Cancel);
    }

    /// Stop admissions, force-kill the batch's running jobs on every runtime and end as
    /// superseded; finished work stays, killed cases are queued again.
    #[signal(name = "supersede")]
    pub fn supersede(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply(ctx, Control::Supersede);
    }

    /// `supersede`, checked: refused only once the run is over. Returns the phase.
    #[update(name = "supersede")]
    pub fn supersede_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply(ctx, Control::Supersede)
    }

    #[update_validator(supersede_checked)]
    fn validate_supersede(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.check(Control::Supersede)
    }

    /// `set_concurrency` as a signal (unchecked, so clamped to the accepted range).
    #[signal(name = "set_concurrency")]
    pub fn set_concurrency_signal(&mut self, ctx: &mut SyncWorkflowContext<Self>, limit: u32) {
        let limit = limit.clamp(*CONCURRENCY_RANGE.start(), *CONCURRENCY_RANGE.end());
        self.apply_concurrency(ctx, limit);
    }

    /// Sets the active case limit while the batch runs. Returns the previous limit.
    #[update(name = "set_concurrency")]
    pub fn set_concurrency(&mut self, ctx: &mut SyncWorkflowContext<Self>, limit: u32) -> u32 {
        self.apply_concurrency(ctx, limit)
    }

    #[update_validator(set_concurrency)]
    fn validate_set_concurrency(&self, _ctx: &WorkflowContextView, limit: &u32) -> Verdict {
        if !CONCURRENCY_RANGE.contains(limit) {
            return Err(format!(
                "concurrency {limit} is outside {}..={}",
                CONCURRENCY_RANGE.start(),
                CONCURRENCY_RANGE.end()
            )
            .into());
        }
        match self
            .lifecycle
            .refuses_admission_changes("set the concurrency")
        {
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    }

    /// `drain`, checked: refused once the batch is cancelling or over. Returns the phase.
    #[update(name = "drain")]
    pub fn drain_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply(ctx, Control::Drain)
    }

    #[update_validator(drain_checked)]
    fn validate_drain(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.check(Control::Drain)
    }

    /// `pause`, checked: refused while draining (nothing more is admitted anyway), cancelling
    /// or over. Returns the phase.
    #[update(name = "pause")]
    pub fn pause_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply(ctx, Control::Pause)
    }

    #[update_validator(pause_checked)]
    fn validate_pause(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.check(Control::Pause)
    }

    /// `unpause`, checked: refused unless the batch is paused. Returns the phase.
    #[update(name = "unpause")]
    pub fn unpause_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply(ctx, Control::Unpause)
    }

    #[update_validator(unpause_checked)]
    fn validate_unpause(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.check(Control::Unpause)
    }

    /// `cancel`, checked: refused only once the run is over (cancelling twice is harmless).
    /// Returns the phase.
    #[update(name = "cancel")]
    pub fn cancel_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply(ctx, Control::Cancel)
    }

    #[update_validator(cancel_checked)]
    fn validate_cancel(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.check(Control::Cancel)
    }

    /// A shared runtime's slots granted this ticket a slot (a grant for an earlier run of
    /// the batch is not this run's).
    #[signal(name = "slot_granted")]
    pub fn slot_granted(&mut self, ctx: &mut SyncWorkflowContext<Self>, ticket: Ticket) {
        self.shared.actions.controls += 1;
        if ticket.run_id == ctx.run_id()
            && let Some(shares) = self.shared.shares.as_mut()
        {
            shares.grant(ticket.case, ticket.attempt);
        }
    }

    /// Sets the batch's priority and weight on its shared runtimes while it runs (its next
    /// asks carry them). Returns the previous ones.
    #[update(name = "set_share")]
    pub fn set_share(
        &mut self,
        ctx: &mut SyncWorkflowContext<Self>,
        to: ShareChange,
    ) -> ShareChange {
        self.shared.actions.controls += 1;
        let Some(shares) = self.shared.shares.as_mut() else {
            return to;
        };
        let before = shares.change(to);
        let at_ms = crate::shared::epoch_ms(ctx.workflow_time());
        let note = format!(
            "share set: priority {} → {}, weight {} → {}",
            before.priority, to.priority, before.weight, to.weight
        );
        self.shared.push_step(at_ms, None, note);
        before
    }

    #[update_validator(set_share)]
    fn validate_set_share(&self, _ctx: &WorkflowContextView, to: &ShareChange) -> Verdict {
        ShareSettings::check(to.priority, to.weight)?;
        if self.shared.shares.is_none() {
            return Err(
                "this batch runs on no shared runtime (an agent): it has no share to set".into(),
            );
        }
        match self.lifecycle.refuses_admission_changes("set the share") {
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    }

    /// Per-state counts, in-flight cases, counters and the progress timeline.
    #[query(name = "status")]
    pub fn status(&self, _ctx: &WorkflowContextView) -> BatchStatus {
        self.snapshot()
    }
}
