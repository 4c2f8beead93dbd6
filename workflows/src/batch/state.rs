//! The batch's state between workflow tasks, and the pure queries and changes on it that the
//! workflow's handlers (`super`) and its run (`super::run`) share.

use std::collections::BTreeSet;

use casebatch_proto::{
    BatchInput, BatchStatus, CaseSlot, CaseState, Counters, Counts, Phase, Spending,
    UnrecordedFailure,
};
use temporalio_macros::workflow;
use temporalio_sdk::SyncWorkflowContext;

use crate::circuits::Circuits;
use crate::envelopes::Envelopes;
use crate::lifecycle::{Control, Lifecycle};
use crate::runtime_share::RuntimeShares;
use crate::shared::{Host, Shared, epoch_ms};
use crate::tail::Tail;

#[workflow]
pub struct BatchWorkflow {
    pub(super) input: BatchInput,
    pub(super) slots: Vec<CaseSlot>,
    pub(super) counters: Counters,
    pub(super) segment: u32,
    pub(super) lifecycle: Lifecycle,
    /// Active case limit: the input's until an operator sets another.
    pub(super) concurrency: u32,
    /// Admission against runtime envelopes; `None` when no runtime declares one.
    pub(super) admission: Option<Envelopes>,
    /// Cases admitted at once while open circuits hold the batch below `concurrency`, as
    /// last recorded ([`BatchWorkflow::record_width`]).
    pub(super) width: Option<u32>,
    /// What the cases see and change of the batch.
    pub(super) shared: Shared,
    pub(super) in_flight: BTreeSet<u32>,
    /// Final failures the bundle could not hold (its worker may not write there).
    pub(super) unrecorded: Vec<UnrecordedFailure>,
    /// What the cases have spent, against `input.budget`.
    pub(super) spending: Spending,
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

/// What an update validator returns: `Err` refuses the update, with the reason.
pub(super) type Verdict = Result<(), Box<dyn std::error::Error + Send + Sync>>;

impl BatchWorkflow {
    /// The state a run starts from: fresh, or carried over by continue-as-new.
    pub(super) fn from_input(mut input: BatchInput) -> Self {
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
        let heartbeat_timeout = input.heartbeat_timeout();
        let actions = carried.counters.temporal_actions;
        let shares = RuntimeShares::new(input.share.as_ref(), carried.share);
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
                actions,
                heartbeat_timeout,
                shares,
                ..Shared::default()
            },
            in_flight: BTreeSet::new(),
            unrecorded: carried.unrecorded,
            spending: carried.spending.unwrap_or_default(),
        }
    }

    /// Whether the lifecycle accepts `control` now (an update's validator).
    pub(super) fn check(&self, control: Control) -> Verdict {
        self.lifecycle.on(control).map(|_| ()).map_err(Into::into)
    }

    /// Applies an operator's control: a refused one (a signal, unchecked) changes nothing.
    /// Either way the admission loop is woken. Returns the phase after it.
    pub(super) fn apply(&mut self, ctx: &SyncWorkflowContext<Self>, control: Control) -> Phase {
        self.shared.actions.controls += 1;
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
    pub(super) fn apply_concurrency(&mut self, ctx: &SyncWorkflowContext<Self>, limit: u32) -> u32 {
        self.shared.actions.controls += 1;
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
    pub(super) fn width(&self) -> u32 {
        let limit = self.concurrency.max(1);
        self.shared
            .circuits
            .as_ref()
            .map_or(limit, |c| c.width(limit))
    }

    /// Records a change of [`Self::width`] since it was last recorded: a timeline step
    /// (returned, to be noted) and a count. `None`: unchanged.
    pub(super) fn record_width(&mut self) -> Option<String> {
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

    /// Applies the rate-limit pressure cases reported since the last pass: a cut of the
    /// width is counted and returned as a timeline step.
    pub(super) fn record_rate_pressure(&mut self) -> Option<String> {
        let change = self.shared.rate.apply(self.concurrency.max(1))?;
        self.counters.rate_width_cuts += 1;
        Some(change.note())
    }

    /// The batch's counters, its Temporal actions included.
    pub(super) fn counters(&self) -> Counters {
        Counters {
            temporal_actions: self.shared.actions,
            ..self.counters.clone()
        }
    }

    pub(super) fn snapshot(&self) -> BatchStatus {
        BatchStatus {
            batch_id: self.input.batch_id.clone(),
            phase: self.lifecycle.phase(),
            counts: Counts::of(&self.slots),
            in_flight: self.in_flight.iter().copied().collect(),
            counters: self.counters(),
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
            spending: self.spending_now(),
            budget: self.input.budget,
            rate_width: self.shared.rate.narrowed(self.concurrency.max(1)),
            shares: (self.shared.shares.as_ref())
                .map(RuntimeShares::views)
                .unwrap_or_default(),
            share: self.shared.shares.as_ref().map(RuntimeShares::settings),
        }
    }

    /// The spending a status or the next run carries: none while nothing was reported and
    /// no budget is set, so such a batch's payloads stay as they were.
    pub(super) fn spending_now(&self) -> Option<Spending> {
        let kept = !self.spending.spent.is_empty() || self.input.budget.is_some();
        kept.then(|| self.spending.clone())
    }

    /// The budget allows no further case, even with none in flight: the run ends
    /// `budget_exhausted` once what it admitted has finished.
    pub(super) fn out_of_budget(&self) -> bool {
        self.input
            .budget
            .is_some_and(|b| !b.admits(&self.spending, 0))
    }
}
