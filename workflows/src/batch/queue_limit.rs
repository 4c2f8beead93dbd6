//! Backpressure on admission: a new batch on a shared runtime with a `queue_limit` starts
//! nothing while that many cases or more, of every batch, wait for the runtime's slots. It is
//! not refused: it waits, says so in its timeline, and looks again (after [`FIRST_LOOK`],
//! doubling to [`LAST_LOOK`]) until the queue is below the limit or it is drained or
//! cancelled.
//! A batch that has started a case is never held back (a continued run, a resumed one with
//! results): the queue it would wait behind is partly its own.

use std::time::Duration;

use casebatch_proto::CaseState;
use temporalio_common::RetryPolicy;
use temporalio_sdk::{ActivityOptions, WorkflowCancellationToken, WorkflowContext};

use super::state::BatchWorkflow;
use crate::contracts::SlotsWaiting;
use crate::shared::{cost, note};

/// When a held-back batch asks the queues again: soon at first, then less often, so a day of
/// waiting costs about 15,000 events of history (a look is about ten), within one run.
const FIRST_LOOK: Duration = Duration::from_secs(5);
const LAST_LOOK: Duration = Duration::from_secs(60);

/// A shared runtime with a limit on its queue: (name, slots key, limit).
type Limited = (String, String, u32);

/// Waits until no shared runtime of the batch with a `queue_limit` has that many cases
/// waiting, if the batch has not started a case yet. Gives up waiting (and says so) when the
/// queues cannot be read: the slots then order the batch's cases as ever.
pub(super) async fn wait_for_room(ctx: &WorkflowContext<BatchWorkflow>) {
    let limited: Vec<Limited> = ctx.state(|s| {
        let fresh = s.slots.iter().all(|c| c.state == CaseState::Queued);
        let shares = s.shared.shares.as_ref().filter(|_| fresh);
        (shares.into_iter())
            .flat_map(|sh| sh.input().runtimes.iter())
            .filter_map(|r| Some((r.name.clone(), r.key.clone(), r.queue_limit?)))
            .collect()
    });
    if limited.is_empty() {
        return;
    }
    let keys: Vec<String> = limited.iter().map(|(_, key, _)| key.clone()).collect();
    let mut held_back = false;
    let mut pause = FIRST_LOOK;
    loop {
        if ctx.state(|s| s.lifecycle.winds_down()) {
            return;
        }
        let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(30))
            .retry_policy(RetryPolicy::builder().maximum_attempts(3).build())
            .cancellation_token(WorkflowCancellationToken::new())
            .build();
        cost(ctx, |a| a.activities += 1);
        let waiting = match ctx.execute_activity(SlotsWaiting, keys.clone(), opts).await {
            Ok(waiting) => waiting,
            Err(e) => {
                let why =
                    format!("the queues of the shared runtimes could not be read ({e}): admitted");
                note(ctx, None, why);
                return;
            }
        };
        let over: Vec<String> = (limited.iter().zip(&waiting))
            .filter(|((_, _, limit), waiting)| **waiting >= *limit)
            .map(|((name, _, limit), waiting)| {
                format!("{waiting} cases wait for {name}'s slots (its queue_limit is {limit})")
            })
            .collect();
        if over.is_empty() {
            if held_back {
                note(
                    ctx,
                    None,
                    "admitted: the queues are below their limits".into(),
                );
            }
            return;
        }
        if !held_back {
            held_back = true;
            let why = format!("waiting to be admitted: {}", over.join("; "));
            note(ctx, None, why);
        }
        cost(ctx, |a| a.timers += 1);
        temporalio_sdk::workflows::select! {
            _ = ctx.timer(pause) => {}
            _ = ctx.wait_condition(|s: &BatchWorkflow| s.lifecycle.winds_down()) => {}
        }
        pause = (pause * 2).min(LAST_LOOK);
    }
}
