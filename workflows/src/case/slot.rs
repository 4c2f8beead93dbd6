//! A case's slot on a shared runtime ([`crate::runtime_slots`]): asked for before its job
//! starts, waited for while other batches hold the runtime, given back once the job ended.
//! A case whose runtime is not shared (or is dealt from a list) asks for nothing.

use std::time::Duration;

use casebatch_proto::AttemptKey;
use casebatch_proto::share::{
    AskSlotInput, HeldSlot, SlotAsk, SlotWait, Ticket, slots_workflow_id,
};
use futures::future::LocalBoxFuture;
use temporalio_sdk::{
    ActivityOptions, SignalWorkflowOptions, WorkflowCancellationToken, WorkflowContext,
};

use super::options::retry_policy;
use crate::contracts::slot_signals::SlotReturn;
use crate::contracts::{AskSlot, ReturnSlot};
use crate::runtime_share::Turn;
use crate::shared::{Host, cost, note, workflow_ms};

/// A slot this attempt holds on a shared runtime.
pub(super) struct Slot {
    runtime: usize,
    slots_id: String,
    /// The slots' key (the agent's endpoint).
    endpoint: String,
    ticket: Ticket,
    /// Given back by an activity (this run keeps [`super::params::SLOT_RETURNS_BY_ACTIVITY`]).
    by_activity: bool,
    /// How long it waited, until an activity that gets the slot has recorded it.
    wait: Option<SlotWait>,
}

impl Slot {
    pub(super) fn held(&self) -> HeldSlot {
        HeldSlot {
            slots_workflow_id: self.slots_id.clone(),
            ticket: self.ticket.clone(),
            wait: self.wait.clone(),
        }
    }

    /// The same, its wait recorded already (by the `settle` that got the slot).
    pub(super) fn recorded(self, recorded: bool) -> Self {
        let wait = self.wait.filter(|_| !recorded);
        Self { wait, ..self }
    }

    /// Granted now: it waited since `asked_at` (workflow time).
    fn granted<H: Host>(mut self, ctx: &WorkflowContext<H>, asked_at: u64, priority: u32) -> Self {
        self.wait = Some(SlotWait {
            endpoint: self.endpoint.clone(),
            priority,
            waited_ms: workflow_ms(ctx).saturating_sub(asked_at),
        });
        self
    }
}

/// Asks for a slot for the attempt and waits until it is granted. `None`: the case's runtime
/// is not shared, the slots did not answer (the runtime's own refusal is then the limit), or
/// the case was cancelled while it waited.
pub(super) async fn acquire<H: Host>(
    ctx: &WorkflowContext<H>,
    key: &AttemptKey,
    cancel: &WorkflowCancellationToken,
    by_activity: bool,
) -> Option<Slot> {
    if key.runtime.is_some() {
        return None;
    }
    let (runtime, shared, share) = ctx.state(|s| {
        let shares = s.shared().shares.as_ref()?;
        let (i, runtime) = shares.runtime_of(key.case_index)?;
        Some((i, runtime.clone(), shares.input().settings.clone()))
    })?;
    let ticket = Ticket {
        workflow_id: ctx.workflow_id().to_string(),
        run_id: ctx.run_id().to_string(),
        case: key.case_index,
        attempt: key.attempt,
    };
    let slot = Slot {
        runtime,
        slots_id: slots_workflow_id(&shared.key),
        endpoint: shared.key.clone(),
        ticket: ticket.clone(),
        by_activity,
        wait: None,
    };
    let (priority, asked_at) = (share.priority, workflow_ms(ctx));
    let name = shared.name.clone();
    let mut ask = AskSlotInput {
        bundle_dir: key.bundle_dir.clone(),
        ask: SlotAsk {
            runtime: shared,
            ticket,
            share,
            capacity: None,
        },
    };
    let answer = match ask_slot(ctx, key, &ask, cancel, 0).await {
        Ok(answer) => answer,
        Err(_) if cancel.is_cancelled() => {
            // The ask may have queued the ticket: withdrawn.
            let _ = give_back(ctx, slot, false, false).await;
            return None;
        }
        Err(e) => {
            let why = format!(
                "the slots of {name} did not answer ({e}): case #{} starts without one",
                key.case_index
            );
            note(ctx, Some(key.case_index), why);
            return None;
        }
    };
    ctx.state_mut(|s| with_shares(s, |sh| sh.answered(runtime, &answer)));
    if answer.granted {
        return Some(slot.granted(ctx, asked_at, priority));
    }
    let now = workflow_ms(ctx);
    if let Some(Turn::HeldBack) = ctx.state_mut(|s| with_shares(s, |sh| sh.waits(runtime, now))) {
        let why = format!(
            "held back on {name} by other batches: {} of its {} slots are this batch's fair share, {} waiting ahead",
            fmt_share(answer.fair_share_milli),
            answer.capacity,
            answer.position
        );
        note(ctx, None, why);
    }
    let (case, attempt) = (key.case_index, key.attempt);
    let granted_now =
        move |s: &H| (s.shared().shares.as_ref()).is_some_and(|sh| sh.is_granted(case, attempt));
    let mut reasks = 0;
    loop {
        let seen = ctx.state(|s| s.shared().shares.as_ref().map(|sh| sh.generation()));
        temporalio_sdk::workflows::select! {
            _ = ctx.wait_condition(move |s: &H| {
                granted_now(s) || s.shared().shares.as_ref().map(|sh| sh.generation()) != seen
            }) => {}
            _ = cancel.cancelled() => {}
        }
        if cancel.is_cancelled() || ctx.state(granted_now) {
            break;
        }
        // The batch's share changed: the first case waiting on this runtime tells its slots
        // (a known ticket is not queued again; the batch's weight and priority are).
        if ctx.state_mut(|s| with_shares(s, |sh| sh.claim_push(runtime))) == Some(true) {
            reasks += 1;
            ask.ask.share =
                ctx.state(|s| (s.shared().shares.as_ref()).map(|sh| sh.input().settings.clone()))?;
            if let Ok(answer) = ask_slot(ctx, key, &ask, cancel, reasks).await {
                ctx.state_mut(|s| {
                    with_shares(s, |sh| {
                        sh.answered(runtime, &answer);
                        if answer.granted {
                            sh.grant(case, attempt);
                        }
                    })
                });
            }
        }
    }
    let granted = ctx.state(granted_now);
    let turn = ctx.state_mut(|s| with_shares(s, |sh| sh.waited(runtime, case, attempt)));
    if let Some(Turn::Released) = turn {
        let waited = workflow_ms(ctx).saturating_sub(now);
        let why = format!(
            "no longer held back on {name} (waited {:.1}s)",
            waited as f64 / 1000.0
        );
        note(ctx, None, why);
    }
    if !granted {
        let _ = give_back(ctx, slot, false, false).await;
        return None;
    }
    Some(slot.granted(ctx, asked_at, priority))
}

