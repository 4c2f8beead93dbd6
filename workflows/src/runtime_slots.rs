//! `RuntimeSlots`: the slots of one shared runtime (an agent), as a long-lived workflow that
//! every batch's cases ask for a slot (`ask`, an update, through the `ask_slot` activity) and
//! give it back to (`slot_return`, a signal from the batch), granting free slots in
//! [`FairQueue`] order and telling each batch by signal (`slot_granted`).
//!
//! Why a workflow, as for the circuit breakers ([`crate::breaker`]): one truth for every
//! batch and worker replica on the namespace, its decisions serialised and replayed, no store
//! of our own. Why not Temporal's task queue fairness: a slot is held for the whole life of a
//! job (minutes to hours, while the job runs on the agent and no activity of ours need be
//! running), and a runtime's capacity is the agent's, not a count of worker pollers, which
//! grows with every worker replica.
//!
//! A grant that cannot be delivered means the batch run is over: what it held is freed. Every
//! [`REAP_EVERY`] the run asks which holders' batches have closed without giving their slots
//! back (terminated, timed out) and frees those too. It continues as new before its history
//! grows large, carrying the queue, and ends after an idle spell.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use casebatch_proto::share::{SlotAnswer, SlotAsk, SlotsView, Ticket};
use futures::future::LocalBoxFuture;
use temporalio_common::RetryPolicy;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ActivityOptions, ContinueAsNewOptions, SignalWorkflowOptions, SyncWorkflowContext,
    WorkflowContext, WorkflowContextView, WorkflowResult,
};

use crate::contracts::ClosedRuns;
use crate::contracts::slot_signals::SlotGranted;
use crate::fair_share::FairQueue;

/// How often holders are checked for batches that closed without giving slots back.
const REAP_EVERY: Duration = Duration::from_secs(30);
/// Idle ticks (nothing held, nothing waiting, nothing asked) before the run ends.
const IDLE_TICKS: u32 = 20;
/// Continue as new past this many history events: a case's ask, grant and two returns cost
/// about twelve, so a 200-case batch passes it (and its tests continue as new).
const HISTORY_BUDGET: u32 = 2_000;

#[workflow]
pub struct RuntimeSlots {
    queue: FairQueue,
    /// Grants not yet sent to their batches.
    outbox: Vec<Ticket>,
    /// Asks and returns so far: the run loop wakes when it changes.
    changes: u64,
}

type Delivery = Pin<Box<dyn Future<Output = bool>>>;

enum Woke {
    /// The delivery at this index ended: delivered or not.
    Delivered(usize, bool),
    Tick,
    /// The closed runs' check answered: these runs are over.
    Reaped(Vec<(String, String)>),
    Changed,
}

