//! One run of the batch workflow: a loop of admit → wait → record, and its ends (finish,
//! continue-as-new). Every workflow command is issued here or by the cases' futures this
//! polls, in an order that depends only on history: recorded histories must replay
//! unchanged (`workflows/tests/replay.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use casebatch_proto::{
    BatchEnd, BatchOutcome, Carried, CaseState, Counts, FinalizeInput, SweepInput,
    visibility::{outcome, outcome_of},
};
use futures::future::LocalBoxFuture;
use temporalio_common::RetryPolicy;
use temporalio_sdk::{
    ActivityOptions, ContinueAsNewOptions, LocalActivityOptions, WorkflowCancellationToken,
    WorkflowContext, WorkflowResult,
};

use super::state::BatchWorkflow;
use crate::admission::{
    CircuitWidth, Concurrency, Gate, Lane, Load, Paced, Policy, ProvisionAhead, WithinBudget, gate,
};
use crate::case::{
    CaseDone, CaseParams, CleanedUp, LeftBehind, Pipeline, run_case, slot_returns_by_activity,
};
use crate::contracts::{Finalize, ReserveStart, Sweep};
use crate::envelopes::Envelopes;
use crate::lifecycle::{Control, Lifecycle};
use crate::pace::{Due, Pacing};
use crate::runtime_share::RuntimeShares;
use crate::shared::{cost, note, workflow_ms};
use crate::visibility;

/// Continue-as-new once history passes this many events. Temporal's hard limit is 51,200
/// events (and 50 MB); the server's earlier *suggestion* (about 4K events) is not followed,
/// because every continue-as-new briefly stops admissions while in-flight cases finish.
const DEFAULT_HISTORY_BUDGET: u32 = 20_000;

/// Patch id recorded by runs whose closing write of the batch files is a regular activity.
/// As a local activity it held the workflow task open for as long as it read every case's
/// records (seconds at 100,000 cases), and the server holds queries until that task
/// completes: `batch status` waited for it, then fell back to reading the bundle itself.
/// Runs recorded before it replay their local activity.
pub(crate) const FINALIZE_AS_ACTIVITY: &str = "finalize-as-activity";

/// How long the closing write may take: it reads two files per case (about a minute per
/// 100,000 cases with a cold page cache); it heartbeats, so a dead worker's is retried at the
/// batch's heartbeat timeout, not at this one.
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(60 * 60);

type Ctx = WorkflowContext<BatchWorkflow>;
type CaseFuture = LocalBoxFuture<'static, CaseDone>;
type Timer = LocalBoxFuture<'static, ()>;

pub(super) async fn run(ctx: &Ctx) -> WorkflowResult<BatchOutcome> {
    let mut run = Run::begin(ctx);
    // A new batch behind a shared runtime's full queue waits here to be admitted.
    super::queue_limit::wait_for_room(ctx).await;
    loop {
        // What this pass decides on: controls arriving while it awaits act on the next.
        let (phase, seen) = ctx.state(|s| (s.lifecycle, s.shared.wakeups));
        let history_full = ctx.history_length() >= run.budget;
        if phase.is_cancelling() {
            run.cancel_cases(ctx).await;
        }
        let exhausted = run.admit(ctx, phase, history_full);
        run.arm_tail(ctx, exhausted);
        if !run.is_idle() || run.pace_waits {
            let event = run.next_event(ctx, phase, seen).await;
            run.record(ctx, event);
            continue;
        }
        let (queued, out_of_budget) = ctx.state(|s| {
            let queued = s.slots.iter().any(|c| !c.state.is_terminal());
            (queued, s.out_of_budget())
        });
        match when_idle(phase, queued, out_of_budget, history_full) {
            Idle::End(end) => return finish(ctx, end, run.visible).await,
            Idle::ContinueAsNew => {
                // The next run inherits the search attributes: bring them up to date.
                run.publish_pending(ctx, true);
                return continue_as_new(ctx);
            }
            Idle::Sleep => {
                run.publish_pending(ctx, true);
                let _ = ctx
                    .wait_condition(move |s: &BatchWorkflow| s.shared.wakeups != seen)
                    .await;
                run.notice_cancellation(ctx);
            }
        }
    }
}

