//! The per-case pipeline: provision → submit → await → evaluate → collect → cleanup, repeated
//! for each attempt the failure taxonomy allows.
//!
//! Each attempt runs as three regular activities, every one keyed by its attempt:
//!
//! ```text
//!   start (shared queue)       provision + submit: any worker; idempotent, finds a started job
//!     └► settle (host queue)   await (heartbeats the job: a retry adopts it) + evaluate + collect
//!          └► cleanup (host)   kill what is left, receipt, attempt record; detached from cancel
//! ```
//!
//! A final attempt (`decide::is_final_when_settled`) is closed by `settle` itself, which does
//! `cleanup`'s work and returns the recorded summary: two activities, not three. Runs recorded
//! before that ([`SETTLE_CLOSES`]) and attempts that may race a duplicate keep `cleanup`.
//! A job that ends within [`START_WATCH`] of its start is settled (and closed, when final) by
//! `start` itself: one activity per short case. Only where the job's wait can end early and
//! hand the job on (a local process without evaluator or container, or a simulation), for a
//! case with no runtime list (which never races a duplicate); runs recorded before it
//! ([`params::START_SETTLES`]) follow every start with a `settle`.
//!
//! Why regular and not local activities: with many cases in flight, a local activity gets its
//! sequence number when it is called, and which case calls next depends on when other local
//! activities completed, which a replay after a crash can regroup. Regular activities resolve
//! from history events, so the order of calls is the same live and in replay. Batches that
//! began on the old local-activity pipeline keep it ([`legacy`]), chosen once per run by a
//! patch marker.

mod ahead;
mod attempt;
mod cleanup;
mod legacy;
mod options;
mod outcome;
mod params;
mod reattach;
mod route;
mod slot;
mod speculate;

use std::time::Duration;

use casebatch_proto::share::HeldSlot;
use casebatch_proto::{
    ActorStatus, AttemptKey, AttemptSummary, CaseState, JobRef, SettleShort, Stage, StartResult,
};
use temporalio_sdk::{WorkflowCancellationToken, WorkflowContext};

use self::attempt::{AttemptEnd, InFlight, settle_job};
use self::cleanup::{Leftovers, clean_up, clean_up_with};
use self::options::stage_options;
use self::outcome::{decide_attempt, mark_error, summary_cleanup_ok};
pub(crate) use self::params::{
    CaseDone, CaseParams, CleanedUp, LeftBehind, Pipeline, slot_returns_by_activity,
};
use self::reattach::{Reattach, is_unanswered};
use self::route::{Route, Routed, dispatch, spill_over};
use crate::contracts::Start;
use crate::decide::{Next, Spent};
use crate::shared::Host;
use crate::shared::{cost, workflow_ms};

/// How long `start` watches the job it started before leaving it to `settle`: a job that ends
/// by then costs one activity, not two (and one that ends within half the heartbeat cadence,
/// no heartbeat either). Longer jobs pay this much later notice that they started, nothing
/// else: the watch heartbeats and is cancelled as `settle` is, and a crash's retry finds the
/// job by its key. 15 s, not the 2 s it was: a job of up to 15 s costs as many actions or
/// fewer (the watch's heartbeats stand in for `settle`'s), and a 512-wide batch of 10-second
/// cases, held back by the server's CPU on a 2-core host, ran 2,048 of them in 50.4 s, not
/// 55.3 s, one activity per case, not two.
const START_WATCH: Duration = Duration::from_secs(15);

