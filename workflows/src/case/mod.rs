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
//!
//! Why regular and not local activities: with many cases in flight, a local activity gets its
//! sequence number when it is called, and which case calls next depends on when other local
//! activities completed, which a replay after a crash can regroup. Regular activities resolve
//! from history events, so the order of calls is the same live and in replay. Batches that
//! began on the old local-activity pipeline keep it ([`legacy`]), chosen once per run by a
//! patch marker.

mod ahead;
mod legacy;
mod speculate;

use std::time::Duration;

use std::future::Future;
use std::task::Poll;

use casebatch_proto::{
    ActorStatus, AttemptKey, AttemptSummary, CaseState, CleanupInput, CleanupReport, Counters,
    Failure, FailureClass, FailureCode, JobRef, SettleInput, Settled, Stage, StartResult,
};
use futures::future::LocalBoxFuture;
use temporalio_common::RetryPolicy;
use temporalio_common::protos::temporal::api::failure::v1::{
    Failure as ProtoFailure, failure::FailureInfo,
};
use temporalio_sdk::{
    ActivityCancellationType, ActivityExecutionError, ActivityOptions, LocalActivityOptions,
    WorkflowCancellationToken, WorkflowContext,
};

use crate::circuits::Pick;
use crate::contracts::{Cleanup, Settle, Start};
use crate::decide::{self, Next, Spent};
use crate::shared::{Host, note, workflow_ms};

/// Patch id recorded by runs whose attempts use regular activities ([`Pipeline::Activities`]).
pub(crate) const STAGES_AS_ACTIVITIES: &str = "stages-as-activities";

/// Patch id recorded by runs whose `settle` closes final attempts itself (see
/// [`SettleInput::close_from`]); runs recorded before it keep a `cleanup` per attempt.
pub(crate) const SETTLE_CLOSES: &str = "settle-closes-final-attempts";

/// Patch id recorded by runs that keep the rules for runtimes that fail or stop answering
/// ([`CaseParams::outage_rules`]); runs recorded before it replay as they ran.
pub(crate) const OUTAGE_RULES: &str = "runtime-outage-rules";

/// How a run executes attempts. Chosen once per run: a history recorded without the patch
/// marker keeps the pipeline it began with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pipeline {
    /// start / settle / cleanup as regular activities.
    Activities,
    /// Six local activities per attempt ([`legacy`]): only for runs recorded that way.
    LocalActivities,
}

impl Pipeline {
    pub(crate) fn of_run<H: Host>(ctx: &WorkflowContext<H>) -> Self {
        if ctx.patched(STAGES_AS_ACTIVITIES) {
            Pipeline::Activities
        } else {
            Pipeline::LocalActivities
        }
    }

    /// Whether `settle` may close final attempts in this run. Asked once, at the run's start.
    pub(crate) fn settle_closes<H: Host>(self, ctx: &WorkflowContext<H>) -> bool {
        self == Pipeline::Activities && ctx.patched(SETTLE_CLOSES)
    }

    /// Whether this run keeps [`OUTAGE_RULES`]. Asked once, at the run's start.
    pub(crate) fn outage_rules<H: Host>(self, ctx: &WorkflowContext<H>) -> bool {
        self == Pipeline::Activities && ctx.patched(OUTAGE_RULES)
    }
}

/// Heartbeat timeout of every stage activity (`await` in the legacy pipeline): how quickly a
/// stage that a crashed worker held is retried elsewhere (`settle`: the job adopted).
const AWAIT_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a stage routed to the job's host (`settle`, `cleanup`; `await` in the legacy
/// pipeline) may wait for a worker there. Past it the host is presumed gone with its job, and
/// the case is re-dispatched.
const HOST_WAIT: Duration = Duration::from_secs(300);

/// Static facts the pipeline needs about its batch.
#[derive(Debug, Clone)]
pub(crate) struct CaseParams {
    pub batch_id: String,
    pub bundle_dir: String,
    pub case_index: u32,
    /// Attempts made by earlier runs of this batch (resume continues the numbering).
    pub attempts_before: u32,
    pub policy: decide::Policy,
    /// Memory for the first attempt (set by retry-failed after an OOM kill).
    pub memory_boost_mb: Option<u64>,
    pub retry_backoff_ms: u64,
    pub max_timeout_seconds: u64,
    pub pipeline: Pipeline,
    /// `settle` closes final attempts ([`Pipeline::settle_closes`]).
    pub settle_closes: bool,
    /// The run keeps the rules for runtimes that fail or stop answering ([`OUTAGE_RULES`]):
    /// a failed probe costs the case nothing, an unanswered job is asked about again or left
    /// stranded, never started twice unseen.
    pub outage_rules: bool,
    /// Admitted ahead of a free slot: provision the first attempt's environment, then wait
    /// for the batch to grant a slot ([`ahead`]).
    pub ahead: bool,
}

