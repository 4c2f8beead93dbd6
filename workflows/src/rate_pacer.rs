//! `RatePacer`: one shared pace (`defaults.rate.rate_key`), as a long-lived workflow every
//! batch naming the key asks for its starts (`reserve`, an update, through the batch's
//! `reserve_start` activity). Why a workflow, as for the circuit breakers
//! ([`crate::breaker`]): one truth for every batch and worker replica on the namespace,
//! updates serialised (no two batches get the same slot), its clock workflow time, and no
//! store of our own. Started by the first ask (update with start); ends after an idle spell.

use std::time::{Duration, UNIX_EPOCH};

use casebatch_proto::pace::PaceAsk;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ContinueAsNewOptions, SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult,
};

use crate::pace::Gcra;

/// A pace nobody asked for this long ends its run (what it booked is long past by then).
const IDLE: Duration = Duration::from_secs(600);
/// Continue as new past this many history events (each ask costs a few).
const HISTORY_BUDGET: u32 = 2_000;

#[workflow]
pub struct RatePacer {
    gcra: Gcra,
    asks: u64,
}

#[workflow_methods]
impl RatePacer {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, carried: Gcra) -> Self {
        Self {
            gcra: carried,
            asks: 0,
        }
    }

    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<Gcra> {
        loop {
            let seen = ctx.state(|s| s.asks);
            ctx.timer(IDLE).await;
            if ctx.state(|s| s.asks) == seen {
                return Ok(ctx.state(|s| s.gcra));
            }
            if ctx.history_length() >= HISTORY_BUDGET {
                let next = ctx.state(|s| s.gcra);
                return match ctx.continue_as_new(next, ContinueAsNewOptions::default()) {
                    Err(termination) => Err(termination),
                    Ok(never) => match never {},
                };
            }
        }
    }

    /// Books one start: the earliest time (µs since the epoch, workflow time) it may go. A
    /// batch asking with another rate than the last one is spaced by its own.
    #[update(name = "reserve")]
    pub fn reserve(&mut self, ctx: &mut SyncWorkflowContext<Self>, ask: PaceAsk) -> u64 {
        self.asks += 1;
        let now_us = ctx
            .workflow_time()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_micros() as u64);
        self.gcra.book(&ask.pace, now_us)
    }
}