/// What a run with nothing in flight does next.
#[derive(Debug, PartialEq, Eq)]
enum Idle {
    End(BatchEnd),
    ContinueAsNew,
    /// Paused (or held back) with nothing in flight: sleep until something wakes the loop.
    Sleep,
}

/// `out_of_budget`: the budget admits no further case ([`BatchWorkflow::out_of_budget`]); a
/// paused batch out of budget ends too, as nothing could start once unpaused.
fn when_idle(phase: Lifecycle, queued: bool, out_of_budget: bool, history_full: bool) -> Idle {
    match phase {
        Lifecycle::Cancelling { superseded: true } => Idle::End(BatchEnd::Superseded),
        Lifecycle::Cancelling { superseded: false } => Idle::End(BatchEnd::Cancelled),
        _ if !queued => Idle::End(BatchEnd::Completed),
        Lifecycle::Draining => Idle::End(BatchEnd::Drained),
        _ if out_of_budget => Idle::End(BatchEnd::BudgetExhausted),
        _ if history_full => Idle::ContinueAsNew,
        _ => Idle::Sleep,
    }
}

/// What woke the loop.
enum Event {
    /// The case at this position of the in-flight list finished.
    Case(usize, Box<CaseDone>),
    /// The cleanup at this position of the left-behind list ended.
    LeftBehind(usize, CleanedUp),
    /// A control, a wake-up, the tail timer, or the workflow's cancellation.
    Woken,
}

/// The run's own state, which is not carried to the next run.
struct Run {
    pipeline: Pipeline,
    settle_closes: bool,
    start_settles: bool,
    outage_rules: bool,
    rate_limit_rules: bool,
    slot_returns_by_activity: bool,
    /// This run upserts search attributes.
    visible: bool,
    /// ... at most once per `visibility::UPSERT_EVERY_MS` while cases finish.
    throttled: bool,
    /// Workflow time of this run's last upsert.
    published_at_ms: Option<u64>,
    /// Wakes a throttled run when its held-back upsert is due, so counts never wait for the
    /// next case to finish (a batch whose last case runs for an hour).
    publish_timer: Option<Timer>,
    /// Finished cases not yet in the search attributes: published once the activation
    /// that recorded them has nothing more to do, so a burst of completions costs one
    /// upsert, not one each.
    unpublished: bool,
    budget: u32,
    /// In-flight case work is cancelled through this token (child of the workflow's own
    /// cancellation, so `temporal workflow cancel` works too); cleanup uses detached tokens.
    case_cancel: WorkflowCancellationToken,
    /// Cases admitted (and provisioned ahead), in admission order.
    inflight: Vec<(u32, CaseFuture)>,
    /// Cleanups of attempts finished cases left behind (stranded, a speculation's loser),
    /// still running: they take no slot, and the run ends only once they have.
    left_behind: Vec<LeftBehind>,
    /// Plan-order admission resumes here.
    cursor: usize,
    /// Wakes the loop when the next straggler is due for speculation: (due at, timer).
    tail_timer: Option<(u64, Timer)>,
    /// The batch's pace (`defaults.rate`); `None`: unpaced.
    pacing: Option<Pacing>,
    /// Cases wait for the pace (not for room): the loop waits for it even with none in flight.
    pace_waits: bool,
    /// Wakes the loop when the next start conforms: (due at, µs; timer).
    pace_timer: Option<(u64, Timer)>,
    /// The shared pace, asked for the next start: what it booked (`None`: no answer).
    pace_ask: Option<LocalBoxFuture<'static, Option<u64>>>,
}

