//! Cleanup of an attempt where it ran, on a token no cancel reaches, and the attempts a case
//! leaves behind (stranded, or a speculation's loser), cleaned up while the case goes on.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use casebatch_proto::{AttemptSummary, CleanupInput, CleanupReport, FailureCode, Stage};
use temporalio_sdk::{ActivityExecutionError, WorkflowCancellationToken, WorkflowContext};

use super::attempt::InFlight;
use super::options::stage_options;
use super::outcome::activity_failure;
use super::params::{CaseDone, CleanedUp, LeftBehind};
use crate::contracts::Cleanup;
use crate::shared::{Host, cost};

/// How long the cleanup of an attempt whose runtime did not answer waits for it to answer
/// (a job that may run there is killed once it does).
pub(super) const UNANSWERED_WAIT: Duration =
    Duration::from_secs(casebatch_proto::UNANSWERED_WAIT_S);

/// Attempts a case leaves behind, stranded on a runtime that stopped answering or a
/// speculation's loser, cleaned up patiently while the case goes on (their activities are
/// polled after the case's own work, in the order they were left, so replay issues the same
/// commands). When the case ends, those still running are handed to the batch.
#[derive(Default)]
pub(super) struct Leftovers {
    pub(super) running: Vec<LeftBehind>,
    pub(super) ended: Vec<CleanedUp>,
}

impl Leftovers {
    pub(super) fn add<H: Host>(&mut self, ctx: &WorkflowContext<H>, attempt: InFlight) {
        let ctx = ctx.clone();
        self.running.push(Box::pin(async move {
            let report = run_cleanup(&ctx, &attempt, true, true).await;
            let (confirmed, held_job) =
                report.map_or((false, false), |r| (r.cleanup_confirmed, r.held_job));
            CleanedUp {
                stranded: attempt.summary.stranded,
                confirmed,
                held_job,
            }
        }));
    }

    /// Runs `work`, driving the left attempts' cleanups meanwhile.
    pub(super) async fn alongside<T>(&mut self, work: impl Future<Output = T>) -> T {
        if self.running.is_empty() {
            return work.await;
        }
        let mut work = std::pin::pin!(work);
        let Self { running, ended } = self;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            let mut i = 0;
            while i < running.len() {
                match running[i].as_mut().poll(cx) {
                    Poll::Ready(end) => {
                        ended.push(end);
                        drop(running.remove(i));
                    }
                    Poll::Pending => i += 1,
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Counts the cleanups that ended and hands the running ones to the batch with the case.
    pub(super) fn hand_over(&mut self, done: &mut CaseDone) {
        for end in self.ended.drain(..) {
            end.count(&mut done.tally);
        }
        done.left_behind = std::mem::take(&mut self.running);
    }
}

/// Runs `cleanup` where the attempt ran, on a token no cancel reaches, and returns the
/// summary with the confirmation. An unconfirmed cleanup of a speculation's loser is
/// counted here; the case's own attempt is counted by the caller.
pub(super) async fn clean_up<H: Host>(
    ctx: &WorkflowContext<H>,
    attempt: InFlight,
    will_retry: bool,
    done: &mut CaseDone,
) -> AttemptSummary {
    clean_up_with(ctx, attempt, will_retry, false, done).await
}

/// [`clean_up`], `patient` with a runtime that did not answer for the attempt's job.
pub(super) async fn clean_up_with<H: Host>(
    ctx: &WorkflowContext<H>,
    attempt: InFlight,
    will_retry: bool,
    patient: bool,
    done: &mut CaseDone,
) -> AttemptSummary {
    let confirmed = match run_cleanup(ctx, &attempt, will_retry, patient).await {
        Ok(r) => r.cleanup_confirmed,
        Err(e) => {
            let failure = activity_failure(Stage::Cleanup, &e);
            if failure.code == FailureCode::BundleUnwritable {
                done.bundle_refused = Some(failure);
            }
            false
        }
    };
    let mut summary = attempt.summary;
    summary.cleanup_confirmed = Some(confirmed);
    if summary.speculative_loser && !confirmed {
        done.tally.cleanup_unconfirmed += 1;
    }
    summary
}

/// The `cleanup` activity of an attempt, where it ran, on a token no cancel reaches. A
/// patient one waits up to [`UNANSWERED_WAIT`] for the attempt's runtime to answer.
pub(super) async fn run_cleanup<H: Host>(
    ctx: &WorkflowContext<H>,
    attempt: &InFlight,
    will_retry: bool,
    patient: bool,
) -> Result<CleanupReport, ActivityExecutionError> {
    let input = CleanupInput {
        key: attempt.key.clone(),
        summary: attempt.summary.clone(),
        will_retry,
        never_submitted: attempt.never_submitted,
        patient,
    };
    let detached = WorkflowCancellationToken::new();
    let timeout = if patient {
        UNANSWERED_WAIT + Duration::from_secs(60)
    } else {
        Duration::from_secs(60)
    };
    let queue = attempt.host_queue.clone();
    let opts = stage_options(ctx, "cleanup", &attempt.key, timeout, queue, &detached);
    cost(ctx, |a| a.activities += 1);
    let report = ctx.execute_activity(Cleanup, input, opts).await;
    if let Ok(r) = &report {
        cost(ctx, |a| a.heartbeats += r.heartbeats);
    }
    report
}
