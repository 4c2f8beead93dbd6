//! Tail speculation, the case's side: a routed straggler that the batch asks to speculate
//! (`crate::tail`) starts one duplicate on another runtime of its list whose circuit the
//! batch has not seen open, and races it against its own job. The first copy to run to its
//! end wins; the other is cancelled (its settle stops the job), cleaned up, and kept as
//! evidence marked `speculative_loser`. A copy that ends without running to its end (a
//! failed start, a lost job) does not win by ending first: the race waits for the other.
//!
//! ```text
//!   settle(a) ─────────────────────────────┐ first to run to its end wins
//!        └ asked ► start(b) ► settle(b) ───┘ the other: cancelled, cleaned up, kept
//! ```

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use casebatch_proto::{
    ActorStatus, AttemptKey, AttemptSummary, Failure, FailureCode, Settled, Stage, StartInput,
    StartResult,
};
use futures::future::LocalBoxFuture;
use temporalio_sdk::{ActivityExecutionError, WorkflowCancellationToken, WorkflowContext};

use super::attempt::{InFlight, settle_job};
use super::options::stage_options;
use super::outcome::mark_error;
use super::params::{CaseDone, CaseParams};
use super::route::Routed;
use crate::contracts::Start;
use crate::shared::{Host, cost, note, workflow_ms};

/// Whether this attempt can take part: the batch speculates and the case has a list.
pub(super) fn may<H: Host>(ctx: &WorkflowContext<H>, routed: &Routed<'_>) -> bool {
    routed.route.is_some() && ctx.state(|s| s.shared().tail.is_some())
}

type SettleFuture = LocalBoxFuture<'static, Result<Settled, ActivityExecutionError>>;

/// Settles `primary`, racing a duplicate if the batch asks for one while it waits. On return
/// `primary` holds the attempt that counts (the duplicate, if it won); the loser, if a
/// duplicate ran, is returned for cleanup.
pub(super) async fn race<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    primary: &mut InFlight,
    settle: SettleFuture,
    token: WorkflowCancellationToken,
    cancel: &WorkflowCancellationToken,
    routed: &mut Routed<'_>,
) -> Option<InFlight> {
    let case = p.case_index;
    let dispatched = primary.summary.started_at_ms.unwrap_or_default();
    ctx.state_mut(|s| with_tail(s, |t| t.waiting(case, dispatched)));
    let mut settle = until_asked(ctx, case, primary, settle, &token).await?;

    // Asked: one duplicate, on the next runtime of the list not seen open.
    ctx.state_mut(|s| with_tail(s, |t| t.spend(case)));
    let route = routed.route.as_deref_mut()?;
    let Some((to, from_name, to_name)) = route.next_healthy(ctx) else {
        note(
            ctx,
            Some(case),
            "tail speculation skipped: no other runtime of the list is healthy".into(),
        );
        let result = settle.await;
        primary.settled(ctx, &token, result);
        ctx.state_mut(|s| with_tail(s, |t| t.settled(case)));
        return None;
    };
    routed.done.attempts += 1;
    routed.done.tally.speculations += 1;
    note(
        ctx,
        Some(case),
        format!("tail speculation {from_name} ⇢ {to_name}"),
    );
    let key = AttemptKey {
        attempt: routed.done.attempts,
        runtime: Some(to_name.clone()),
        ..primary.key.clone()
    };
    let mut duplicate = InFlight {
        summary: AttemptSummary {
            started_at_ms: Some(workflow_ms(ctx)),
            ..AttemptSummary::new(&key)
        },
        key,
        host_queue: None,
        closed: false,
        held_job: false,
        never_submitted: false,
        slot_returned: false,
    };
    let dup_token = cancel.child_token();
    ctx.state_mut(|s| with_tail(s, |t| t.duplicates += 1));
    let copies = Copies {
        primary: &mut *primary,
        duplicate: &mut duplicate,
        token: &token,
        dup_token: &dup_token,
    };
    let winner = copies.race(ctx, p, &mut settle).await;
    ctx.state_mut(|s| {
        with_tail(s, |t| {
            t.duplicates -= 1;
            t.settled(case);
        })
    });

    let duplicate_won = winner == Some(Copy::Duplicate);
    if duplicate_won {
        route.current = to;
    }
    Some(conclude(
        primary,
        duplicate,
        duplicate_won,
        (from_name, to_name),
        routed.done,
    ))
}