impl Run {
    fn begin(ctx: &Ctx) -> Self {
        // First, before any command: a run keeps the pipeline its history began with.
        let pipeline = Pipeline::of_run(ctx);
        let settle_closes = pipeline.settle_closes(ctx);
        let outage_rules = pipeline.outage_rules(ctx);
        // After the others: histories recorded before it have the next command here.
        let start_settles = pipeline.start_settles(ctx, settle_closes);
        // Last, for the same reason.
        let rate_limit_rules = pipeline.rate_limit_rules(ctx);
        let pacing = ctx.state(|s| s.input.pace.clone()).map(Pacing::new);
        if let Some(p) = &pacing {
            note(ctx, None, format!("paced: {}", p.pace().describe()));
        }
        let visible = visibility::of_run(ctx, ctx.state(|s| s.input.search_attributes));
        let throttled = visibility::throttled(ctx, visible);
        // After every other marker, for the same reason.
        let shares = ctx.state(|s| s.shared.shares.is_some());
        let slot_returns_by_activity = slot_returns_by_activity(ctx, shares);
        cost(ctx, |a| a.runs += 1);
        let (segment, counts) = ctx.state(|s| (s.segment, Counts::of(&s.slots)));
        let started = format!(
            "segment {segment} started: {} queued, {} done",
            counts.queued,
            counts.done()
        );
        note(ctx, None, started);
        Self {
            pipeline,
            settle_closes,
            start_settles,
            outage_rules,
            rate_limit_rules,
            slot_returns_by_activity,
            visible,
            throttled,
            unpublished: false,
            published_at_ms: None,
            publish_timer: None,
            budget: ctx.state(|s| s.input.history_budget.unwrap_or(DEFAULT_HISTORY_BUDGET)),
            case_cancel: ctx.cancellation_token().child_token(),
            inflight: Vec::new(),
            left_behind: Vec::new(),
            cursor: 0,
            tail_timer: None,
            pacing,
            pace_waits: false,
            pace_timer: None,
            pace_ask: None,
        }
    }

    fn is_idle(&self) -> bool {
        self.inflight.is_empty() && self.left_behind.is_empty()
    }

    /// Cancels the cases in flight, once; a superseded batch first kills its jobs by batch.
    async fn cancel_cases(&mut self, ctx: &Ctx) {
        if self.case_cancel.is_cancelled() {
            return;
        }
        self.case_cancel.cancel();
        if ctx.state(|s| s.lifecycle.is_superseded()) {
            sweep(ctx).await;
        }
    }

