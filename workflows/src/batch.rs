//! `BatchWorkflow`: one workflow per batch. Admits cases up to the concurrency limit (which an
//! operator can change while it runs), obeys drain / pause / unpause / cancel (as signals, or as
//! updates that a validator can refuse), answers the `status` query, and continues as new
//! before history grows large.
//!
//! Lifecycle of one run:
//!
//! ```text
//!            ┌──────── pause ───────┐
//!            ▼                      │
//!  start → Running ⇄ Paused    (unpause)
//!            │ drain → Draining ──(in-flight done)──→ end: Drained   (queued work kept)
//!            │ cancel → Cancelling ─(cleanup done)──→ end: Cancelled (done work kept)
//!            │ supersede → sweep (kill by batch) + Cancelling → end: Superseded (killed cases queued)
//!            │ history budget → stop admitting ─────→ continue-as-new (state carried)
//!            └─ every case terminal ────────────────→ end: Completed
//! ```

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, UNIX_EPOCH};

use casebatch_proto::{
    BatchEnd, BatchInput, BatchOutcome, BatchStatus, CONCURRENCY_RANGE, Carried, CaseSlot,
    CaseState, Counters, Counts, FinalizeInput, Phase, SweepInput, TimelineStep, UnrecordedFailure,
    visibility::{outcome, outcome_of},
};
use futures::future::LocalBoxFuture;
use temporalio_common::RetryPolicy;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ActivityOptions, ContinueAsNewOptions, LocalActivityOptions, SyncWorkflowContext,
    WorkflowCancellationToken, WorkflowContext, WorkflowContextView, WorkflowResult,
};

use crate::admission::Envelopes;
use crate::case::{CaseDone, CaseParams, CleanedUp, LeftBehind, Pipeline, run_case};
use crate::circuits::Circuits;
use crate::contracts::{Finalize, Sweep};
use crate::tail::Tail;
use crate::visibility;

/// The timeline keeps its newest steps only, so history stays compact.
const TIMELINE_KEEP: usize = 200;
/// Continue-as-new once history passes this many events. Temporal's hard limit is 51,200
/// events (and 50 MB); the server's earlier *suggestion* (about 4K events) is not followed,
/// because every continue-as-new briefly stops admissions while in-flight cases finish.
const DEFAULT_HISTORY_BUDGET: u32 = 20_000;

