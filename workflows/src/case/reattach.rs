//! Asking a runtime that did not answer about the attempt's job again, before anything new
//! starts: a job that outlived the outage, running or finished, settles the case.

use std::time::Duration;

use casebatch_proto::{AttemptKey, Failure, FailureClass, FailureCode};
use temporalio_sdk::{WorkflowCancellationToken, WorkflowContext};

use super::params::CaseDone;
use crate::shared::{Host, cost, note};

/// How often, and after what pauses, an attempt asks a runtime that did not answer about its
/// job again before the case moves on (each ask waits out the runtime's own grace too).
const MAX_REATTACHES: u32 = 5;
const REATTACH_PAUSES_S: [u64; MAX_REATTACHES as usize] = [2, 5, 10, 20, 30];

/// A runtime that did not answer, where the job of the attempt may be (its failure says so
/// for its stage: a settle that lost its agent; a submit, when it may have reached it).
pub(super) fn is_unanswered(f: &Failure) -> bool {
    f.code == FailureCode::RuntimeUnreachable && f.class == FailureClass::Infra && f.retryable
}

/// The asks one attempt may still make.
pub(super) struct Reattach {
    /// Only a case with nowhere else to go waits for its runtime; a routed one moves on.
    allowed: bool,
    made: u32,
}

impl Reattach {
    pub(super) fn new(allowed: bool) -> Self {
        Self { allowed, made: 0 }
    }

    /// How many asks were made: the stage suffix of the activity asking (`settle.r2`).
    pub(super) fn made(&self) -> u32 {
        self.made
    }

    /// Pauses before asking the runtime about the attempt's job again, with a timeline step.
    /// `false` when asking is not allowed, the budget of asks is spent, or the batch was
    /// cancelled meanwhile.
    pub(super) async fn again<H: Host>(
        &mut self,
        ctx: &WorkflowContext<H>,
        key: &AttemptKey,
        cancel: &WorkflowCancellationToken,
        done: &mut CaseDone,
    ) -> bool {
        if !self.allowed || cancel.is_cancelled() || self.made >= MAX_REATTACHES {
            return false;
        }
        let pause = REATTACH_PAUSES_S[self.made as usize];
        self.made += 1;
        done.tally.reattached += 1;
        note(
            ctx,
            Some(key.case_index),
            format!(
                "its runtime did not answer for attempt {}'s job: asking again in {pause} s ({} \
                 of {MAX_REATTACHES}) rather than starting another job",
                key.attempt, self.made
            ),
        );
        cost(ctx, |a| a.timers += 1);
        temporalio_sdk::workflows::select! {
            _ = ctx.timer(Duration::from_secs(pause)) => {}
            _ = cancel.cancelled() => {}
        }
        !cancel.is_cancelled()
    }
}