    /// Admits what the limits allow: cases provisioned ahead get the first free slots, then
    /// queued cases, then the next ones provision ahead of need. Returns whether admission
    /// ran out of cases (not of room): the tail may have begun.
    fn admit(&mut self, ctx: &Ctx, phase: Lifecycle, history_full: bool) -> bool {
        let admitting = phase.admits() && !history_full;
        // Cases provisioned ahead wait in `inflight` without a slot; they are next in line
        // (once history is full too: they were admitted).
        let held = ctx.state(|s| s.shared.prepared.len());
        let granting = held > 0 && phase.admits();
        self.pace_waits = false;
        if !admitting && !granting {
            return false;
        }
        // Read on every pass: a lowered limit lets running cases finish and admits nothing
        // until fewer run; a raised one admits at once. Open circuits narrow it the same
        // way, never cancelling what runs. Duplicates take room too.
        if let Some(change) = ctx.state_mut(BatchWorkflow::record_width) {
            note(ctx, None, change);
        }
        if let Some(change) = ctx.state_mut(BatchWorkflow::record_rate_pressure) {
            note(ctx, None, change);
        }
        let (concurrency, width, ahead, within_budget) = ctx.state(|s| {
            (
                Concurrency(s.concurrency),
                // Open circuits and rate limits narrow the batch alike: the narrower counts.
                CircuitWidth(s.width().min(s.shared.rate.width(s.concurrency.max(1)))),
                ProvisionAhead(s.input.prepare_ahead),
                WithinBudget::new(s.input.budget, &s.spending),
            )
        });
        // Taken out for the pass: the policy reading it books each start it lets through.
        let pacing = self.pacing.take();
        let now_us = workflow_ms(ctx) * 1000;
        let paced = Paced {
            pacing: pacing.as_ref(),
            now_us,
        };
        // Cases provisioned ahead were admitted under the budget: a slot is all they wait for.
        let granting: [&dyn Policy; 4] = [&concurrency, &width, &ahead, &paced];
        let policies: [&dyn Policy; 5] = [&concurrency, &width, &ahead, &within_budget, &paced];
        let load = |run: &Self| run.load(ctx);
        while gate(&granting, Lane::Slot, &load(self)) == Gate::Now && grant_prepared(ctx) {
            paced.took();
        }
        let may = |run: &Self, lane| gate(&policies, lane, &run.load(ctx)) == Gate::Now;
        let mut exhausted = false;
        while admitting && may(self, Lane::Slot) {
            let Some(index) = self.next_case(ctx) else {
                exhausted = true;
                break;
            };
            self.start_case(ctx, index, false);
            paced.took();
        }
        while admitting && may(self, Lane::Ahead) {
            let Some(index) = self.next_case(ctx) else {
                break;
            };
            self.start_case(ctx, index, true);
        }
        if let Some(p) = &pacing {
            // Held back by the pace alone, with cases waiting: wait for the next start.
            let unpaced = &policies[..4];
            let room = gate(unpaced, Lane::Slot, &load(self)) == Gate::Now;
            let waiting = || {
                ctx.state(|s| {
                    !s.shared.prepared.is_empty()
                        || (admitting && s.slots.iter().any(|c| c.state == CaseState::Queued))
                })
            };
            if !exhausted && !p.may_start(now_us) && room && waiting() {
                self.pace_waits = true;
                self.wait_for_pace(ctx, p, now_us);
            }
        }
        self.pacing = pacing;
        exhausted
    }