/// Runs every attempt of one case until it finishes, is cancelled, or runs out of budget.
pub(crate) async fn run_case<H: Host>(
    ctx: WorkflowContext<H>,
    p: CaseParams,
    cancel: WorkflowCancellationToken,
) -> CaseDone {
    let mut done = CaseDone::starting(&p);
    let mut spent = Spent::default();
    let mut memory_boost_mb = p.memory_boost_mb;
    // A case dealt from a runtime list is routed over it; the frozen pipeline never is.
    let mut route = match p.pipeline {
        Pipeline::Activities => Route::of(&ctx, p.case_index),
        Pipeline::LocalActivities => None,
    };
    if p.ahead {
        let first = p.key(done.attempts + 1, memory_boost_mb);
        if let ahead::Ahead::Released = ahead::prepare_then_wait(&ctx, &first, &mut done).await {
            done.state = CaseState::Queued;
            return done;
        }
    }
    // Attempts left behind (stranded on a runtime that stopped answering, speculations'
    // losers): cleaned up while the case goes on, and waited for before the case ends.
    let mut leftovers = Leftovers::default();
    loop {
        done.attempts += 1;
        let key = p.key(done.attempts, memory_boost_mb);
        let (summary, next) = match p.pipeline {
            Pipeline::Activities => {
                let routed = Routed {
                    route: route.as_mut(),
                    done: &mut done,
                };
                let attempt = run_attempt(&ctx, &p, key, &cancel, spent, routed);
                let ended = leftovers.alongside(attempt).await;
                for left in ended.left_behind {
                    leftovers.add(&ctx, left);
                }
                (ended.summary, ended.next)
            }
            Pipeline::LocalActivities => legacy::run_attempt(&ctx, &p, &key, &cancel, spent).await,
        };
        done.tally.adopted += u32::from(summary.adopted);
        done.tally.cleanup_unconfirmed += u32::from(!summary_cleanup_ok(&summary));
        if let Some(usage) = &summary.usage {
            done.usage.add(usage);
        }
        let after = account(next, &summary, &mut done, &mut spent, &mut memory_boost_mb);
        let backoff = match after {
            After::Finished => break,
            After::NextAttempt => None,
            // Linear backoff.
            After::Retry => Some(Duration::from_millis(
                p.retry_backoff_ms * u64::from(spent.retries),
            )),
            After::RateLimited(asked_ms) => {
                // The batch narrows while its cases are limited (AIMD, `crate::rate_limited`).
                let now = workflow_ms(&ctx);
                ctx.state_mut(|s| {
                    let shared = s.shared_mut();
                    shared.rate.pressure(now);
                    shared.wake();
                });
                let seed = jitter_seed(&p.batch_id, p.case_index, done.attempts);
                let wait = crate::decide::rate_limit_wait_ms(asked_ms, spent.rate_limited, seed);
                done.notes.push(format!(
                    "rate limited; attempt {} in {:.1}s",
                    done.attempts + 1,
                    wait as f64 / 1000.0
                ));
                Some(Duration::from_millis(wait))
            }
        };
        if let Some(backoff) = backoff {
            // A cancel during the wait ends the case.
            if !backoff.is_zero() {
                leftovers
                    .alongside(async {
                        cost(&ctx, |a| a.timers += 1);
                        temporalio_sdk::workflows::select! {
                            _ = ctx.timer(backoff) => {}
                            _ = cancel.cancelled() => {}
                        }
                    })
                    .await;
            }
            if cancel.is_cancelled() {
                done.state = CaseState::Cancelled;
                break;
            }
        }
    }
    leftovers.hand_over(&mut done);
    done
}

/// What a case does after an attempt.
enum After {
    /// Its outcome is final (`done.state` holds it).
    Finished,
    /// Another attempt at once (boosted, spilled over, re-dispatched).
    NextAttempt,
    /// Another attempt after the retry backoff.
    Retry,
    /// Another attempt after the harness's rate limit: the wait it asked for, if it did.
    RateLimited(Option<u64>),
}

/// The seed of a rate-limited case's jitter: its batch, case and attempt, hashed (FNV-1a).
fn jitter_seed(batch_id: &str, case_index: u32, attempt: u32) -> u64 {
    let bytes = batch_id
        .bytes()
        .chain(case_index.to_le_bytes())
        .chain(attempt.to_le_bytes());
    bytes.fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Counts what the attempt's outcome `next` means for the case, with its timeline notes.
fn account(
    next: Next,
    summary: &AttemptSummary,
    done: &mut CaseDone,
    spent: &mut Spent,
    memory_boost_mb: &mut Option<u64>,
) -> After {
    match next {
        Next::Finish(state) => {
            done.state = state;
            if let Some(refused) = done.bundle_refused.take() {
                done.unrecorded_failure = Some(summary.failure.clone().unwrap_or(refused));
            }
            return After::Finished;
        }
        Next::Boost(mb) => {
            done.tally.oom_boosts += 1;
            let from = summary.memory_limit_mb.unwrap_or_default();
            done.notes
                .push(format!("OOM auto-boost {from} → {mb} MB (in-batch retry)"));
            *memory_boost_mb = Some(mb);
        }
        // The note was written when the spillover was decided.
        Next::Spill => done.tally.spillovers += 1,
        Next::Redispatch => {
            spent.redispatches += 1;
            done.tally.redispatched += 1;
            done.notes.push(format!(
                "job lost with nothing to adopt; re-dispatched as attempt {}",
                done.attempts + 1
            ));
        }
        Next::RateLimited(asked_ms) => {
            spent.rate_limited += 1;
            done.tally.rate_limited += 1;
            return After::RateLimited(asked_ms);
        }
        Next::Retry => {
            spent.retries += 1;
            done.tally.retries += 1;
            let failure = summary.failure.as_ref().map(ToString::to_string);
            done.notes.push(format!(
                "retry {} after {}",
                spent.retries,
                failure.unwrap_or_default()
            ));
            return After::Retry;
        }
    }
    After::NextAttempt
}

/// One attempt through every stage. Cleanup runs for every attempt that got as far as being
/// started (it also writes the attempt record), on a cancellation token detached from the
/// batch's so a cancel cannot skip it. A routed straggler may race a duplicate on another
/// runtime of its list ([`speculate`]); the attempt is then whichever settles first.
///
/// A runtime that does not answer for the attempt's job (`RUNTIME_UNREACHABLE` where the job
/// may exist: a settle that lost its agent, a submit that may have reached it) is asked
/// again, for the same attempt, before anything new starts: a job that outlived the outage,
/// running or finished, settles the case ([`MAX_REATTACHES`] times, a case with no list
/// only). When the case moves on instead (to another runtime of its list, or to a new
/// attempt), the attempt is returned as stranded: the caller cleans it up on its runtime
/// once that answers, while the case goes on.
async fn run_attempt<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    key: AttemptKey,
    cancel: &WorkflowCancellationToken,
    spent: Spent,
    routed: Routed<'_>,
) -> AttemptEnd {
    // On a shared runtime, the job starts once the batch's turn gives it a slot; the slot is
    // given back once the job has ended (by `settle` at once, else by the batch as the
    // attempt closes).
    let slot = slot::acquire(ctx, &key, cancel, p.slot_returns_by_activity).await;
    let mut stages = Stages {
        ctx,
        p,
        cancel,
        reattach: Reattach::new(p.outage_rules && routed.route.is_none()),
        routed,
        left_behind: Vec::new(),
        slot: slot.as_ref().map(slot::Slot::held),
    };
    let (mut attempt, job, mut job_may_exist) = stages.start(key).await;
    // A `settle` records the slot's wait; else the batch's return of the slot does.
    let settling = job.is_some();
    if let Some(job) = job {
        stages.settle(&mut attempt, job).await;
        job_may_exist = true;
    }
    let given_back =
        slot.map(|s| slot::give_back(ctx, s.recorded(settling), true, attempt.slot_returned));
    let end = stages.close(attempt, job_may_exist, spent).await;
    if let Some(given_back) = given_back {
        given_back.await;
    }
    end
}

