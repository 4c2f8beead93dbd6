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

mod run;

use std::collections::BTreeSet;

use casebatch_proto::{
    BatchInput, BatchOutcome, BatchStatus, CONCURRENCY_RANGE, CaseSlot, CaseState, Counters,
    Counts, Phase, UnrecordedFailure,
};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult};

use crate::circuits::Circuits;
use crate::envelopes::Envelopes;
use crate::lifecycle::{Control, Lifecycle};
use crate::shared::{Host, Shared, epoch_ms};
use crate::tail::Tail;

#[workflow]
pub struct BatchWorkflow {
    input: BatchInput,
    slots: Vec<CaseSlot>,
    counters: Counters,
    segment: u32,
    lifecycle: Lifecycle,
    /// Active case limit: the input's until an operator sets another.
    concurrency: u32,
    /// Admission against runtime envelopes; `None` when no runtime declares one.
    admission: Option<Envelopes>,
    /// Cases admitted at once while open circuits hold the batch below `concurrency`, as
    /// last recorded ([`BatchWorkflow::record_width`]).
    width: Option<u32>,
    /// What the cases see and change of the batch.
    shared: Shared,
    in_flight: BTreeSet<u32>,
    /// Final failures the bundle could not hold (its worker may not write there).
    unrecorded: Vec<UnrecordedFailure>,
}

impl Host for BatchWorkflow {
    fn shared(&self) -> &Shared {
        &self.shared
    }

    fn shared_mut(&mut self) -> &mut Shared {
        &mut self.shared
    }

    fn lifecycle(&self) -> Lifecycle {
        self.lifecycle
    }
}

#[workflow_methods]
impl BatchWorkflow {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, mut input: BatchInput) -> Self {
        let carried = input.carried.take().unwrap_or_default();
        let mut slots = carried.slots;
        slots.resize(input.case_count as usize, CaseSlot::default());
        for s in &mut slots {
            // A case running when its run ended was not finished: it is queued again (its
            // next attempt adopts the job if it is still alive).
            if s.state == CaseState::Running {
                s.state = CaseState::Queued;
            }
        }
        let concurrency = carried.concurrency.unwrap_or(input.concurrency);
        // Runtimes with an envelope take no more than it at once; the rest wait here.
        let admission = Envelopes::new(&input, &slots);
        let circuits = Circuits::new(&input);
        // Only a routed case has somewhere else to run a duplicate.
        let tail = circuits
            .as_ref()
            .and(input.speculation.as_ref())
            .map(Tail::new);
        Self {
            input,
            slots,
            counters: carried.counters,
            segment: carried.segment + 1,
            lifecycle: Lifecycle::starting(carried.paused),
            concurrency,
            admission,
            width: None,
            shared: Shared {
                circuits,
                tail,
                timeline: carried.timeline,
                ..Shared::default()
            },
            in_flight: BTreeSet::new(),
            unrecorded: carried.unrecorded,
        }
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

    /// Per-state counts, in-flight cases, counters and the progress timeline.
    #[query(name = "status")]
    pub fn status(&self, _ctx: &WorkflowContextView) -> BatchStatus {
        self.snapshot()
    }
}

/// What an update validator returns: `Err` refuses the update, with the reason.
type Verdict = Result<(), Box<dyn std::error::Error + Send + Sync>>;

impl BatchWorkflow {
    /// Whether the lifecycle accepts `control` now (an update's validator).
    fn check(&self, control: Control) -> Verdict {
        self.lifecycle.on(control).map(|_| ()).map_err(Into::into)
    }

    /// Applies an operator's control: a refused one (a signal, unchecked) changes nothing.
    /// Either way the admission loop is woken. Returns the phase after it.
    fn apply(&mut self, ctx: &SyncWorkflowContext<Self>, control: Control) -> Phase {
        if let Ok(step) = self.lifecycle.on(control) {
            self.lifecycle = step.next;
            if let Some(note) = step.note {
                let at_ms = epoch_ms(ctx.workflow_time());
                self.shared.push_step(at_ms, None, note.to_string());
            }
        }
        self.shared.wake();
        self.lifecycle.phase()
    }

    /// Returns the previous limit.
    fn apply_concurrency(&mut self, ctx: &SyncWorkflowContext<Self>, limit: u32) -> u32 {
        let before = std::mem::replace(&mut self.concurrency, limit);
        if before != limit {
            let at_ms = epoch_ms(ctx.workflow_time());
            let message = format!("concurrency {before} → {limit} (set by operator)");
            self.shared.push_step(at_ms, None, message);
        }
        self.shared.wake();
        before
    }

    /// The number of cases admitted at once: the concurrency limit, narrowed while circuits
    /// are open ([`Circuits::width`]). A pure query: [`Self::record_width`] records changes.
    fn width(&self) -> u32 {
        let limit = self.concurrency.max(1);
        self.shared
            .circuits
            .as_ref()
            .map_or(limit, |c| c.width(limit))
    }

    /// Records a change of [`Self::width`] since it was last recorded: a timeline step
    /// (returned, to be noted) and a count. `None`: unchanged.
    fn record_width(&mut self) -> Option<String> {
        let limit = self.concurrency.max(1);
        let now = self.width();
        let now = (now < limit).then_some(now);
        if now == self.width {
            return None;
        }
        let from = self.width.unwrap_or(limit);
        let why = match (now, &self.shared.circuits) {
            (Some(_), Some(c)) => format!("circuit open on {}", c.open_names()),
            _ => "circuits closed".to_string(),
        };
        self.width = now;
        self.counters.width_changes += 1;
        Some(format!(
            "concurrency {from} → {}: {why}",
            now.unwrap_or(limit)
        ))
    }

    fn snapshot(&self) -> BatchStatus {
        BatchStatus {
            batch_id: self.input.batch_id.clone(),
            phase: self.lifecycle.phase(),
            counts: Counts::of(&self.slots),
            in_flight: self.in_flight.iter().copied().collect(),
            counters: self.counters.clone(),
            timeline: self.shared.timeline.clone(),
            segment: self.segment,
            concurrency: self.concurrency,
            envelopes: self
                .admission
                .as_ref()
                .map(Envelopes::usage)
                .unwrap_or_default(),
            width: self.width,
            open_circuits: self
                .shared
                .circuits
                .as_ref()
                .map(Circuits::open_circuits)
                .unwrap_or_default(),
            speculate_after_ms: self.shared.tail.as_ref().and_then(Tail::threshold_ms),
            prepared: self.shared.prepared.iter().copied().collect(),
            unrecorded: self.unrecorded.clone(),
        }
    }
}