#[workflow]
pub struct BatchWorkflow {
    input: BatchInput,
    slots: Vec<CaseSlot>,
    counters: Counters,
    timeline: Vec<TimelineStep>,
    segment: u32,
    paused: bool,
    pub(crate) draining: bool,
    pub(crate) cancelling: bool,
    /// Cancelling because the batch is superseded: its jobs are force-killed on every runtime
    /// and the killed cases go back to the queue.
    pub(crate) superseding: bool,
    /// Active case limit: the input's until an operator sets another.
    concurrency: u32,
    /// Admission against runtime envelopes; `None` when no runtime declares one.
    admission: Option<Envelopes>,
    /// The batch's view of its runtimes' circuits; `None` when no case names a list.
    pub(crate) circuits: Option<Circuits>,
    /// Cases admitted at once while open circuits hold the batch below `concurrency`.
    width: Option<u32>,
    /// Tail speculation's view of the batch; `None` when it is off or nothing is routed.
    pub(crate) tail: Option<Tail>,
    /// Bumped by every control signal (and every circuit seen opening or closing) so the
    /// admission loop wakes up.
    pub(crate) control_gen: u64,
    in_flight: BTreeSet<u32>,
    /// Cases admitted ahead of a free slot (`prepare_ahead`): provisioning or provisioned,
    /// still queued; each leaves it when granted a slot or released.
    pub(crate) prepared: BTreeSet<u32>,
    /// Final failures the bundle could not hold (its worker may not write there).
    unrecorded: Vec<UnrecordedFailure>,
    finished: bool,
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
            timeline: carried.timeline,
            segment: carried.segment + 1,
            paused: carried.paused,
            draining: false,
            cancelling: false,
            superseding: false,
            concurrency,
            admission,
            circuits,
            width: None,
            tail,
            control_gen: 0,
            in_flight: BTreeSet::new(),
            prepared: BTreeSet::new(),
            unrecorded: carried.unrecorded,
            finished: false,
        }
    }

    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<BatchOutcome> {
        // First, before any command: a run keeps the pipeline its history began with.
        let pipeline = Pipeline::of_run(ctx);
        let settle_closes = pipeline.settle_closes(ctx);
        let outage_rules = pipeline.outage_rules(ctx);
        let requested = ctx.state(|s| s.input.search_attributes);
        let visible = visibility::of_run(ctx, requested);
        // Finished cases not yet in the search attributes: published once the activation
        // that recorded them has nothing more to do, so a burst of completions costs one
        // upsert, not one each.
        let mut unpublished = false;
        let (segment, counts) = ctx.state(|s| (s.segment, Counts::of(&s.slots)));
        note(
            ctx,
            None,
            format!(
                "segment {segment} started: {} queued, {} done",
                counts.queued,
                counts.done()
            ),
        );
        // In-flight case work is cancelled through this token (child of the workflow's own
        // cancellation, so `temporal workflow cancel` works too); cleanup uses detached tokens.
        let case_cancel = ctx.cancellation_token().child_token();
        let budget = ctx.state(|s| s.input.history_budget.unwrap_or(DEFAULT_HISTORY_BUDGET));
        let mut inflight: Vec<(u32, LocalBoxFuture<'static, CaseDone>)> = Vec::new();
        // Cleanups of attempts finished cases left behind (stranded, a speculation's loser),
        // still running: they take no slot, and the run ends only once they have.
        let mut left_behind: Vec<LeftBehind> = Vec::new();
        let mut cursor = 0usize;
        // Wakes the loop when the next straggler is due for speculation: (due at, timer).
        let mut tail_timer: Option<(u64, LocalBoxFuture<'static, ()>)> = None;

        loop {
            let (paused, draining, cancelling, gen_seen) =
                ctx.state(|s| (s.paused, s.draining, s.cancelling, s.control_gen));
            let history_full = ctx.history_length() >= budget;

            if cancelling && !case_cancel.is_cancelled() {
                case_cancel.cancel();
                if ctx.state(|s| s.superseding) {
                    sweep(ctx).await;
                }
            }
            let admitting = !paused && !draining && !cancelling && !history_full;
            // Whether admission ran out of cases (not of room): the tail may have begun.
            let mut exhausted = false;
            // Cases provisioned ahead wait in `inflight` without a slot; they are next in
            // line (once history is full too: they were admitted).
            let held = ctx.state(|s| s.prepared.len());
            if admitting || (held > 0 && !paused && !draining && !cancelling) {
                // Read on every pass: a lowered limit lets running cases finish and admits
                // nothing until fewer run; a raised one admits at once. Open circuits narrow it
                // the same way, never cancelling what runs. Duplicates take room too.
                let limit = width(ctx) as usize;
                let mut running = inflight.len() - held;
                while running + tail_load(ctx) < limit && grant_prepared(ctx) {
                    running += 1;
                }
                while admitting && running + tail_load(ctx) < limit {
                    let Some(index) = next_case(ctx, &mut cursor) else {
                        exhausted = true;
                        break;
                    };
                    let case = admit(
                        ctx,
                        index,
                        false,
                        pipeline,
                        (settle_closes, outage_rules),
                        &case_cancel,
                    );
                    inflight.push(case);
                    running += 1;
                }
                // Then the next cases provision ahead of need.
                let ahead = ctx.state(|s| s.input.prepare_ahead) as usize;
                while admitting && ctx.state(|s| s.prepared.len()) < ahead {
                    let Some(index) = next_case(ctx, &mut cursor) else {
                        break;
                    };
                    let case = admit(
                        ctx,
                        index,
                        true,
                        pipeline,
                        (settle_closes, outage_rules),
                        &case_cancel,
                    );
                    inflight.push(case);
                }
            }
            if exhausted && !inflight.is_empty() {
                let room = width(ctx) as usize;
                let room = room.saturating_sub(inflight.len() + tail_load(ctx)) as u32;
                tail_timer = speculate_due(ctx, room, tail_timer);
            } else {
                tail_timer = None;
            }

            if inflight.is_empty() && left_behind.is_empty() {
                let queued = ctx.state(|s| s.slots.iter().any(|c| !c.state.is_terminal()));
                if cancelling {
                    let end = if ctx.state(|s| s.superseding) {
                        BatchEnd::Superseded
                    } else {
                        BatchEnd::Cancelled
                    };
                    return finish(ctx, end, visible).await;
                }
                if !queued {
                    return finish(ctx, BatchEnd::Completed, visible).await;
                }
                if draining {
                    return finish(ctx, BatchEnd::Drained, visible).await;
                }
                if history_full {
                    // The next run inherits the search attributes: bring them up to date.
                    if std::mem::take(&mut unpublished) {
                        publish_running(ctx);
                    }
                    return continue_as_new(ctx);
                }
                // Paused with nothing in flight: sleep until a control signal arrives.
                if std::mem::take(&mut unpublished) {
                    publish_running(ctx);
                }
                let _ = ctx
                    .wait_condition(move |s: &Self| s.control_gen != gen_seen)
                    .await;
                if ctx.cancellation_token().is_cancelled() {
                    ctx.state_mut(|s| s.cancelling = true);
                }
                continue;
            }

            // Wait for the first of: a case finishing, or a control signal. Polled in index
            // order with poll_fn (not an unordered futures set, which trips the SDK's determinism
            // detector). Once cancelling, only the cases matter: a wait_condition built after
            // the workflow's own cancellation resolves at once, and polling it would spin
            // without ever yielding the workflow task.
            let mut control = (!cancelling)
                .then(|| Box::pin(ctx.wait_condition(move |s: &Self| s.control_gen != gen_seen)));
            let event = std::future::poll_fn(|cx| {
                for (i, (_, fut)) in inflight.iter_mut().enumerate() {
                    if let Poll::Ready(done) = fut.as_mut().poll(cx) {
                        return Poll::Ready(Event::Case(i, Box::new(done)));
                    }
                }
                for (i, fut) in left_behind.iter_mut().enumerate() {
                    if let Poll::Ready(cleaned) = fut.as_mut().poll(cx) {
                        return Poll::Ready(Event::LeftBehind(i, cleaned));
                    }
                }
                if let Some((_, timer)) = tail_timer.as_mut()
                    && timer.as_mut().poll(cx).is_ready()
                {
                    // A straggler is due: the next pass asks it.
                    tail_timer = None;
                    return Poll::Ready(Event::Other);
                }
                match control.as_mut().map(|c| Pin::new(c).poll(cx)) {
                    Some(Poll::Ready(_)) => Poll::Ready(Event::Other),
                    _ => {
                        // Nothing more can happen in this activation: its completions are
                        // all recorded, so publish them now, in one upsert.
                        if std::mem::take(&mut unpublished) {
                            publish_running(ctx);
                        }
                        Poll::Pending
                    }
                }
            })
            .await;
            drop(control);

            match event {
                Event::Case(i, mut done) => {
                    // Remove in place: keeps the admission order of the rest.
                    drop(inflight.remove(i));
                    ctx.state_mut(|s| {
                        if let Some(admission) = s.admission.as_mut() {
                            admission.finished(done.case_index);
                        }
                    });
                    left_behind.append(&mut done.left_behind);
                    record_case(ctx, *done);
                    unpublished = visible;
                }
                Event::LeftBehind(i, cleaned) => {
                    drop(left_behind.remove(i));
                    record_cleaned(ctx, cleaned);
                }
                Event::Other => {
                    if ctx.cancellation_token().is_cancelled() {
                        ctx.state_mut(|s| s.cancelling = true);
                    }
                }
            }
        }
    }

    /// Admit nothing new; admitted cases finish; the run then ends as drained.
    #[signal(name = "drain")]
    pub fn drain(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply_drain(ctx);
    }

    /// Stop admissions; the run keeps waiting.
    #[signal(name = "pause")]
    pub fn pause(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply_pause(ctx);
    }

    /// Restart admissions after a pause.
    #[signal(name = "unpause")]
    pub fn unpause(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply_unpause(ctx);
    }

    /// Cancel in-flight cases (their cleanup still runs) and end as cancelled.
    #[signal(name = "cancel")]
    pub fn cancel(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply_cancel(ctx);
    }

    /// Stop admissions, force-kill the batch's running jobs on every runtime and end as
    /// superseded; finished work stays, killed cases are queued again.
    #[signal(name = "supersede")]
    pub fn supersede(&mut self, ctx: &mut SyncWorkflowContext<Self>) {
        self.apply_supersede(ctx);
    }

    /// `supersede`, checked: refused only once the run is over. Returns the phase.
    #[update(name = "supersede")]
    pub fn supersede_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply_supersede(ctx);
        self.phase()
    }

    #[update_validator(supersede_checked)]
    fn validate_supersede(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        if self.finished {
            return Err("the batch's run is over".into());
        }
        Ok(())
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
        self.still_admitting("set the concurrency")
    }

    /// `drain`, checked: refused once the batch is cancelling or over. Returns the phase.
    #[update(name = "drain")]
    pub fn drain_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply_drain(ctx);
        self.phase()
    }

    #[update_validator(drain_checked)]
    fn validate_drain(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.still_admitting("drain")
    }

    /// `pause`, checked: refused while draining (nothing more is admitted anyway), cancelling
    /// or over. Returns the phase.
    #[update(name = "pause")]
    pub fn pause_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply_pause(ctx);
        self.phase()
    }

    #[update_validator(pause_checked)]
    fn validate_pause(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.still_admitting("pause")?;
        if self.draining {
            return Err("the batch is draining: it admits nothing more anyway".into());
        }
        Ok(())
    }

    /// `unpause`, checked: refused unless the batch is paused. Returns the phase.
    #[update(name = "unpause")]
    pub fn unpause_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply_unpause(ctx);
        self.phase()
    }

    #[update_validator(unpause_checked)]
    fn validate_unpause(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        self.still_admitting("unpause")?;
        if !self.paused {
            return Err("the batch is not paused".into());
        }
        Ok(())
    }

    /// `cancel`, checked: refused only once the run is over (cancelling twice is harmless).
    /// Returns the phase.
    #[update(name = "cancel")]
    pub fn cancel_checked(&mut self, ctx: &mut SyncWorkflowContext<Self>) -> Phase {
        self.apply_cancel(ctx);
        self.phase()
    }

    #[update_validator(cancel_checked)]
    fn validate_cancel(&self, _ctx: &WorkflowContextView, _: &()) -> Verdict {
        if self.finished {
            return Err("the batch's run is over".into());
        }
        Ok(())
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
    fn apply_drain(&mut self, ctx: &SyncWorkflowContext<Self>) {
        if !self.draining {
            self.draining = true;
            self.push_note(ctx, "drain requested: no new admissions".into());
        }
        self.control_gen += 1;
    }

    fn apply_pause(&mut self, ctx: &SyncWorkflowContext<Self>) {
        if !self.paused {
            self.paused = true;
            self.push_note(ctx, "paused".into());
        }
        self.control_gen += 1;
    }

    fn apply_unpause(&mut self, ctx: &SyncWorkflowContext<Self>) {
        if self.paused {
            self.paused = false;
            self.push_note(ctx, "unpaused".into());
        }
        self.control_gen += 1;
    }

    fn apply_cancel(&mut self, ctx: &SyncWorkflowContext<Self>) {
        if !self.cancelling {
            self.cancelling = true;
            self.push_note(
                ctx,
                "cancel requested: in-flight cases are being cancelled".into(),
            );
        }
        self.control_gen += 1;
    }

    fn apply_supersede(&mut self, ctx: &SyncWorkflowContext<Self>) {
        if !self.superseding {
            self.superseding = true;
            self.cancelling = true;
            self.push_note(
                ctx,
                "superseded: admissions stopped, running jobs are being killed".into(),
            );
        }
        self.control_gen += 1;
    }

    /// Returns the previous limit.
    fn apply_concurrency(&mut self, ctx: &SyncWorkflowContext<Self>, limit: u32) -> u32 {
        let before = std::mem::replace(&mut self.concurrency, limit);
        if before != limit {
            self.push_note(
                ctx,
                format!("concurrency {before} → {limit} (set by operator)"),
            );
        }
        self.control_gen += 1;
        before
    }

    /// Refuses an operation that only makes sense while the batch may still admit cases.
    fn still_admitting(&self, action: &str) -> Verdict {
        if self.finished {
            Err(format!("cannot {action}: the batch's run is over").into())
        } else if self.cancelling {
            Err(format!("cannot {action}: the batch is being cancelled").into())
        } else {
            Ok(())
        }
    }

    fn phase(&self) -> Phase {
        if self.finished {
            Phase::Finished
        } else if self.cancelling {
            Phase::Cancelling
        } else if self.draining {
            Phase::Draining
        } else if self.paused {
            Phase::Paused
        } else {
            Phase::Running
        }
    }

    fn snapshot(&self) -> BatchStatus {
        BatchStatus {
            batch_id: self.input.batch_id.clone(),
            phase: self.phase(),
            counts: Counts::of(&self.slots),
            in_flight: self.in_flight.iter().copied().collect(),
            counters: self.counters.clone(),
            timeline: self.timeline.clone(),
            segment: self.segment,
            concurrency: self.concurrency,
            envelopes: self
                .admission
                .as_ref()
                .map(Envelopes::usage)
                .unwrap_or_default(),
            width: self.width,
            open_circuits: self
                .circuits
                .as_ref()
                .map(Circuits::open_circuits)
                .unwrap_or_default(),
            speculate_after_ms: self.tail.as_ref().and_then(Tail::threshold_ms),
            prepared: self.prepared.iter().copied().collect(),
            unrecorded: self.unrecorded.clone(),
        }
    }

    fn push_note(&mut self, ctx: &SyncWorkflowContext<Self>, message: String) {
        let at_ms = ctx
            .workflow_time()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        push_step(&mut self.timeline, at_ms, None, message);
    }
}

