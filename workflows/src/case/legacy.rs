//! The attempt pipeline of batches started before stages became regular activities: six
//! local activities per attempt. Frozen: it only runs for histories that were recorded with
//! it (no `stages-as-activities` patch marker), so those batches replay and finish as they
//! began. Its flaw is why it was replaced: with several cases' local activities in flight,
//! the order of local-activity calls (and with it their sequence numbers) follows completion
//! timing, which a replay after a crash can regroup (TMPRL1100, or one case receiving
//! another's result). Do not change it; do not call it for new runs.

use std::time::Duration;

use casebatch_proto::{
    ActorReport, ActorStatus, AttemptKey, AttemptSummary, AwaitInput, CleanupInput, JobRef, Stage,
    StageResult, SubmitResult,
};
use temporalio_sdk::{
    ActivityCancellationType, ActivityOptions, WorkflowCancellationToken, WorkflowContext,
};

use super::options::{AWAIT_HEARTBEAT, HOST_WAIT, local, retry_policy};
use super::outcome::{activity_failure, decide_attempt, is_timeout, mark_error, mark_job_lost};
use super::params::CaseParams;
use crate::contracts::{AwaitJob, Cleanup, Collect, Evaluate, Provision, Submit};
use crate::decide::{Next, Spent};
use crate::shared::Host;

/// One attempt through every stage. Cleanup runs for every provisioned attempt, on a
/// cancellation token detached from the batch's so a cancel cannot skip it.
pub(super) async fn run_attempt<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    key: &AttemptKey,
    cancel: &WorkflowCancellationToken,
    spent: Spent,
) -> (AttemptSummary, Next) {
    let mut s = AttemptSummary::new(key);
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
        await_job(ctx, p, key, job, cancel, &mut s).await;
    }

    let actor_finished = s.actor == Some(ActorStatus::Finished) && s.failure.is_none();

    // evaluate, then collect: only a finished actor has work to judge
    if actor_finished && !cancel.is_cancelled() {
        evaluate_and_collect(ctx, p, key, cancel, &mut s).await;
    }

    // Decide once, before cleanup: the bundle records exactly what the workflow decides.
    let next = decide_attempt(&mut s, cancel, p.policy, spent);

    // cleanup: always, for every provisioned attempt
    if provisioned {
        let will_retry = !matches!(next, Next::Finish(_));
        s.cleanup_confirmed = Some(clean_up(ctx, key, &s, will_retry).await);
    }
    (s, next)
}

/// `await` of a submitted job, folded into the summary.
async fn await_job<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    key: &AttemptKey,
    job: JobRef,
    cancel: &WorkflowCancellationToken,
    s: &mut AttemptSummary,
) {
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
            usage,
            retry_after_ms: _,
            logs_capped,
        }) => {
            s.actor = Some(status);
            s.exit_code = exit_code;
            s.failure = failure;
            s.adopted = adopted;
            s.memory_limit_mb = memory_limit_mb;
            s.usage = usage;
            s.logs_capped = logs_capped;
        }
        Err(e) if !cancel.is_cancelled() && is_timeout(&e) => mark_job_lost(s, &e),
        Err(e) => mark_error(s, cancel, Stage::Await, &e),
    }
}

/// `evaluate` and `collect` of an actor that finished: a collect failure keeps the work.
async fn evaluate_and_collect<H: Host>(
    ctx: &WorkflowContext<H>,
    p: &CaseParams,
    key: &AttemptKey,
    cancel: &WorkflowCancellationToken,
    s: &mut AttemptSummary,
) {
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
            mark_error(s, cancel, Stage::Evaluate, &e);
        }
    }
    if cancel.is_cancelled() {
        return;
    }
    let short = Duration::from_secs(60);
    match ctx
        .execute_local_activity(Collect, key.clone(), local(short, cancel))
        .await
    {
        Ok(f) => s.collect_failure = f,
        Err(e) => s.collect_failure = Some(activity_failure(Stage::Collect, &e)),
    }
}

/// `cleanup` of a provisioned attempt, on a token no cancel reaches: whether it confirmed.
async fn clean_up<H: Host>(
    ctx: &WorkflowContext<H>,
    key: &AttemptKey,
    s: &AttemptSummary,
    will_retry: bool,
) -> bool {
    let input = CleanupInput {
        key: key.clone(),
        summary: s.clone(),
        will_retry,
        never_submitted: false,
        patient: false,
    };
    let detached = WorkflowCancellationToken::new();
    let short = Duration::from_secs(60);
    ctx.execute_local_activity(Cleanup, input, local(short, &detached))
        .await
        .is_ok_and(|r| r.cleanup_confirmed)
}