/// What the stages of one attempt share.
struct Stages<'a, 'r, H: Host> {
    ctx: &'a WorkflowContext<H>,
    p: &'a CaseParams,
    cancel: &'a WorkflowCancellationToken,
    reattach: Reattach,
    routed: Routed<'r>,
    /// Attempts this one leaves behind: a speculation's loser, or itself when stranded.
    left_behind: Vec<InFlight>,
    /// The slot the attempt holds on a shared runtime, for `settle` to give back early.
    slot: Option<HeldSlot>,
}

impl<H: Host> Stages<'_, '_, H> {
    /// `start`: provision + submit, on any worker (routed over the case's runtime list).
    /// Returns the attempt, its job if one started, and whether a job may exist all the same
    /// (a submit that may have reached a runtime that did not answer).
    async fn start(&mut self, mut key: AttemptKey) -> (InFlight, Option<JobRef>, bool) {
        let (ctx, p, cancel) = (self.ctx, self.p, self.cancel);
        let mut s = AttemptSummary::new(&key);
        s.started_at_ms = Some(workflow_ms(ctx));
        let mut host_queue = None;
        let mut job = None;
        let mut job_may_exist = false;
        let mut never_submitted = false;
        let mut settled = None;
        // A case with no runtime list never races a duplicate, so `start` may close it.
        let settle = (p.start_settles && self.routed.route.is_none()).then(|| SettleShort {
            within_ms: START_WATCH.as_millis() as u64,
            close_from: s.clone(),
        });
        let dispatched = dispatch(ctx, &mut key, settle, cancel, &mut self.routed);
        let (mut started, probe) = dispatched.await;
        s.probe = probe && p.outage_rules;
        loop {
            match started {
                Some(Ok(StartResult::Started(j))) => {
                    host_queue = j.host_queue.clone();
                    job = Some(j);
                }
                Some(Ok(StartResult::Watched { job: j, heartbeats })) => {
                    cost(ctx, |a| a.heartbeats += heartbeats);
                    host_queue = j.host_queue.clone();
                    job = Some(j);
                }
                Some(Ok(StartResult::Settled {
                    job: j,
                    settled: done,
                })) => {
                    host_queue = j.host_queue.clone();
                    settled = Some(done);
                    job_may_exist = true;
                }
                Some(Ok(StartResult::Failed {
                    failure,
                    host_queue: queue,
                    job_may_exist: may_exist,
                    ..
                })) => {
                    if may_exist
                        && is_unanswered(&failure)
                        && self
                            .reattach
                            .again(ctx, &key, cancel, self.routed.done)
                            .await
                    {
                        let stage = format!("start.r{}", self.reattach.made());
                        let opts =
                            stage_options(ctx, &stage, &key, Duration::from_secs(60), None, cancel);
                        cost(ctx, |a| a.activities += 1);
                        let input = casebatch_proto::StartInput::Key(key.clone());
                        started = Some(ctx.execute_activity(Start, input, opts).await);
                        continue;
                    }
                    host_queue = queue;
                    job_may_exist = may_exist;
                    never_submitted = p.outage_rules && !may_exist;
                    if failure.stage == Stage::Submit {
                        s.actor = Some(ActorStatus::Failed);
                    }
                    s.failure = Some(failure);
                }
                // Only a cancel ends the dispatch without a start (it waited for a circuit).
                Some(Ok(StartResult::Skipped { .. })) | None => {
                    s.actor = Some(ActorStatus::Cancelled)
                }
                Some(Err(e)) => mark_error(&mut s, cancel, Stage::Provision, &e),
            }
            break;
        }
        let mut attempt = InFlight {
            key,
            host_queue,
            summary: s,
            closed: false,
            held_job: job.is_some() || settled.is_some(),
            never_submitted,
            slot_returned: false,
        };
        if let Some(settled) = settled {
            // As a `settle` would have: its summary, and closed when it was final.
            attempt.settled(ctx, cancel, Ok(*settled));
        }
        (attempt, job, job_may_exist)
    }