fn push_step(timeline: &mut Vec<TimelineStep>, at_ms: u64, case: Option<u32>, message: String) {
    timeline.push(TimelineStep {
        at_ms,
        case,
        message,
    });
    if timeline.len() > TIMELINE_KEEP {
        let excess = timeline.len() - TIMELINE_KEEP;
        timeline.drain(..excess);
    }
}

/// Adds a timeline step now (case steps are mostly added when the case ends).
pub(crate) fn note(ctx: &WorkflowContext<BatchWorkflow>, case: Option<u32>, message: String) {
    let at_ms = ctx
        .workflow_time()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    ctx.state_mut(|s| push_step(&mut s.timeline, at_ms, case, message));
}

/// The number of cases admitted at once: the concurrency limit, narrowed while circuits are
/// open ([`Circuits::width`]). Each change is a timeline step and counted.
fn width(ctx: &WorkflowContext<BatchWorkflow>) -> u32 {
    let (limit, before, now, open) = ctx.state(|s| {
        let limit = s.concurrency.max(1);
        let (now, open) = match &s.circuits {
            Some(c) => (c.width(limit), c.open_names()),
            None => (limit, String::new()),
        };
        (limit, s.width, now, open)
    });
    let now = (now < limit).then_some(now);
    if now != before {
        let from = before.unwrap_or(limit);
        let to = now.unwrap_or(limit);
        let why = if now.is_some() {
            format!("circuit open on {open}")
        } else {
            "circuits closed".to_string()
        };
        note(ctx, None, format!("concurrency {from} → {to}: {why}"));
        ctx.state_mut(|s| {
            s.width = now;
            s.counters.width_changes += 1;
        });
    }
    now.unwrap_or(limit)
}