    /// Arms what wakes the loop for the next start the pace allows: a timer to its time, or
    /// an ask of the shared pace (one at a time).
    fn wait_for_pace(&mut self, ctx: &Ctx, pacing: &Pacing, now_us: u64) {
        match pacing.due() {
            Due::At(at_us) => {
                if self.pace_timer.as_ref().is_some_and(|(t, _)| *t <= at_us) {
                    return;
                }
                let wait = Duration::from_micros(at_us.saturating_sub(now_us).max(1000));
                let timer_ctx = ctx.clone();
                self.pace_timer = Some((
                    at_us,
                    Box::pin(async move {
                        cost(&timer_ctx, |a| a.timers += 1);
                        let _ = timer_ctx.timer(wait).await;
                    }),
                ));
            }
            Due::Ask if self.pace_ask.is_none() => {
                let ask = casebatch_proto::pace::PaceAsk {
                    pace: pacing.pace().clone(),
                };
                let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(15))
                    .retry_policy(RetryPolicy::builder().maximum_attempts(3).build())
                    .cancellation_token(WorkflowCancellationToken::new())
                    .build();
                let ask_ctx = ctx.clone();
                self.pace_ask = Some(Box::pin(async move {
                    cost(&ask_ctx, |a| a.activities += 1);
                    ask_ctx.execute_activity(ReserveStart, ask, opts).await.ok()
                }));
            }
            Due::Ask => {}
        }
    }

    /// What the admission policies see now.
    fn load(&self, ctx: &Ctx) -> Load {
        // Cases provisioned ahead wait in `inflight` without a slot.
        let held = ctx.state(|s| s.shared.prepared.len());
        Load {
            running: self.inflight.len() - held,
            tail: tail_load(ctx),
            held,
        }
    }

    /// The next case to admit: by envelope when runtimes declare one, else in plan order.
    fn next_case(&mut self, ctx: &Ctx) -> Option<u32> {
        if let Some(next) = ctx.state_mut(|s| s.admission.as_mut().map(Envelopes::next)) {
            return next;
        }
        ctx.state(|s| {
            while self.cursor < s.slots.len() {
                let i = self.cursor;
                self.cursor += 1;
                if s.slots[i].state == CaseState::Queued {
                    return Some(i as u32);
                }
            }
            None
        })
    }

    /// Starts case `index`: running now, or (`ahead`) provisioning ahead of a free slot, held
    /// in the prepared set until [`grant_prepared`] gives it one.
    fn start_case(&mut self, ctx: &Ctx, index: u32, ahead: bool) {
        let params = ctx.state_mut(|s| {
            if ahead {
                s.shared.prepared.insert(index);
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
                    // Runs recorded before the rule spend max_retries on them.
                    max_rate_limit_retries: if self.rate_limit_rules {
                        s.input
                            .max_rate_limit_retries
                            .unwrap_or(crate::decide::DEFAULT_MAX_RATE_LIMIT_RETRIES)
                    } else {
                        0
                    },
                },
                memory_boost_mb: s.input.memory_boosts.get(&index).copied(),
                retry_backoff_ms: s.input.retry_backoff_ms,
                max_timeout_seconds: s.input.max_timeout_seconds,
                pipeline: self.pipeline,
                settle_closes: self.settle_closes,
                start_settles: self.start_settles,
                outage_rules: self.outage_rules,
                slot_returns_by_activity: self.slot_returns_by_activity,
                ahead,
            }
        });
        let case = run_case(ctx.clone(), params, self.case_cancel.clone());
        self.inflight.push((index, Box::pin(case)));
    }

    /// Once every case has been dispatched, keeps the tail's timer for the next straggler
    /// due; otherwise there is none.
    fn arm_tail(&mut self, ctx: &Ctx, exhausted: bool) {
        let armed = self.tail_timer.take();
        if exhausted && !self.inflight.is_empty() {
            let room = ctx.state(BatchWorkflow::width) as usize;
            let room = room.saturating_sub(self.inflight.len() + tail_load(ctx)) as u32;
            self.tail_timer = speculate_due(ctx, room, armed);
        }
    }

    /// Waits for the first of: a case finishing, a left-behind cleanup ending, the tail's
    /// timer, or a wake-up. Polled in index order with poll_fn (not an unordered futures set,
    /// which trips the SDK's determinism detector). Once cancelling, only the cases matter:
    /// a wait_condition built after the workflow's own cancellation resolves at once, and
    /// polling it would spin without ever yielding the workflow task.
    async fn next_event(&mut self, ctx: &Ctx, phase: Lifecycle, seen: u64) -> Event {
        let mut woken = (!phase.is_cancelling()).then(|| {
            Box::pin(ctx.wait_condition(move |s: &BatchWorkflow| s.shared.wakeups != seen))
        });
        std::future::poll_fn(|cx| {
            for (i, (_, case)) in self.inflight.iter_mut().enumerate() {
                if let Poll::Ready(done) = case.as_mut().poll(cx) {
                    return Poll::Ready(Event::Case(i, Box::new(done)));
                }
            }
            for (i, cleanup) in self.left_behind.iter_mut().enumerate() {
                if let Poll::Ready(cleaned) = cleanup.as_mut().poll(cx) {
                    return Poll::Ready(Event::LeftBehind(i, cleaned));
                }
            }
            if let Some(ask) = self.pace_ask.as_mut()
                && let Poll::Ready(booked) = ask.as_mut().poll(cx)
            {
                self.pace_ask = None;
                if let Some(p) = &self.pacing {
                    let now_us = workflow_ms(ctx) * 1000;
                    if booked.is_none() {
                        note(
                            ctx,
                            None,
                            "the shared pace did not answer: this batch paces itself".into(),
                        );
                    }
                    p.grant(booked, now_us);
                }
                return Poll::Ready(Event::Woken);
            }
            if let Some((_, timer)) = self.pace_timer.as_mut()
                && timer.as_mut().poll(cx).is_ready()
            {
                self.pace_timer = None;
                return Poll::Ready(Event::Woken);
            }
            if let Some((_, timer)) = self.tail_timer.as_mut()
                && timer.as_mut().poll(cx).is_ready()
            {
                // A straggler is due: the next pass asks it.
                self.tail_timer = None;
                return Poll::Ready(Event::Woken);
            }
            if let Some(Poll::Ready(_)) = woken.as_mut().map(|w| Pin::new(w).poll(cx)) {
                return Poll::Ready(Event::Woken);
            }
            // Nothing more can happen in this activation (only here is that known): its
            // completions are all recorded, so publish them now, in one upsert.
            self.publish_pending(ctx, false);
            // Polled here, after a held-back upsert may have armed it, so it starts at once.
            if let Some(timer) = self.publish_timer.as_mut()
                && timer.as_mut().poll(cx).is_ready()
            {
                self.publish_timer = None;
                self.publish_pending(ctx, true);
            }
            Poll::Pending
        })
        .await
    }

    fn record(&mut self, ctx: &Ctx, event: Event) {
        match event {
            Event::Case(i, mut done) => {
                // Remove in place: keeps the admission order of the rest.
                drop(self.inflight.remove(i));
                self.left_behind.append(&mut done.left_behind);
                record_case(ctx, *done);
                self.unpublished = self.visible;
            }
            Event::LeftBehind(i, cleaned) => {
                drop(self.left_behind.remove(i));
                ctx.state_mut(|s| cleaned.count(&mut s.counters));
            }
            Event::Woken => self.notice_cancellation(ctx),
        }
    }

    /// The workflow's own cancellation (`temporal workflow cancel`) cancels the batch.
    fn notice_cancellation(&self, ctx: &Ctx) {
        if ctx.cancellation_token().is_cancelled() {
            ctx.state_mut(|s| {
                if let Ok(step) = s.lifecycle.on(Control::Cancel) {
                    s.lifecycle = step.next;
                }
            });
        }
    }

    /// Upserts `running` with the current counts if finished cases are not in them yet; a
    /// throttled run waits for its interval unless `now` (it is about to sleep or end).
    fn publish_pending(&mut self, ctx: &Ctx, now: bool) {
        if !self.unpublished {
            return;
        }
        let at_ms = workflow_ms(ctx);
        let due = self
            .published_at_ms
            .is_none_or(|last| at_ms.saturating_sub(last) >= visibility::UPSERT_EVERY_MS);
        if self.throttled && !due && !now {
            if self.publish_timer.is_none() {
                let since = at_ms.saturating_sub(self.published_at_ms.unwrap_or(at_ms));
                let wait = Duration::from_millis(visibility::UPSERT_EVERY_MS - since);
                let timer_ctx = ctx.clone();
                self.publish_timer = Some(Box::pin(async move {
                    cost(&timer_ctx, |a| a.timers += 1);
                    let _ = timer_ctx.timer(wait).await;
                }));
            }
            return;
        }
        self.unpublished = false;
        self.published_at_ms = Some(at_ms);
        let counts = ctx.state(|s| Counts::of(&s.slots));
        visibility::publish(ctx, outcome::RUNNING, &counts);
    }
}