    /// `settle`: await + evaluate + collect where the job runs; a retry adopts the job. A
    /// final attempt is closed by settle too, unless it may race a duplicate.
    async fn settle(&mut self, attempt: &mut InFlight, job: JobRef) {
        let (ctx, p, cancel) = (self.ctx, self.p, self.cancel);
        let before = attempt.summary.clone();
        let mut stage = "settle".to_string();
        loop {
            let token = cancel.child_token();
            let may_race = speculate::may(ctx, &self.routed);
            let close_from = (p.settle_closes && !may_race).then(|| attempt.summary.clone());
            let queue = attempt.host_queue.clone();
            let settle = settle_job(
                ctx,
                p,
                &stage,
                &attempt.key,
                job.clone(),
                close_from,
                queue,
                &token,
                self.slot.clone(),
            );
            if may_race {
                let loser =
                    speculate::race(ctx, p, attempt, settle, token, cancel, &mut self.routed);
                if let Some(loser) = loser.await {
                    if p.outage_rules {
                        // Its runtime may be the one that stopped answering: cleaned up
                        // patiently, while the case goes on.
                        self.left_behind.push(loser);
                    } else {
                        clean_up(ctx, loser, false, self.routed.done).await;
                    }
                }
            } else {
                let result = settle.await;
                attempt.settled(ctx, &token, result);
            }
            let unanswered =
                !attempt.closed && attempt.summary.failure.as_ref().is_some_and(is_unanswered);
            if unanswered
                && (self.reattach)
                    .again(ctx, &attempt.key, cancel, self.routed.done)
                    .await
            {
                // The same attempt, settled again: its wait re-attaches to the job by key.
                attempt.summary = before.clone();
                stage = format!("settle.r{}", self.reattach.made());
                continue;
            }
            break;
        }
    }

    /// Decides what comes next, then cleans the attempt up where it ran (unless `settle`
    /// closed it), or leaves it behind, stranded, when its runtime did not answer.
    async fn close(
        mut self,
        mut attempt: InFlight,
        job_may_exist: bool,
        spent: Spent,
    ) -> AttemptEnd {
        let (ctx, p, cancel) = (self.ctx, self.p, self.cancel);
        // The runtime did not answer for a job that may run there: whatever comes next, the
        // attempt's cleanup waits for that runtime longer than for one that answers.
        let unanswered = p.outage_rules
            && job_may_exist
            && !attempt.closed
            && attempt.summary.failure.as_ref().is_some_and(is_unanswered)
            && !cancel.is_cancelled();

        // Decide once, before cleanup: the bundle records exactly what the workflow decides.
        let mut next = decide_attempt(&mut attempt.summary, cancel, p.policy, spent);
        if let Some(to) = spill_over(
            ctx,
            &attempt.summary,
            cancel,
            &mut self.routed,
            p.outage_rules,
        ) {
            next = Next::Spill;
            self.routed.done.notes.push(to);
        }
        let will_retry = !matches!(next, Next::Finish(_));
        let summary = if attempt.closed && !will_retry {
            // settle cleaned up and recorded it, and it decided the same.
            attempt.summary
        } else if unanswered && will_retry {
            // The case moves on while its job may run where nobody answers: cleaned up
            // alongside.
            attempt.closed = false;
            attempt.summary.stranded = true;
            let summary = attempt.summary.clone();
            self.left_behind.push(attempt);
            summary
        } else {
            // cleanup: always, where the attempt ran
            attempt.closed = false;
            clean_up_with(ctx, attempt, will_retry, unanswered, self.routed.done).await
        };
        AttemptEnd {
            summary,
            next,
            left_behind: self.left_behind,
        }
    }
}