/// The next case to admit: by envelope when runtimes declare one, else in plan order.
fn next_case(ctx: &WorkflowContext<BatchWorkflow>, cursor: &mut usize) -> Option<u32> {
    match ctx.state_mut(|s| s.admission.as_mut().map(Envelopes::next)) {
        Some(next) => next,
        None => next_queued(ctx, cursor),
    }
}

/// Admits case `index`: running now, or (`ahead`) provisioning ahead of a free slot, held in
/// the prepared set until [`grant_prepared`] gives it one. Returns its future.
fn admit(
    ctx: &WorkflowContext<BatchWorkflow>,
    index: u32,
    ahead: bool,
    pipeline: Pipeline,
    (settle_closes, outage_rules): (bool, bool),
    case_cancel: &WorkflowCancellationToken,
) -> (u32, LocalBoxFuture<'static, CaseDone>) {
    let params = ctx.state_mut(|s| {
        if ahead {
            s.prepared.insert(index);
        } else {
            s.slots[index as usize].state = CaseState::Running;
            s.in_flight.insert(index);
        }
        CaseParams {
            batch_id: s.input.batch_id.clone(),
            bundle_dir: s.input.bundle_dir.clone(),
            case_index: index,
            attempts_before: s.slots[index as usize].attempts,
            policy: crate::decide::Policy {
                max_retries: s.input.max_retries,
                oom_auto_boost: s.input.oom_auto_boost,
            },
            memory_boost_mb: s.input.memory_boosts.get(&index).copied(),
            retry_backoff_ms: s.input.retry_backoff_ms,
            max_timeout_seconds: s.input.max_timeout_seconds,
            pipeline,
            settle_closes,
            outage_rules,
            ahead,
        }
    });
    let fut = run_case(ctx.clone(), params, case_cancel.clone());
    (index, Box::pin(fut))
}

