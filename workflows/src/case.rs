//! The per-case pipeline: provision → submit → await → evaluate → collect → cleanup, repeated
//! for each attempt the failure taxonomy allows.
//!
//! Short idempotent stages run as local activities (they re-run on replay after a worker
//! crash, which is harmless because each is keyed by its attempt); the long wait is a full
//! activity that heartbeats its job reference so a retry on another worker adopts the job.

use std::time::Duration;

use casebatch_proto::{
    ActorReport, ActorStatus, AttemptKey, AttemptSummary, AwaitInput, CaseState, CleanupInput,
    Failure, FailureClass, Stage, StageResult, SubmitResult, codes,
};
use temporalio_common::RetryPolicy;
use temporalio_common::protos::temporal::api::failure::v1::{
    Failure as ProtoFailure, failure::FailureInfo,
};
use temporalio_sdk::{
    ActivityCancellationType, ActivityExecutionError, ActivityOptions, LocalActivityOptions,
    WorkflowCancellationToken, WorkflowContext,
};

use crate::batch::BatchWorkflow;
use crate::contracts::{AwaitJob, Cleanup, Collect, Evaluate, Provision, Submit};
use crate::decide::{self, Next, Spent};

/// Heartbeat timeout of `await`: how quickly a crashed worker's job is adopted elsewhere.
const AWAIT_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long `await` may wait for a worker on the job's host. Past it the host is presumed
/// gone with its job, and the case is re-dispatched.
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
}

/// What a finished case reports back to admission.
#[derive(Debug, Clone)]
pub(crate) struct CaseDone {
    pub case_index: u32,
    pub state: CaseState,
    pub attempts: u32,
    pub adopted: u32,
    pub redispatched: u32,
    pub retries: u32,
    pub cleanup_unconfirmed: u32,
    pub oom_boosts: u32,
    pub notes: Vec<String>,
}

fn local(timeout: Duration, token: &WorkflowCancellationToken) -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .start_to_close_timeout(timeout)
        .retry_policy(retry_policy(Duration::from_millis(500), 3))
        .cancellation_token(token.clone())
        .build()
}

/// An activity that failed instead of returning an outcome. A casebatch failure type
/// (`casebatch.<class>`) keeps its class; anything else is the platform's fault.
fn activity_failure(stage: Stage, err: &ActivityExecutionError) -> Failure {
    if let Some((class, non_retryable, message)) = err.failure().and_then(casebatch_failure) {
        let (code, message) = message
            .split_once(": ")
            .unwrap_or((codes::ACTIVITY_ERROR, message));
        return Failure::new(stage, class, code, message, !non_retryable);
    }
    Failure::infra(stage, codes::ACTIVITY_ERROR, err.to_string())
}