/// What a finished case reports back to admission.
pub(crate) struct CaseDone {
    pub case_index: u32,
    pub state: CaseState,
    pub attempts: u32,
    /// What it did, counted the way the batch counts it (added to the batch's counters).
    pub tally: Counters,
    /// Timeline messages about this case (the case is named by the step, not the text).
    pub notes: Vec<String>,
    /// Cleanup could not write the attempt's records: its worker may not write the bundle.
    pub bundle_refused: Option<Failure>,
    /// The case's final failure, when the bundle could not hold it (the runner records it).
    pub unrecorded_failure: Option<Failure>,
    /// Cleanups of attempts it left behind that are still running: the batch drives them
    /// on, so the case's slot is free once its own outcome is final.
    pub left_behind: Vec<LeftBehind>,
}

/// The cleanup of an attempt left behind (stranded, or a speculation's loser), running.
pub(crate) type LeftBehind = LocalBoxFuture<'static, CleanedUp>;

/// What the cleanup of an attempt left behind found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CleanedUp {
    pub stranded: bool,
    pub confirmed: bool,
    /// Its runtime held a job for it: the case paid for that one and the one counting.
    pub held_job: bool,
}

fn local(timeout: Duration, token: &WorkflowCancellationToken) -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .start_to_close_timeout(timeout)
        .retry_policy(retry_policy(Duration::from_millis(500), 3))
        .cancellation_token(token.clone())
        .build()
}

/// An activity that failed instead of returning an outcome. A casebatch failure type
/// (`casebatch.<class>`) carries its classified [`Failure`] as details; anything else is the
/// platform's fault.
fn activity_failure(stage: Stage, err: &ActivityExecutionError) -> Failure {
    match err.failure().and_then(casebatch_failure) {
        Some(raised) => raised.into_failure(stage),
        None => Failure::infra(stage, FailureCode::ActivityError, err.to_string()),
    }
}

/// A casebatch-typed application failure as the workflow received it.
struct Raised<'a> {
    class: FailureClass,
    non_retryable: bool,
    message: &'a str,
    details: Option<Failure>,
}

impl Raised<'_> {
    fn into_failure(self, stage: Stage) -> Failure {
        // The activity classified it where it was born, stage included.
        if let Some(f) = self.details {
            return f;
        }
        // Histories recorded before failures carried details spell the code into the message.
        let (code, message) = match self.message.split_once(": ") {
            Some((code, message)) => (FailureCode::parse(code), message),
            None => (FailureCode::ActivityError, self.message),
        };
        Failure::new(stage, self.class, code, message, !self.non_retryable)
    }
}

/// The first casebatch-typed application failure in a failure chain (local activities raise
/// it at the top; full activities wrap it in an activity failure).
fn casebatch_failure(f: &ProtoFailure) -> Option<Raised<'_>> {
    match &f.failure_info {
        Some(FailureInfo::ApplicationFailureInfo(info)) => {
            let class = FailureClass::from_temporal_type(&info.r#type)?;
            let details = info
                .details
                .as_ref()
                .and_then(|d| d.payloads.first())
                .and_then(|p| serde_json::from_slice::<Failure>(&p.data).ok());
            Some(Raised {
                class,
                non_retryable: info.non_retryable,
                message: f.message.as_str(),
                details,
            })
        }
        _ => f.cause.as_deref().and_then(casebatch_failure),
    }
}

/// Activity retries never repeat what the taxonomy says repeats the same way.
fn retry_policy(initial: Duration, maximum_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .initial_interval(initial)
        .backoff_coefficient(1.5)
        .maximum_interval(Duration::from_secs(5))
        .maximum_attempts(maximum_attempts)
        .non_retryable_error_types(FailureClass::non_retryable_temporal_types())
        .build()
}