/// Gives the first case provisioned ahead (in plan order) its slot. `false`: none waits.
fn grant_prepared(ctx: &Ctx) -> bool {
    ctx.state_mut(|s| {
        let Some(index) = s.shared.prepared.pop_first() else {
            return false;
        };
        s.slots[index as usize].state = CaseState::Running;
        s.in_flight.insert(index);
        true
    })
}

fn record_case(ctx: &Ctx, done: CaseDone) {
    let at_ms = workflow_ms(ctx);
    for n in &done.notes {
        note(ctx, Some(done.case_index), n.clone());
    }
    ctx.state_mut(|s| {
        if let Some(admission) = s.admission.as_mut() {
            admission.finished(done.case_index);
        }
        let slot = &mut s.slots[done.case_index as usize];
        // A case killed because the batch is superseded is unfinished work, not a cancel.
        slot.state = match done.state {
            CaseState::Cancelled if s.lifecycle.is_superseded() => CaseState::Queued,
            state => state,
        };
        slot.attempts = done.attempts;
        let slot_state = slot.state;
        s.in_flight.remove(&done.case_index);
        s.shared.prepared.remove(&done.case_index);
        s.counters.add(&done.tally);
        let finished = matches!(slot_state, CaseState::Succeeded | CaseState::Failed);
        s.spending.record(&done.usage, finished);
        if finished && let Some(change) = s.shared.rate.relieve(s.concurrency.max(1)) {
            s.shared.push_step(at_ms, None, change.note());
        }
        if let Some(failure) = done.unrecorded_failure {
            s.unrecorded.push(casebatch_proto::UnrecordedFailure {
                case: done.case_index,
                attempts: done.attempts,
                failure,
            });
        }
    });
}