/// Gives the first case provisioned ahead (in plan order) its slot. `false`: none waits.
fn grant_prepared(ctx: &WorkflowContext<BatchWorkflow>) -> bool {
    ctx.state_mut(|s| {
        let Some(index) = s.prepared.pop_first() else {
            return false;
        };
        s.slots[index as usize].state = CaseState::Running;
        s.in_flight.insert(index);
        true
    })
}

/// The next queued case at or after the cursor (cases are admitted in plan order).
fn next_queued(ctx: &WorkflowContext<BatchWorkflow>, cursor: &mut usize) -> Option<u32> {
    ctx.state(|s| {
        while *cursor < s.slots.len() {
            let i = *cursor;
            *cursor += 1;
            if s.slots[i].state == CaseState::Queued {
                return Some(i as u32);
            }
        }
        None
    })
}

fn record_case(ctx: &WorkflowContext<BatchWorkflow>, done: CaseDone) {
    for n in &done.notes {
        note(ctx, Some(done.case_index), n.clone());
    }
    ctx.state_mut(|s| {
        let slot = &mut s.slots[done.case_index as usize];
        // A case killed because the batch is superseded is unfinished work, not a cancel.
        slot.state = match done.state {
            CaseState::Cancelled if s.superseding => CaseState::Queued,
            state => state,
        };
        slot.attempts = done.attempts;
        s.in_flight.remove(&done.case_index);
        s.prepared.remove(&done.case_index);
        s.counters.adopted += done.adopted;
        s.counters.redispatched += done.redispatched;
        s.counters.retries += done.retries;
        s.counters.cleanup_unconfirmed += done.cleanup_unconfirmed;
        s.counters.oom_boosts += done.oom_boosts;
        s.counters.spillovers += done.spillovers;
        s.counters.circuit_skips += done.circuit_skips;
        s.counters.speculations += done.speculations;
        s.counters.speculation_wins += done.speculation_wins;
        s.counters.prepared += done.prepared;
        s.counters.released += done.released;
        s.counters.reattached += done.reattached;
        s.counters.stranded += done.stranded;
        s.counters.paid_twice += done.paid_twice;
        if let Some(failure) = done.unrecorded_failure {
            s.unrecorded.push(UnrecordedFailure {
                case: done.case_index,
                attempts: done.attempts,
                failure,
            });
        }
    });
}