/// The `ask_slot` activity for the attempt (`again`: how many times it asked before).
async fn ask_slot<H: Host>(
    ctx: &WorkflowContext<H>,
    key: &AttemptKey,
    ask: &AskSlotInput,
    cancel: &WorkflowCancellationToken,
    again: u32,
) -> Result<casebatch_proto::share::SlotAnswer, temporalio_sdk::ActivityExecutionError> {
    let suffix = if again == 0 {
        String::new()
    } else {
        format!(".r{again}")
    };
    let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(30))
        .activity_id(format!(
            "case-{}.{}.slot{suffix}",
            key.case_index, key.attempt
        ))
        .summary(format!(
            "case #{} · attempt {} · slot on {}",
            key.case_index, key.attempt, ask.ask.runtime.name
        ))
        .cancellation_token(cancel.clone())
        .retry_policy(retry_policy(Duration::from_millis(500), 10))
        .build();
    cost(ctx, |a| a.activities += 1);
    ctx.execute_activity(AskSlot, ask.clone(), opts).await
}

/// Gives the slot back (or withdraws its wait) unless `settle` did (`returned`): the command
/// is sent at once; the future only tells when the slots workflow has it. A cancelling batch
/// still gives its slots back.
pub(super) fn give_back<'a, H: Host>(
    ctx: &'a WorkflowContext<H>,
    slot: Slot,
    held: bool,
    returned: bool,
) -> LocalBoxFuture<'a, ()> {
    if held {
        ctx.state_mut(|s| with_shares(s, |sh| sh.returned(slot.runtime)));
    }
    if returned {
        return Box::pin(async {});
    }
    if slot.by_activity {
        // Never a signal from here: the slots signal this workflow, and signals crossing
        // between two workflows hold both in the engine (see `ReturnSlot`).
        let ticket = &slot.ticket;
        let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(30))
            .activity_id(format!(
                "case-{}.{}.slot-return",
                ticket.case, ticket.attempt
            ))
            .summary(format!(
                "case #{} · attempt {} · slot given back",
                ticket.case, ticket.attempt
            ))
            .cancellation_token(WorkflowCancellationToken::new())
            .retry_policy(retry_policy(Duration::from_millis(500), 10))
            .build();
        cost(ctx, |a| a.activities += 1);
        let returned = ctx.execute_activity(ReturnSlot, slot.held(), opts);
        return Box::pin(async move {
            let _ = returned.await;
        });
    }
    let options = SignalWorkflowOptions::builder()
        .cancellation_token(WorkflowCancellationToken::new())
        .build();
    let handle = ctx.external_workflow(slot.slots_id, None);
    let sent = handle.signal(SlotReturn, slot.ticket, options);
    Box::pin(async move {
        let _ = sent.await;
    })
}

fn with_shares<H: Host, T>(
    s: &mut H,
    f: impl FnOnce(&mut crate::runtime_share::RuntimeShares) -> T,
) -> Option<T> {
    s.shared_mut().shares.as_mut().map(f)
}

fn fmt_share(milli: u32) -> String {
    let s = format!("{:.1}", f64::from(milli) / 1000.0);
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}