/// Slots taken beyond the admitted cases: duplicates in flight, and stragglers asked to
/// speculate that have not started theirs yet.
fn tail_load(ctx: &Ctx) -> usize {
    ctx.state(|s| {
        s.shared
            .tail
            .as_ref()
            .map_or(0, |t| (t.duplicates + t.pending_asks()) as usize)
    })
}

/// Asks the stragglers past the threshold to speculate (at most `room`, the batch's free
/// slots; the case starts its duplicate when next polled) and keeps a timer for the next one
/// due. `armed` is the timer already running, kept when it fires no later than needed (a
/// timer that fires early only re-arms).
fn speculate_due(ctx: &Ctx, room: u32, armed: Option<(u64, Timer)>) -> Option<(u64, Timer)> {
    if room == 0 || ctx.state(|s| s.shared.tail.is_none()) {
        return None;
    }
    // Admission found no case to admit; envelopes may still hold queued ones back.
    if ctx.state(|s| s.slots.iter().any(|c| c.state == CaseState::Queued)) {
        return None;
    }
    let now = workflow_ms(ctx);
    let next = ctx.state_mut(|s| {
        let t = s.shared.tail.as_mut()?;
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
            cost(&timer_ctx, |a| a.timers += 1);
            let _ = timer_ctx.timer(wait).await;
        }),
    ))
}

/// `supersede`'s force-kill: every runtime that can kill by batch does so now, before the
/// cases' own cancels (which still run cleanup and write receipts).
async fn sweep(ctx: &Ctx) {
    let input = ctx.state(|s| SweepInput {
        batch_id: s.input.batch_id.clone(),
        bundle_dir: s.input.bundle_dir.clone(),
    });
    let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(120))
        .activity_id("sweep".to_string())
        .retry_policy(RetryPolicy::builder().maximum_attempts(3).build())
        .cancellation_token(WorkflowCancellationToken::new())
        .build();
    cost(ctx, |a| a.activities += 1);
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