/// The race's end: a duplicate that won becomes the attempt that counts (when neither ran to
/// its end, the case's own attempt does, and decides: a retry, a cancel). The other is kept
/// as evidence, with a note naming where each ran (the primary's runtime, the duplicate's).
fn conclude(
    primary: &mut InFlight,
    mut duplicate: InFlight,
    duplicate_won: bool,
    (from_name, to_name): (String, String),
    done: &mut CaseDone,
) -> InFlight {
    if duplicate_won {
        std::mem::swap(primary, &mut duplicate);
        done.tally.speculation_wins += 1;
    }
    let mut loser = duplicate;
    loser.summary.speculative_loser = true;
    let (won_on, lost_on) = if duplicate_won {
        (to_name, from_name)
    } else {
        (from_name, to_name)
    };
    done.notes.push(format!(
        "tail speculation: attempt {} on {won_on} counts; attempt {} on {lost_on} stopped \
         and kept as evidence",
        primary.key.attempt, loser.key.attempt
    ));
    loser
}

/// Until the batch asks, a speculating attempt is a plain settle. `None`: it settled first
/// (folded into `primary`); otherwise the batch asked, and the settle is still running.
async fn until_asked<H: Host>(
    ctx: &WorkflowContext<H>,
    case: u32,
    primary: &mut InFlight,
    mut settle: SettleFuture,
    token: &WorkflowCancellationToken,
) -> Option<SettleFuture> {
    let asked =
        ctx.wait_condition(move |s: &H| s.shared().tail.as_ref().is_some_and(|t| t.is_asked(case)));
    let mut asked = pin!(asked);
    let first = std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = settle.as_mut().poll(cx) {
            return Poll::Ready(Some(result));
        }
        // Fused: after the workflow's cancellation resolved it, it stays pending.
        match asked.as_mut().poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    })
    .await;
    match first {
        Some(result) => {
            primary.settled(ctx, token, result);
            ctx.state_mut(|s| with_tail(s, |t| t.settled(case)));
            None
        }
        None => Some(settle),
    }
}

/// The two copies of a raced attempt, each with the token its settle runs under.
struct Copies<'a> {
    primary: &'a mut InFlight,
    duplicate: &'a mut InFlight,
    token: &'a WorkflowCancellationToken,
    dup_token: &'a WorkflowCancellationToken,
}