/// The first casebatch-typed application failure in a failure chain (local activities raise
/// it at the top; full activities wrap it in an activity failure).
fn casebatch_failure(f: &ProtoFailure) -> Option<(FailureClass, bool, &str)> {
    match &f.failure_info {
        Some(FailureInfo::ApplicationFailureInfo(info)) => {
            FailureClass::from_temporal_type(&info.r#type)
                .map(|class| (class, info.non_retryable, f.message.as_str()))
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
pub(crate) async fn run_case(
    ctx: WorkflowContext<BatchWorkflow>,
    p: CaseParams,
    cancel: WorkflowCancellationToken,
) -> CaseDone {
    let mut done = CaseDone {
        case_index: p.case_index,
        state: CaseState::Failed,
        attempts: p.attempts_before,
        adopted: 0,
        redispatched: 0,
        retries: 0,
        cleanup_unconfirmed: 0,
        oom_boosts: 0,
        notes: Vec::new(),
    };
    let mut spent = Spent::default();
    let mut memory_boost_mb = p.memory_boost_mb;
    loop {
        done.attempts += 1;
        let key = AttemptKey {
            batch_id: p.batch_id.clone(),
            bundle_dir: p.bundle_dir.clone(),
            case_index: p.case_index,
            attempt: done.attempts,
            memory_boost_mb,
        };
        let spent_before = spent;
        let (summary, next) = run_attempt(&ctx, &p, &key, &cancel, spent_before).await;
        done.adopted += u32::from(summary.adopted);
        done.cleanup_unconfirmed += u32::from(!summary_cleanup_ok(&summary));

        match next {
            Next::Finish(state) => {
                done.state = state;
                return done;
            }
            Next::Boost(mb) => {
                done.oom_boosts += 1;
                let from = summary.memory_limit_mb.unwrap_or_default();
                done.notes.push(format!(
                    "case {}: OOM auto-boost {from} → {mb} MB (in-batch retry)",
                    p.case_index
                ));
                memory_boost_mb = Some(mb);
            }
            Next::Redispatch => {
                spent.redispatches += 1;
                done.redispatched += 1;
                done.notes.push(format!(
                    "case {}: job lost with nothing to adopt; re-dispatched as attempt {}",
                    p.case_index,
                    done.attempts + 1
                ));
            }
            Next::Retry => {
                spent.retries += 1;
                done.retries += 1;
                let failure = summary.failure.as_ref().map(ToString::to_string);
                done.notes.push(format!(
                    "case {}: retry {} after {}",
                    p.case_index,
                    spent.retries,
                    failure.unwrap_or_default()
                ));
                // Linear backoff; a cancel during the wait ends the case.
                let backoff = Duration::from_millis(p.retry_backoff_ms * u64::from(spent.retries));
                if !backoff.is_zero() {
                    temporalio_sdk::workflows::select! {
                        _ = ctx.timer(backoff) => {}
                        _ = cancel.cancelled() => {}
                    }
                }
                if cancel.is_cancelled() {
                    done.state = CaseState::Cancelled;
                    return done;
                }
            }
        }
    }
}

/// One attempt through every stage. Cleanup runs for every provisioned attempt, on a
/// cancellation token detached from the batch's so a cancel cannot skip it.
async fn run_attempt(
    ctx: &WorkflowContext<BatchWorkflow>,
    p: &CaseParams,
    key: &AttemptKey,
    cancel: &WorkflowCancellationToken,
    spent: Spent,
) -> (AttemptSummary, Next) {
    let mut s = AttemptSummary {
        attempt: key.attempt,
        actor: None,
        exit_code: None,
        evaluation_configured: false,
        verdict: None,
        failure: None,
        collect_failure: None,
        adopted: false,
        memory_boost_mb: key.memory_boost_mb,
        memory_limit_mb: None,
        cleanup_confirmed: None,
    };
    let short = Duration::from_secs(60);

    // provision
    let provisioned = match ctx
        .execute_local_activity(Provision, key.clone(), local(short, cancel))
        .await
    {
        Ok(StageResult::Ok) => true,
        Ok(StageResult::Failed(f)) => {
            s.failure = Some(f);
            // A failed provision may have created things: clean them up too.
            true
        }
        Err(e) => {
            mark_error(&mut s, cancel, Stage::Provision, &e);
            false
        }
    };

    // submit
    let mut job = None;
    if s.failure.is_none() && s.actor.is_none() {
        match ctx
            .execute_local_activity(Submit, key.clone(), local(short, cancel))
            .await
        {
            Ok(SubmitResult::Started(j)) => job = Some(j),
            Ok(SubmitResult::Failed(f)) => {
                s.actor = Some(ActorStatus::Failed);
                s.failure = Some(f);
            }
            Err(e) => mark_error(&mut s, cancel, Stage::Submit, &e),
        }
    }

    // await: a full activity, so a crashed worker's job is adopted by the retry
    if let Some(job) = job {
        let timeout = Duration::from_secs(p.max_timeout_seconds) + Duration::from_secs(120);
        let host_queue = job.host_queue.clone();
        let opts = ActivityOptions::with_start_to_close_timeout(timeout)
            .maybe_task_queue(host_queue)
            .schedule_to_start_timeout(HOST_WAIT)
            .heartbeat_timeout(AWAIT_HEARTBEAT)
            .cancellation_token(cancel.clone())
            // On cancel, wait until the activity has stopped its job, so cleanup never
            // races a process that is still being killed.
            .cancellation_type(ActivityCancellationType::WaitCancellationCompleted)
            .retry_policy(retry_policy(Duration::from_millis(500), 20))
            .build();
        let input = AwaitInput {
            key: key.clone(),
            job,
        };
        match ctx.execute_activity(AwaitJob, input, opts).await {
            Ok(ActorReport {
                status,
                exit_code,
                failure,
                adopted,
                memory_limit_mb,
            }) => {
                s.actor = Some(status);
                s.exit_code = exit_code;
                s.failure = failure;
                s.adopted = adopted;
                s.memory_limit_mb = memory_limit_mb;
            }
            Err(e) if !cancel.is_cancelled() && is_timeout(&e) => {
                // The job's host never came back (or the job never reported): nothing is
                // adoptable, so the case is re-dispatched.
                s.actor = Some(ActorStatus::Failed);
                s.failure = Some(Failure::infra(
                    Stage::Await,
                    codes::JOB_LOST,
                    format!("no worker could await the job: {e}"),
                ));
            }
            Err(e) => mark_error(&mut s, cancel, Stage::Await, &e),
        }
    }

    let actor_finished = s.actor == Some(ActorStatus::Finished) && s.failure.is_none();

    // evaluate: only a finished actor has work to judge
    if actor_finished && !cancel.is_cancelled() {
        let long = Duration::from_secs(p.max_timeout_seconds.max(60));
        match ctx
            .execute_local_activity(Evaluate, key.clone(), local(long, cancel))
            .await
        {
            Ok(eval) => {
                s.evaluation_configured = eval.configured;
                s.verdict = eval.verdict;
                if eval.failure.is_some() {
                    s.failure = eval.failure;
                }
            }
            Err(e) => {
                s.evaluation_configured = true;
                mark_error(&mut s, cancel, Stage::Evaluate, &e);
            }
        }
    }

    // collect: a failure keeps the work
    if actor_finished && !cancel.is_cancelled() {
        match ctx
            .execute_local_activity(Collect, key.clone(), local(short, cancel))
            .await
        {
            Ok(f) => s.collect_failure = f,
            Err(e) => s.collect_failure = Some(activity_failure(Stage::Collect, &e)),
        }
    }

    // Decide once, before cleanup: the bundle records exactly what the workflow decides.
    let cancelled = cancel.is_cancelled();
    if cancelled && s.actor != Some(ActorStatus::Finished) {
        // Whatever the job reported after the cancel is the cancel's doing.
        s.actor = Some(ActorStatus::Cancelled);
        s.failure = None;
    }
    let next = decide::next(&s, cancelled, p.policy, spent);

    // cleanup: always, for every provisioned attempt
    if provisioned {
        let input = CleanupInput {
            key: key.clone(),
            summary: s.clone(),
            will_retry: !matches!(next, Next::Finish(_)),
        };
        let detached = WorkflowCancellationToken::new();
        let confirmed = match ctx
            .execute_local_activity(Cleanup, input, local(short, &detached))
            .await
        {
            Ok(r) => r.cleanup_confirmed,
            Err(_) => false,
        };
        s.cleanup_confirmed = Some(confirmed);
    }
    (s, next)
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