/// What woke the batch's loop.
enum Event {
    /// The case at this position of the in-flight list finished.
    Case(usize, Box<CaseDone>),
    /// The cleanup at this position of the left-behind list ended.
    LeftBehind(usize, CleanedUp),
    /// A control operation, the tail timer, or the workflow's cancellation.
    Other,
}

/// Counts what the cleanup of an attempt a finished case left behind found.
fn record_cleaned(ctx: &WorkflowContext<BatchWorkflow>, c: CleanedUp) {
    ctx.state_mut(|s| {
        s.counters.stranded += u32::from(c.stranded);
        s.counters.cleanup_unconfirmed += u32::from(!c.confirmed);
        s.counters.paid_twice += u32::from(c.held_job);
    });
}

/// Slots taken beyond the admitted cases: duplicates in flight, and stragglers asked to
/// speculate that have not started theirs yet.
fn tail_load(ctx: &WorkflowContext<BatchWorkflow>) -> usize {
    ctx.state(|s| {
        s.tail
            .as_ref()
            .map_or(0, |t| (t.duplicates + t.pending_asks()) as usize)
    })
}

/// Once every case has been dispatched: asks the stragglers past the threshold to speculate
/// (at most `room`, the batch's free slots; the case starts its duplicate when next polled)
/// and keeps a timer for the next one due. `armed` is the timer already running, kept when
/// it fires no later than needed (a timer that fires early only re-arms).
fn speculate_due(
    ctx: &WorkflowContext<BatchWorkflow>,
    room: u32,
    armed: Option<(u64, LocalBoxFuture<'static, ()>)>,
) -> Option<(u64, LocalBoxFuture<'static, ()>)> {
    if room == 0 || ctx.state(|s| s.tail.is_none()) {
        return None;
    }
    // Admission found no case to admit; envelopes may still hold queued ones back.
    if ctx.state(|s| s.slots.iter().any(|c| c.state == CaseState::Queued)) {
        return None;
    }
    let now = crate::case::workflow_ms(ctx);
    let next = ctx.state_mut(|s| {
        let t = s.tail.as_mut()?;
        t.ask_due(now, room);
        t.next_due()
    })?;
    if let Some((at, timer)) = armed
        && at <= next
    {
        return Some((at, timer));
    }
    let wait = Duration::from_millis(next.saturating_sub(now).max(1));
    let timer_ctx = ctx.clone();
    Some((
        next,
        Box::pin(async move {
            let _ = timer_ctx.timer(wait).await;
        }),
    ))
}

/// `supersede`'s force-kill: every runtime that can kill by batch does so now, before the
/// cases' own cancels (which still run cleanup and write receipts).
async fn sweep(ctx: &WorkflowContext<BatchWorkflow>) {
    let input = ctx.state(|s| SweepInput {
        batch_id: s.input.batch_id.clone(),
        bundle_dir: s.input.bundle_dir.clone(),
    });
    let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(120))
        .activity_id("sweep".to_string())
        .retry_policy(RetryPolicy::builder().maximum_attempts(3).build())
        .cancellation_token(WorkflowCancellationToken::new())
        .build();
    let message = match ctx.execute_activity(Sweep, input, opts).await {
        Ok(r) if r.unreachable.is_empty() => {
            format!("supersede: {} job(s) killed by batch", r.killed.len())
        }
        Ok(r) => format!(
            "supersede: {} job(s) killed by batch; not reached: {}",
            r.killed.len(),
            r.unreachable.join("; ")
        ),
        Err(e) => format!("supersede: the kill by batch failed ({e}); cases' cleanup still runs"),
    };
    note(ctx, None, message);
}