/// Runs every attempt of one case until it finishes, is cancelled, or runs out of budget.
pub(crate) async fn run_case<H: Host>(
    ctx: WorkflowContext<H>,
    p: CaseParams,
    cancel: WorkflowCancellationToken,
) -> CaseDone {
    let mut done = CaseDone {
        case_index: p.case_index,
        state: CaseState::Failed,
        attempts: p.attempts_before,
        tally: Counters::default(),
        notes: Vec::new(),
        bundle_refused: None,
        unrecorded_failure: None,
        left_behind: Vec::new(),
    };
    let mut spent = Spent::default();
    let mut memory_boost_mb = p.memory_boost_mb;
    // A case dealt from a runtime list is routed over it; the frozen pipeline never is.
    let mut route = match p.pipeline {
        Pipeline::Activities => Route::of(&ctx, p.case_index),
        Pipeline::LocalActivities => None,
    };
    let key_of = |attempt, memory_boost_mb| AttemptKey {
        batch_id: p.batch_id.clone(),
        bundle_dir: p.bundle_dir.clone(),
        case_index: p.case_index,
        attempt,
        memory_boost_mb,
        runtime: None,
    };
    if p.ahead {
        let first = key_of(done.attempts + 1, memory_boost_mb);
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
        let key = key_of(done.attempts, memory_boost_mb);
        let spent_before = spent;
        let (summary, next) = match p.pipeline {
            Pipeline::Activities => {
                let routed = Routed {
                    route: route.as_mut(),
                    done: &mut done,
                };
                let attempt = run_attempt(&ctx, &p, key, &cancel, spent_before, routed);
                let ended = leftovers.alongside(attempt).await;
                for left in ended.left_behind {
                    leftovers.add(&ctx, left);
                }
                (ended.summary, ended.next)
            }
            Pipeline::LocalActivities => {
                legacy::run_attempt(&ctx, &p, &key, &cancel, spent_before).await
            }
        };
        done.tally.adopted += u32::from(summary.adopted);
        done.tally.cleanup_unconfirmed += u32::from(!summary_cleanup_ok(&summary));

        match next {
            Next::Finish(state) => {
                done.state = state;
                if let Some(refused) = done.bundle_refused.take() {
                    done.unrecorded_failure = Some(summary.failure.clone().unwrap_or(refused));
                }
                leftovers.hand_over(&mut done);
                return done;
            }
            Next::Boost(mb) => {
                done.tally.oom_boosts += 1;
                let from = summary.memory_limit_mb.unwrap_or_default();
                done.notes
                    .push(format!("OOM auto-boost {from} → {mb} MB (in-batch retry)"));
                memory_boost_mb = Some(mb);
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
            Next::Retry => {
                spent.retries += 1;
                done.tally.retries += 1;
                let failure = summary.failure.as_ref().map(ToString::to_string);
                done.notes.push(format!(
                    "retry {} after {}",
                    spent.retries,
                    failure.unwrap_or_default()
                ));
                // Linear backoff; a cancel during the wait ends the case.
                let backoff = Duration::from_millis(p.retry_backoff_ms * u64::from(spent.retries));
                if !backoff.is_zero() {
                    leftovers
                        .alongside(async {
                            temporalio_sdk::workflows::select! {
                                _ = ctx.timer(backoff) => {}
                                _ = cancel.cancelled() => {}
                            }
                        })
                        .await;
                }
                if cancel.is_cancelled() {
                    done.state = CaseState::Cancelled;
                    leftovers.hand_over(&mut done);
                    return done;
                }
            }
        }
    }
}

/// Options of a regular stage activity: its id and its summary name the case, attempt and
/// stage (readable in the Temporal UI), retries follow the taxonomy, `token` cancels it.
///
/// The summary names the case by its plan index (`case #3`): the workflow knows only indices,
/// and carrying every case id in the input would grow each run's first event with the batch.
/// The summary is user metadata of the command, not compared on replay (an activity is
/// matched by id and type), so histories recorded without it replay unchanged.
fn stage_options(
    stage: &str,
    key: &AttemptKey,
    start_to_close: Duration,
    task_queue: Option<String>,
    token: &WorkflowCancellationToken,
) -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(start_to_close)
        .activity_id(format!("case-{}.{}.{stage}", key.case_index, key.attempt))
        .summary(format!(
            "case #{} · attempt {} · {stage}",
            key.case_index, key.attempt
        ))
        // A host that never comes back: past this wait nothing there can be reached. The
        // shared queue has no such limit: any worker, whenever one polls, can run the stage.
        .maybe_schedule_to_start_timeout(task_queue.as_ref().map(|_| HOST_WAIT))
        .maybe_task_queue(task_queue)
        // Stages heartbeat while they work, so a dead worker's stage is retried in seconds.
        .heartbeat_timeout(AWAIT_HEARTBEAT)
        .cancellation_token(token.clone())
        .retry_policy(retry_policy(Duration::from_millis(500), 5))
        .build()
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
    mut key: AttemptKey,
    cancel: &WorkflowCancellationToken,
    spent: Spent,
    mut routed: Routed<'_>,
) -> AttemptEnd {
    let mut s = AttemptSummary::new(&key);
    s.started_at_ms = Some(workflow_ms(ctx));
    // Only a case with nowhere else to go waits for its runtime; a routed one moves on.
    let may_reattach = p.outage_rules && routed.route.is_none();
    let mut reattaches = 0u32;
    let mut left_behind = Vec::new();

    // start: provision + submit, on any worker (routed over the case's runtime list)
    let mut host_queue = None;
    let mut job = None;
    let mut job_may_exist = false;
    let mut never_submitted = false;
    let (mut started, probe) = dispatch(ctx, &mut key, cancel, &mut routed).await;
    s.probe = probe && p.outage_rules;
    loop {
        match started {
            Some(Ok(StartResult::Started(j))) => {
                host_queue = j.host_queue.clone();
                job = Some(j);
            }
            Some(Ok(StartResult::Failed {
                failure,
                host_queue: queue,
                job_may_exist: may_exist,
                ..
            })) => {
                if may_reattach
                    && may_exist
                    && is_unanswered(&failure)
                    && ask_again(ctx, p, &key, cancel, &mut reattaches, routed.done).await
                {
                    let stage = format!("start.r{reattaches}");
                    let opts = stage_options(&stage, &key, Duration::from_secs(60), None, cancel);
                    started = Some(ctx.execute_activity(Start, key.clone(), opts).await);
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
            Some(Ok(StartResult::Skipped { .. })) | None => s.actor = Some(ActorStatus::Cancelled),
            Some(Err(e)) => mark_error(&mut s, cancel, Stage::Provision, &e),
        }
        break;
    }
    let mut attempt = Attempt {
        key,
        host_queue,
        summary: s,
        closed: false,
        held_job: job.is_some(),
        never_submitted,
    };

    // settle: await + evaluate + collect where the job runs; a retry adopts the job. A
    // final attempt is closed by settle too, unless it may race a duplicate.
    if let Some(job) = job {
        let before = attempt.summary.clone();
        let mut stage = "settle".to_string();
        loop {
            let token = cancel.child_token();
            let may_race = speculate::may(ctx, &routed);
            let close_from = (p.settle_closes && !may_race).then(|| attempt.summary.clone());
            let settle = settle_job(
                ctx,
                p,
                &stage,
                &attempt.key,
                job.clone(),
                close_from,
                attempt.host_queue.clone(),
                &token,
            );
            if may_race {
                if let Some(loser) =
                    speculate::race(ctx, p, &mut attempt, settle, token, cancel, &mut routed).await
                {
                    if p.outage_rules {
                        // Its runtime may be the one that stopped answering: cleaned up
                        // patiently, while the case goes on.
                        left_behind.push(loser);
                    } else {
                        clean_up(ctx, loser, false, routed.done).await;
                    }
                }
            } else {
                let result = settle.await;
                attempt.settled(ctx, &token, result);
            }
            let unanswered =
                !attempt.closed && attempt.summary.failure.as_ref().is_some_and(is_unanswered);
            if may_reattach
                && unanswered
                && ask_again(ctx, p, &attempt.key, cancel, &mut reattaches, routed.done).await
            {
                // The same attempt, settled again: its wait re-attaches to the job by key.
                attempt.summary = before.clone();
                stage = format!("settle.r{reattaches}");
                continue;
            }
            break;
        }
        job_may_exist = true;
    }
    let Attempt {
        key,
        host_queue,
        summary: mut s,
        closed,
        held_job,
        never_submitted,
    } = attempt;

    // The runtime did not answer for a job that may run there: whatever comes next, the
    // attempt's cleanup waits for that runtime longer than for one that answers.
    let unanswered = p.outage_rules
        && job_may_exist
        && !closed
        && s.failure.as_ref().is_some_and(is_unanswered)
        && !cancel.is_cancelled();

    // Decide once, before cleanup: the bundle records exactly what the workflow decides.
    let mut next = decide_attempt(&mut s, cancel, p.policy, spent);
    if let Some(to) = spill_over(ctx, &s, cancel, &mut routed, p.outage_rules) {
        next = Next::Spill;
        routed.done.notes.push(to);
    }
    // settle cleaned up and recorded it, and it decided the same.
    if closed && matches!(next, Next::Finish(_)) {
        return AttemptEnd {
            summary: s,
            next,
            left_behind,
        };
    }
    let will_retry = !matches!(next, Next::Finish(_));
    let mut done = Attempt {
        key,
        host_queue,
        summary: s,
        closed: false,
        held_job,
        never_submitted,
    };
    // The case moves on while its job may run where nobody answers: cleaned up alongside.
    if unanswered && will_retry {
        done.summary.stranded = true;
        let summary = done.summary.clone();
        left_behind.push(done);
        return AttemptEnd {
            summary,
            next,
            left_behind,
        };
    }

    // cleanup: always, where the attempt ran
    let s = clean_up_with(ctx, done, will_retry, unanswered, routed.done).await;
    AttemptEnd {
        summary: s,
        next,
        left_behind,
    }
}

/// How an attempt ended: its summary, what comes next, and the attempts it leaves behind
/// (stranded, or a speculation's loser) whose cleanup is still to run.
struct AttemptEnd {
    summary: AttemptSummary,
    next: Next,
    left_behind: Vec<Attempt>,
}

/// How often, and after what pauses, an attempt asks a runtime that did not answer about its
/// job again before the case moves on (each ask waits out the runtime's own grace too).
pub(crate) const MAX_REATTACHES: u32 = 5;
const REATTACH_PAUSES_S: [u64; MAX_REATTACHES as usize] = [2, 5, 10, 20, 30];

/// How long the cleanup of an attempt whose runtime did not answer waits for it to answer
/// (a job that may run there is killed once it does).
const UNANSWERED_WAIT: Duration = Duration::from_secs(casebatch_proto::UNANSWERED_WAIT_S);

/// A runtime that did not answer, where the job of the attempt may be (its failure says so
/// for its stage: a settle that lost its agent; a submit, when it may have reached it).
fn is_unanswered(f: &Failure) -> bool {
    f.code == FailureCode::RuntimeUnreachable && f.class == FailureClass::Infra && f.retryable
}

/// Pauses before asking the runtime about the attempt's job again, with a timeline step.
/// `false` when the budget of asks is spent or the batch was cancelled meanwhile.
async fn ask_again<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    key: &AttemptKey,
    cancel: &WorkflowCancellationToken,
    reattaches: &mut u32,
    done: &mut CaseDone,
) -> bool {
    if cancel.is_cancelled() || *reattaches >= MAX_REATTACHES {
        return false;
    }
    let pause = REATTACH_PAUSES_S[*reattaches as usize];
    *reattaches += 1;
    done.tally.reattached += 1;
    note(
        ctx,
        Some(p.case_index),
        format!(
            "its runtime did not answer for attempt {}'s job: asking again in {pause} s ({} of \
             {MAX_REATTACHES}) rather than starting another job",
            key.attempt, reattaches
        ),
    );
    temporalio_sdk::workflows::select! {
        _ = ctx.timer(Duration::from_secs(pause)) => {}
        _ = cancel.cancelled() => {}
    }
    !cancel.is_cancelled()
}

/// Attempts a case leaves behind, stranded on a runtime that stopped answering or a
/// speculation's loser, cleaned up patiently while the case goes on (their activities are
/// polled after the case's own work, in the order they were left, so replay issues the same
/// commands). When the case ends, those still running are handed to the batch.
#[derive(Default)]
struct Leftovers {
    running: Vec<LeftBehind>,
    ended: Vec<CleanedUp>,
}

impl Leftovers {
    fn add<H: Host>(&mut self, ctx: &WorkflowContext<H>, attempt: Attempt) {
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
    async fn alongside<T>(&mut self, work: impl Future<Output = T>) -> T {
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
    fn hand_over(&mut self, done: &mut CaseDone) {
        for end in self.ended.drain(..) {
            end.count(&mut done.tally);
        }
        done.left_behind = std::mem::take(&mut self.running);
    }
}

impl CleanedUp {
    /// Adds what it found to `tally`.
    pub(crate) fn count(self, tally: &mut Counters) {
        tally.stranded += u32::from(self.stranded);
        tally.cleanup_unconfirmed += u32::from(!self.confirmed);
        tally.paid_twice += u32::from(self.held_job);
    }
}

/// An attempt as it goes through its stages: where it runs and what it reported so far.
struct Attempt {
    key: AttemptKey,
    host_queue: Option<String>,
    summary: AttemptSummary,
    /// `settle` cleaned up and recorded the attempt (its summary is the recorded one).
    closed: bool,
    /// `start` started a job for it (a loser that held one was paid for twice).
    held_job: bool,
    /// `start` never reached the runtime: its cleanup asks nothing of it.
    never_submitted: bool,
}

impl Attempt {
    /// Folds `settle`'s outcome into the summary (`token`: the one the settle ran under).
    fn settled<H: Host>(
        &mut self,
        ctx: &WorkflowContext<H>,
        token: &WorkflowCancellationToken,
        result: Result<Settled, ActivityExecutionError>,
    ) {
        let s = &mut self.summary;
        let mut recorded = None;
        match result {
            Ok(settled) => {
                apply_settled(s, &self.key, &settled);
                recorded = settled.closed;
            }
            Err(e) if !token.is_cancelled() && is_timeout(&e) => mark_job_lost(s, &e),
            Err(e) => mark_error(s, token, Stage::Await, &e),
        }
        s.ended_at_ms = Some(workflow_ms(ctx));
        if let Some(recorded) = recorded {
            // settle closed it: exactly what the bundle holds, end time and cleanup included.
            *s = recorded;
            self.closed = true;
        }
        // The tail's median learns from every attempt that ran to its end.
        if s.actor == Some(ActorStatus::Finished)
            && let Some(ms) = s.duration_ms()
        {
            ctx.state_mut(|st| {
                if let Some(t) = st.shared_mut().tail.as_mut() {
                    t.ran(ms);
                }
            });
        }
    }

    fn ran_to_end(&self) -> bool {
        self.summary.actor == Some(ActorStatus::Finished)
    }
}

/// `settle` of a started job, as an owned future (it may race a duplicate's).
#[allow(clippy::too_many_arguments)]
fn settle_job<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    stage: &str,
    key: &AttemptKey,
    job: JobRef,
    close_from: Option<AttemptSummary>,
    host_queue: Option<String>,
    token: &WorkflowCancellationToken,
) -> LocalBoxFuture<'static, Result<Settled, ActivityExecutionError>> {
    // The actor's limit, then the evaluator's (at least a minute), then slack.
    let timeout = Duration::from_secs(2 * p.max_timeout_seconds.max(60) + 120);
    let mut opts = stage_options(stage, key, timeout, host_queue, token);
    // On cancel, wait until the activity has stopped its job, so cleanup never races a
    // process that is still being killed.
    opts.cancellation_type = ActivityCancellationType::WaitCancellationCompleted;
    opts.retry_policy = Some(retry_policy(Duration::from_millis(500), 20));
    let input = SettleInput {
        key: key.clone(),
        job,
        close_from,
    };
    let ctx = ctx.clone();
    Box::pin(async move { ctx.execute_activity(Settle, input, opts).await })
}

/// Runs `cleanup` where the attempt ran, on a token no cancel reaches, and returns the
/// summary with the confirmation. An unconfirmed cleanup of a speculation's loser is
/// counted here; the case's own attempt is counted by the caller.
async fn clean_up<H: Host>(
    ctx: &WorkflowContext<H>,
    attempt: Attempt,
    will_retry: bool,
    done: &mut CaseDone,
) -> AttemptSummary {
    clean_up_with(ctx, attempt, will_retry, false, done).await
}

/// [`clean_up`], `patient` with a runtime that did not answer for the attempt's job.
async fn clean_up_with<H: Host>(
    ctx: &WorkflowContext<H>,
    attempt: Attempt,
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
async fn run_cleanup<H: Host>(
    ctx: &WorkflowContext<H>,
    attempt: &Attempt,
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
    let opts = stage_options("cleanup", &attempt.key, timeout, queue, &detached);
    ctx.execute_activity(Cleanup, input, opts).await
}

/// Where a case dealt from a runtime list is: its list, the runtime it is on (its share
/// until it spills over), and how often it moved.
pub(crate) struct Route {
    list: Vec<u16>,
    current: u16,
    spills: u32,
}

impl Route {
    fn of<H: Host>(ctx: &WorkflowContext<H>, case: u32) -> Option<Self> {
        let (list, home) = ctx.state(|s| s.shared().circuits.as_ref()?.route_of(case))?;
        Some(Self {
            list,
            current: home,
            spills: 0,
        })
    }

    /// The next runtime of the list after the current one whose circuit the batch has not
    /// seen open, with the names of both (for the timeline).
    fn next_healthy<H: Host>(&self, ctx: &WorkflowContext<H>) -> Option<(u16, String, String)> {
        ctx.state(|s| {
            let c = s.shared().circuits.as_ref()?;
            let to = c.spill_target(&self.list, self.current)?;
            Some((to, c.name(self.current).to_string(), c.name(to).to_string()))
        })
    }
}

/// What an attempt of a routed case updates besides its summary.
struct Routed<'a> {
    route: Option<&'a mut Route>,
    done: &'a mut CaseDone,
}

/// Runs `start`. A routed case goes where the batch's view of the circuits says (setting
/// the key's runtime); a runtime whose breaker refuses the dispatch (`Skipped`) costs no
/// attempt, and the case goes to the next of its list, or waits for the soonest cooldown
/// when every circuit is open. `None`: cancelled while waiting. Also says whether the start
/// that counts was the probe of an open circuit.
async fn dispatch<H: Host>(
    ctx: &WorkflowContext<H>,
    key: &mut AttemptKey,
    cancel: &WorkflowCancellationToken,
    routed: &mut Routed<'_>,
) -> (Option<Result<StartResult, ActivityExecutionError>>, bool) {
    let short = Duration::from_secs(60);
    let mut skips = 0u32;
    loop {
        let mut target = None;
        if let Some(route) = routed.route.as_deref_mut() {
            let now = workflow_ms(ctx);
            let (pick, avoided) = ctx.state_mut(|s| {
                let Some(c) = s.shared_mut().circuits.as_mut() else {
                    return (None, false);
                };
                let avoided = c.is_open(route.current);
                (Some(c.pick(&route.list, route.current, now)), avoided)
            });
            match pick {
                Some(Pick::To { runtime, probe }) => {
                    // Sent elsewhere, untried, because the batch knows its circuit is open.
                    if avoided && runtime != route.current {
                        routed.done.tally.circuit_skips += 1;
                    }
                    route.current = runtime;
                    key.runtime = ctx.state(|s| {
                        s.shared()
                            .circuits
                            .as_ref()
                            .map(|c| c.name(runtime).to_string())
                    });
                    target = Some((runtime, probe));
                }
                Some(Pick::WaitUntil(at)) => {
                    let wait = Duration::from_millis(at.saturating_sub(now));
                    temporalio_sdk::workflows::select! {
                        _ = ctx.timer(wait) => {}
                        _ = cancel.cancelled() => {}
                    }
                    if cancel.is_cancelled() {
                        return (None, false);
                    }
                    continue;
                }
                None => {}
            }
        }
        // Every dispatch of an attempt has its own activity id; the first keeps the id
        // recorded before routing existed.
        let stage = match skips {
            0 => "start".to_string(),
            n => format!("start.{n}"),
        };
        let result = ctx
            .execute_activity(
                Start,
                key.clone(),
                stage_options(&stage, key, short, None, cancel),
            )
            .await;
        let Some((runtime, probe)) = target else {
            return (Some(result), false);
        };
        let now = workflow_ms(ctx);
        let (news, name) = ctx.state_mut(|s| {
            let shared = s.shared_mut();
            let c = shared
                .circuits
                .as_mut()
                .expect("a routed case has circuits");
            let news = match &result {
                Ok(StartResult::Started(_)) => c.started(runtime).then_some(false),
                Ok(
                    StartResult::Skipped { circuit }
                    | StartResult::Failed {
                        circuit: Some(circuit),
                        ..
                    },
                ) => c.saw(circuit, now).then_some(circuit.open),
                _ => None,
            };
            if probe {
                c.probe_done(runtime);
            }
            if news.is_some() {
                // The width may change: wake the admission loop.
                shared.wakeups += 1;
            }
            (news, c.name(runtime).to_string())
        });
        // A circuit is the runtime's news, not the case's: on the timeline at once.
        match news {
            Some(true) => note(ctx, None, format!("runtime {name}: circuit open")),
            Some(false) => note(
                ctx,
                None,
                format!("runtime {name}: circuit closed (a dispatch reached it)"),
            ),
            None => {}
        }
        if let Ok(StartResult::Skipped { .. }) = result {
            skips += 1;
            routed.done.tally.circuit_skips += 1;
            continue;
        }
        return (Some(result), probe);
    }
}

/// Moves a routed case whose attempt the runtime failed ([`decide::spills`]) to the next
/// runtime of its list not seen open, at most once per runtime of the list. Returns the
/// timeline note.
fn spill_over<H: Host>(
    ctx: &WorkflowContext<H>,
    s: &AttemptSummary,
    cancel: &WorkflowCancellationToken,
    routed: &mut Routed<'_>,
    outage_rules: bool,
) -> Option<String> {
    let route = routed.route.as_deref_mut()?;
    let failure = s.failure.as_ref()?;
    // A failed probe, or a runtime that did not answer, moves the case on whenever another
    // runtime of its list is not seen open: the case fails for an unreachable runtime only
    // once every runtime of its list was tried and is open. Other dispatch failures move it
    // at most once per runtime of the list.
    let free = outage_rules && decide::spills_freely(s.probe, failure);
    if cancel.is_cancelled()
        || !decide::spills(failure)
        || (!free && route.spills >= route.list.len() as u32)
    {
        return None;
    }
    let (to, from_name, to_name) = route.next_healthy(ctx)?;
    route.current = to;
    route.spills += u32::from(!free);
    Some(format!(
        "runtime spillover {from_name} → {to_name} ({})",
        failure.code.as_str()
    ))
}

/// Folds `settle`'s report into the summary.
fn apply_settled(s: &mut AttemptSummary, key: &AttemptKey, settled: &Settled) {
    // Regular activities resolve from history, so a result always belongs to the attempt
    // that scheduled it. If that ever broke, failing this workflow task loudly beats giving
    // one case another case's result.
    assert_eq!(
        (settled.key.case_index, settled.key.attempt),
        (key.case_index, key.attempt),
        "settle result of another attempt delivered to case {} attempt {}",
        key.case_index,
        key.attempt
    );
    s.apply_settled(settled);
}

/// The job's host never came back (or the job never reported): nothing is adoptable, so the
/// case is re-dispatched.
fn mark_job_lost(s: &mut AttemptSummary, err: &ActivityExecutionError) {
    s.actor = Some(ActorStatus::Failed);
    s.failure = Some(Failure::infra(
        Stage::Await,
        FailureCode::JobLost,
        format!("no worker could await the job: {err}"),
    ));
}

/// The attempt's outcome and what comes next. Whatever the job reported after a batch cancel
/// is the cancel's doing.
fn decide_attempt(
    s: &mut AttemptSummary,
    cancel: &WorkflowCancellationToken,
    policy: decide::Policy,
    spent: Spent,
) -> Next {
    let cancelled = cancel.is_cancelled();
    if cancelled && s.actor != Some(ActorStatus::Finished) {
        s.actor = Some(ActorStatus::Cancelled);
        s.failure = None;
    }
    decide::next(s, cancelled, policy, spent)
}

fn summary_cleanup_ok(s: &AttemptSummary) -> bool {
    s.cleanup_confirmed != Some(false)
}

fn is_timeout(err: &ActivityExecutionError) -> bool {
    err.as_timeout().is_some()
}

/// Records an unexpected activity error; a cancel is not a failure.
fn mark_error(
    s: &mut AttemptSummary,
    cancel: &WorkflowCancellationToken,
    stage: Stage,
    err: &ActivityExecutionError,
) {
    if cancel.is_cancelled() || matches!(err, ActivityExecutionError::Cancelled(_)) {
        s.actor = Some(ActorStatus::Cancelled);
    } else {
        s.actor.get_or_insert(ActorStatus::Failed);
        s.failure = Some(activity_failure(stage, err));
    }
}