#[workflow_methods]
impl RuntimeSlots {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, carried: FairQueue) -> Self {
        Self {
            queue: carried,
            outbox: Vec::new(),
            changes: 0,
        }
    }

    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<SlotsView> {
        let mut deliveries: Vec<(Ticket, Delivery)> = Vec::new();
        let mut tick: Option<LocalBoxFuture<'static, ()>> = None;
        let mut reaping: Option<LocalBoxFuture<'static, Vec<(String, String)>>> = None;
        let mut idle_ticks = 0;
        loop {
            for ticket in ctx.state_mut(|s| std::mem::take(&mut s.outbox)) {
                let delivery = deliver(ctx, &ticket);
                deliveries.push((ticket, delivery));
            }
            if deliveries.is_empty() && ctx.history_length() >= HISTORY_BUDGET {
                let carried = ctx.state(|s| s.queue.clone());
                return match ctx.continue_as_new(carried, ContinueAsNewOptions::default()) {
                    Err(termination) => Err(termination),
                    Ok(never) => match never {},
                };
            }
            let timer_ctx = ctx.clone();
            let tick_now = tick.get_or_insert_with(|| {
                Box::pin(async move {
                    let _ = timer_ctx.timer(REAP_EVERY).await;
                })
            });
            let seen = ctx.state(|s| s.changes);
            let mut changed = Box::pin(
                ctx.wait_condition(move |s: &Self| s.changes != seen || !s.outbox.is_empty()),
            );
            // Polled in index order (not an unordered set, which trips the determinism
            // detector).
            let woke = std::future::poll_fn(|cx| {
                for (i, (_, d)) in deliveries.iter_mut().enumerate() {
                    if let Poll::Ready(ok) = d.as_mut().poll(cx) {
                        return Poll::Ready(Woke::Delivered(i, ok));
                    }
                }
                if tick_now.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Tick);
                }
                if let Some(r) = reaping.as_mut()
                    && let Poll::Ready(closed) = r.as_mut().poll(cx)
                {
                    return Poll::Ready(Woke::Reaped(closed));
                }
                if changed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Changed);
                }
                Poll::Pending
            })
            .await;
            match woke {
                Woke::Delivered(i, delivered) => {
                    let (ticket, _) = deliveries.remove(i);
                    if !delivered {
                        ctx.state_mut(|s| {
                            let freed = s.queue.forget_run(&ticket.workflow_id, &ticket.run_id);
                            s.outbox.extend(freed);
                        });
                    }
                }
                Woke::Changed => idle_ticks = 0,
                Woke::Tick => {
                    tick = None;
                    if ctx.state(|s| s.queue.is_idle()) && deliveries.is_empty() {
                        idle_ticks += 1;
                        if idle_ticks >= IDLE_TICKS {
                            return Ok(ctx.state(|s| s.queue.view()));
                        }
                    } else if reaping.is_none() {
                        reaping = Some(closed_runs(ctx));
                    }
                }
                Woke::Reaped(closed) => {
                    reaping = None;
                    ctx.state_mut(|s| {
                        for (workflow_id, run_id) in closed {
                            let freed = s.queue.forget_run(&workflow_id, &run_id);
                            s.outbox.extend(freed);
                        }
                    });
                }
            }
        }
    }

    /// A case asks for a slot: granted now, or its place in the queue (a signal grants it
    /// later).
    #[update(name = "ask")]
    pub fn ask(&mut self, _ctx: &mut SyncWorkflowContext<Self>, ask: SlotAsk) -> SlotAnswer {
        self.changes += 1;
        let (answer, others) = self.queue.ask(ask);
        self.outbox.extend(others);
        answer
    }

    /// A slot given back (its job ended) or a wait withdrawn (its case no longer waits).
    #[signal(name = "slot_return")]
    pub fn give_back(&mut self, _ctx: &mut SyncWorkflowContext<Self>, ticket: Ticket) {
        self.changes += 1;
        let freed = self.queue.give_back(&ticket);
        self.outbox.extend(freed);
    }

    #[query(name = "state")]
    pub fn state(&self, _ctx: &WorkflowContextView) -> SlotsView {
        self.queue.view()
    }
}

/// Sends a grant to the run of the batch it is for: `false` when that run is over.
fn deliver(ctx: &WorkflowContext<RuntimeSlots>, ticket: &Ticket) -> Delivery {
    let handle = ctx.external_workflow(ticket.workflow_id.clone(), Some(ticket.run_id.clone()));
    let signal = handle.signal(
        SlotGranted,
        ticket.clone(),
        SignalWorkflowOptions::default(),
    );
    Box::pin(async move { signal.await.is_ok() })
}

/// Which of the batch runs holding or waiting for slots have closed (none, if the check
/// fails: it is asked again at the next tick).
fn closed_runs(
    ctx: &WorkflowContext<RuntimeSlots>,
) -> LocalBoxFuture<'static, Vec<(String, String)>> {
    let runs = ctx.state(|s| s.queue.runs());
    let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(20))
        .retry_policy(RetryPolicy::builder().maximum_attempts(2).build())
        .build();
    let ctx = ctx.clone();
    Box::pin(async move {
        let closed = ctx.execute_activity(ClosedRuns, runs, opts).await;
        closed.unwrap_or_default()
    })
}