/// Upserts `running` with the current counts.
fn publish_running(ctx: &WorkflowContext<BatchWorkflow>) {
    let counts = ctx.state(|s| Counts::of(&s.slots));
    visibility::publish(ctx, outcome::RUNNING, &counts);
}

async fn finish(
    ctx: &WorkflowContext<BatchWorkflow>,
    end: BatchEnd,
    visible: bool,
) -> WorkflowResult<BatchOutcome> {
    let counts = ctx.state(|s| Counts::of(&s.slots));
    if visible {
        visibility::publish(ctx, outcome_of(end, &counts), &counts);
    }
    note(
        ctx,
        None,
        format!(
            "run ended ({end:?}): {} succeeded, {} failed, {} cancelled, {} queued",
            counts.succeeded, counts.failed, counts.cancelled, counts.queued
        ),
    );
    ctx.state_mut(|s| s.finished = true);
    let (input, status) = ctx.state(|s| {
        (
            FinalizeInput {
                batch_id: s.input.batch_id.clone(),
                bundle_dir: s.input.bundle_dir.clone(),
                status: s.snapshot(),
            },
            s.snapshot(),
        )
    });
    let opts = LocalActivityOptions::builder()
        .start_to_close_timeout(Duration::from_secs(120))
        .retry_policy(RetryPolicy::builder().maximum_attempts(3).build())
        .cancellation_token(WorkflowCancellationToken::new())
        .build();
    // The bundle can always be rebuilt by `report`; a failed write must not lose the outcome.
    let _ = ctx.execute_local_activity(Finalize, input, opts).await;
    let slots = ctx.state(|s| s.slots.clone());
    Ok(BatchOutcome { end, status, slots })
}

fn continue_as_new(ctx: &WorkflowContext<BatchWorkflow>) -> WorkflowResult<BatchOutcome> {
    let next = ctx.state(|s| {
        let mut input = s.input.clone();
        input.carried = Some(Carried {
            slots: s.slots.clone(),
            counters: s.counters.clone(),
            timeline: s.timeline.clone(),
            paused: s.paused,
            segment: s.segment,
            concurrency: (s.concurrency != s.input.concurrency).then_some(s.concurrency),
            unrecorded: s.unrecorded.clone(),
        });
        input
    });
    match ctx.continue_as_new(next, ContinueAsNewOptions::default()) {
        Err(termination) => Err(termination),
        Ok(never) => match never {},
    }
}