async fn finish(ctx: &Ctx, end: BatchEnd, visible: bool) -> WorkflowResult<BatchOutcome> {
    let counts = ctx.state(|s| Counts::of(&s.slots));
    if visible {
        visibility::publish(ctx, outcome_of(end, &counts), &counts);
    }
    if end == BatchEnd::BudgetExhausted {
        let (budget, spent) =
            ctx.state(|s| (s.input.budget.unwrap_or_default(), s.spending.spent.clone()));
        let spent = format!("cost_usd {} · tokens {}", spent.cost_usd(), spent.tokens());
        let why = format!(
            "budget reached ({}): spent {spent}; {} case(s) stay queued for `batch resume --budget`",
            budget.describe(),
            counts.queued
        );
        note(ctx, None, why);
    }
    let ended = format!(
        "run ended ({end:?}): {} succeeded, {} failed, {} cancelled, {} queued",
        counts.succeeded, counts.failed, counts.cancelled, counts.queued
    );
    note(ctx, None, ended);
    ctx.state_mut(|s| s.lifecycle = Lifecycle::Finished);
    // Asked here, once per batch: its marker is the only action it adds.
    let as_activity = ctx.patched(FINALIZE_AS_ACTIVITY);
    // The finalize below is counted in what it writes: an activity (and the patch's marker),
    // or the local activity's marker.
    cost(ctx, |a| {
        a.markers += 1;
        a.activities += u32::from(as_activity);
    });
    let status = ctx.state(|s| s.snapshot());
    let input = ctx.state(|s| FinalizeInput {
        batch_id: s.input.batch_id.clone(),
        bundle_dir: s.input.bundle_dir.clone(),
        status: status.clone(),
    });
    let retry = RetryPolicy::builder().maximum_attempts(3).build();
    // The bundle can always be rebuilt by `report`; a failed write must not lose the outcome.
    if as_activity {
        let opts = ActivityOptions::with_start_to_close_timeout(FINALIZE_TIMEOUT)
            .activity_id("finalize".to_string())
            .heartbeat_timeout(ctx.state(|s| s.shared.heartbeat_timeout))
            .retry_policy(retry)
            .cancellation_token(WorkflowCancellationToken::new())
            .build();
        let _ = ctx.execute_activity(Finalize, input, opts).await;
    } else {
        let opts = LocalActivityOptions::builder()
            .start_to_close_timeout(Duration::from_secs(120))
            .retry_policy(retry)
            .cancellation_token(WorkflowCancellationToken::new())
            .build();
        let _ = ctx.execute_local_activity(Finalize, input, opts).await;
    }
    let slots = ctx.state(|s| s.slots.clone());
    Ok(BatchOutcome { end, status, slots })
}

fn continue_as_new(ctx: &Ctx) -> WorkflowResult<BatchOutcome> {
    let next = ctx.state(|s| {
        let mut input = s.input.clone();
        input.carried = Some(Carried {
            slots: s.slots.clone(),
            counters: s.counters(),
            timeline: s.shared.timeline.clone(),
            paused: s.lifecycle.is_paused(),
            segment: s.segment,
            concurrency: (s.concurrency != s.input.concurrency).then_some(s.concurrency),
            unrecorded: s.unrecorded.clone(),
            spending: s.spending_now(),
            share: s.shared.shares.as_ref().map(RuntimeShares::settings),
        });
        input
    });
    match ctx.continue_as_new(next, ContinueAsNewOptions::default()) {
        Err(termination) => Err(termination),
        Ok(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_run_ends_by_its_phase_then_continues_as_new_then_sleeps() {
        let cancelled = Lifecycle::Cancelling { superseded: false };
        let superseded = Lifecycle::Cancelling { superseded: true };
        for queued in [false, true] {
            for full in [false, true] {
                assert_eq!(
                    when_idle(cancelled, queued, false, full),
                    Idle::End(BatchEnd::Cancelled)
                );
                assert_eq!(
                    when_idle(superseded, queued, false, full),
                    Idle::End(BatchEnd::Superseded)
                );
            }
        }
        for phase in [Lifecycle::Running, Lifecycle::Paused, Lifecycle::Draining] {
            assert_eq!(
                when_idle(phase, false, true, true),
                Idle::End(BatchEnd::Completed)
            );
        }
        assert_eq!(
            when_idle(Lifecycle::Draining, true, true, true),
            Idle::End(BatchEnd::Drained)
        );
        // History full wins over a pause: the next run starts paused (carried).
        assert_eq!(
            when_idle(Lifecycle::Paused, true, false, true),
            Idle::ContinueAsNew
        );
        assert_eq!(
            when_idle(Lifecycle::Running, true, false, false),
            Idle::Sleep
        );
        assert_eq!(
            when_idle(Lifecycle::Paused, true, false, false),
            Idle::Sleep
        );
        // Out of budget with cases queued: the run ends, paused or not, history full or not.
        for phase in [Lifecycle::Running, Lifecycle::Paused] {
            for full in [false, true] {
                assert_eq!(
                    when_idle(phase, true, true, full),
                    Idle::End(BatchEnd::BudgetExhausted)
                );
            }
        }
    }
}
