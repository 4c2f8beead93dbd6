//! Provision ahead (`prepare_ahead`), the case's side: a case the batch admits ahead of a free
//! slot provisions its first attempt's environment (`prepare`), then waits until the batch
//! grants it a slot, so a freed slot starts its next case without waiting for provisioning.
//! If the batch drains, is cancelled or superseded first, the environment is cleaned up
//! (`release`, with a receipt) and the case stays queued: no attempt is spent.
//!
//! ```text
//!   prepare ──► wait for a slot ──► granted: the attempt's start only submits
//!                     └── drain / cancel ──► release (receipt) ──► queued
//! ```

use std::time::Duration;

use casebatch_proto::{AttemptKey, ReleaseInput};
use temporalio_sdk::{WorkflowCancellationToken, WorkflowContext};

use super::options::stage_options;
use super::params::CaseDone;
use crate::contracts::{Prepare, Release};
use crate::shared::{Host, cost};

/// How a case provisioned ahead left the wait.
pub(super) enum Ahead {
    /// It has a slot: its first attempt runs on the prepared environment.
    Granted,
    /// The batch stopped admitting first: the environment was released, the case is queued.
    Released,
}

/// Provisions `key`'s environment, then waits for a slot or for the batch to stop admitting.
pub(super) async fn prepare_then_wait<H: Host>(
    ctx: &WorkflowContext<H>,
    key: &AttemptKey,
    done: &mut CaseDone,
) -> Ahead {
    let case = key.case_index;
    let short = Duration::from_secs(60);
    // Detached from the batch's cancel: an environment half made when a cancel arrives would
    // otherwise be left for nobody to release.
    let detached = WorkflowCancellationToken::new();
    let opts = stage_options(ctx, "prepare", key, short, None, &detached);
    let mut host_queue = None;
    cost(ctx, |a| a.activities += 1);
    match ctx.execute_activity(Prepare, key.clone(), opts).await {
        Ok(p) => {
            host_queue = p.host_queue;
            match p.failure {
                None => done.tally.prepared += 1,
                Some(f) => done.notes.push(format!(
                    "provisioning ahead failed ({f}); provisioned again when it starts"
                )),
            }
        }
        Err(e) => done.notes.push(format!(
            "provisioning ahead failed ({e}); provisioned again when it starts"
        )),
    }

    // The batch grants a slot by taking the case out of its prepared set.
    let _ = ctx
        .wait_condition(move |s: &H| {
            !s.shared().prepared.contains(&case) || s.lifecycle().winds_down()
        })
        .await;
    let (granted, why) = ctx.state(|s| {
        let why = if s.lifecycle().is_superseded() {
            "supersede"
        } else if s.lifecycle().is_cancelling() || ctx.cancellation_token().is_cancelled() {
            "cancel"
        } else {
            "drain"
        };
        (!s.shared().prepared.contains(&case), why)
    });
    if granted {
        return Ahead::Granted;
    }

    let input = ReleaseInput {
        key: key.clone(),
        why: why.into(),
    };
    let opts = stage_options(ctx, "release", key, short, host_queue, &detached);
    cost(ctx, |a| a.activities += 1);
    let released = ctx.execute_activity(Release, input, opts).await;
    if let Ok(r) = &released {
        cost(ctx, |a| a.heartbeats += r.heartbeats);
    }
    let confirmed = released.is_ok_and(|r| r.cleanup_confirmed);
    done.tally.released += 1;
    done.tally.cleanup_unconfirmed += u32::from(!confirmed);
    done.notes.push(format!(
        "environment provisioned ahead released unused ({why}): cleanup {}",
        if confirmed {
            "confirmed"
        } else {
            "NOT confirmed"
        }
    ));
    Ahead::Released
}