impl Copies<'_> {
    /// The race. Each copy is folded in when it ends; the first to run to its end wins and
    /// the other is cancelled (its settle waits until the job is stopped). `None`: neither
    /// ran to its end.
    async fn race<H: Host>(
        mut self,
        ctx: &WorkflowContext<H>,
        p: &CaseParams,
        settle: &mut SettleFuture,
    ) -> Option<Copy> {
        let copy_key = self.duplicate.key.clone();
        let mut copy = pin!(run_duplicate(ctx, p, &copy_key, self.dup_token));
        let mut primary_open = true;
        let mut copy_open = true;
        let mut winner = None;
        while primary_open || copy_open {
            let ended = std::future::poll_fn(|cx| {
                if primary_open && let Poll::Ready(r) = settle.as_mut().poll(cx) {
                    return Poll::Ready(Ended::Primary(r));
                }
                if copy_open && let Poll::Ready((queue, end)) = copy.as_mut().poll(cx) {
                    return Poll::Ready(Ended::Copy(queue, end));
                }
                Poll::Pending
            })
            .await;
            match ended {
                Ended::Primary(result) => {
                    primary_open = false;
                    self.primary.settled(ctx, self.token, result);
                    if winner.is_none() && self.primary.ran_to_end() {
                        winner = Some(Copy::Primary);
                        self.dup_token.cancel();
                    }
                }
                Ended::Copy(host_queue, end) => {
                    copy_open = false;
                    self.fold_duplicate(ctx, host_queue, end);
                    if winner.is_none() && self.duplicate.ran_to_end() {
                        winner = Some(Copy::Duplicate);
                        self.token.cancel();
                    }
                }
            }
        }
        winner
    }

    /// Folds how the duplicate ended into its summary.
    fn fold_duplicate<H: Host>(
        &mut self,
        ctx: &WorkflowContext<H>,
        host_queue: Option<String>,
        end: CopyEnd,
    ) {
        let duplicate = &mut *self.duplicate;
        duplicate.host_queue = host_queue;
        match end {
            CopyEnd::Settled(result) => {
                duplicate.held_job = true;
                duplicate.settled(ctx, self.dup_token, result);
            }
            CopyEnd::NotStarted(failure) => {
                if failure.stage == Stage::Submit {
                    duplicate.summary.actor = Some(ActorStatus::Failed);
                }
                duplicate.summary.failure = Some(failure);
            }
            CopyEnd::StartError(e) => {
                mark_error(&mut duplicate.summary, self.dup_token, Stage::Provision, &e);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copy {
    Primary,
    Duplicate,
}

enum Ended {
    Primary(Result<Settled, ActivityExecutionError>),
    Copy(Option<String>, CopyEnd),
}

/// How a duplicate ended. One lives per race, for a moment: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum CopyEnd {
    Settled(Result<Settled, ActivityExecutionError>),
    /// `start` reported a failure (or the runtime's circuit refused it).
    NotStarted(Failure),
    /// `start` itself failed (or was cancelled).
    StartError(ActivityExecutionError),
}

/// The duplicate: `start` on its runtime (no waiting for a circuit, no moving on: a runtime
/// that refuses it simply loses), then `settle`. Returns where it ran and how it ended.
async fn run_duplicate<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    key: &AttemptKey,
    token: &WorkflowCancellationToken,
) -> (Option<String>, CopyEnd) {
    let opts = stage_options(ctx, "start", key, Duration::from_secs(60), None, token);
    cost(ctx, |a| a.activities += 1);
    match ctx
        .execute_activity(Start, StartInput::Key(key.clone()), opts)
        .await
    {
        // Never asked to settle: a duplicate races, so neither may close the attempt.
        Ok(StartResult::Settled { job, settled }) => {
            (job.host_queue.clone(), CopyEnd::Settled(Ok(*settled)))
        }
        Ok(StartResult::Started(job) | StartResult::Watched { job, .. }) => {
            let host_queue = job.host_queue.clone();
            let settle = settle_job(
                ctx,
                p,
                "settle",
                key,
                job,
                None,
                host_queue.clone(),
                token,
                None,
            );
            (host_queue, CopyEnd::Settled(settle.await))
        }
        Ok(StartResult::Failed {
            failure,
            host_queue,
            ..
        }) => (host_queue, CopyEnd::NotStarted(failure)),
        Ok(StartResult::Skipped { circuit }) => (
            None,
            CopyEnd::NotStarted(Failure::infra(
                Stage::Provision,
                FailureCode::RuntimeUnreachable,
                format!("the circuit of runtime {} is open", circuit.runtime),
            )),
        ),
        Err(e) => (None, CopyEnd::StartError(e)),
    }
}

fn with_tail<H: Host>(s: &mut H, f: impl FnOnce(&mut crate::tail::Tail)) {
    if let Some(t) = s.shared_mut().tail.as_mut() {
        f(t);
    }
}
