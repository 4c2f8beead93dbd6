//! Activity options of the case's stages: ids and summaries that name the attempt, timeouts,
//! and retries that never repeat what the taxonomy says repeats the same way.

use std::time::Duration;

use casebatch_proto::{AttemptKey, FailureClass};
use temporalio_common::RetryPolicy;
use temporalio_sdk::{
    ActivityOptions, LocalActivityOptions, WorkflowCancellationToken, WorkflowContext,
};

use crate::shared::Host;

/// Heartbeat timeout of `await` in the legacy pipeline: how quickly a stage that a crashed
/// worker held is retried elsewhere. Today's stages take the batch's cadence instead.
pub(super) const AWAIT_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a stage routed to the job's host (`settle`, `cleanup`; `await` in the legacy
/// pipeline) may wait for a worker there. Past it the host is presumed gone with its job, and
/// the case is re-dispatched.
pub(super) const HOST_WAIT: Duration = Duration::from_secs(300);

pub(super) fn local(timeout: Duration, token: &WorkflowCancellationToken) -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .start_to_close_timeout(timeout)
        .retry_policy(retry_policy(Duration::from_millis(500), 3))
        .cancellation_token(token.clone())
        .build()
}

/// Activity retries never repeat what the taxonomy says repeats the same way.
pub(super) fn retry_policy(initial: Duration, maximum_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .initial_interval(initial)
        .backoff_coefficient(1.5)
        .maximum_interval(Duration::from_secs(5))
        .maximum_attempts(maximum_attempts)
        .non_retryable_error_types(FailureClass::non_retryable_temporal_types())
        .build()
}

/// Options of a regular stage activity: its id and its summary name the case, attempt and
/// stage (readable in the Temporal UI), retries follow the taxonomy, `token` cancels it.
///
/// The summary names the case by its plan index (`case #3`): the workflow knows only indices,
/// and carrying every case id in the input would grow each run's first event with the batch.
/// The summary is user metadata of the command, not compared on replay (an activity is
/// matched by id and type), so histories recorded without it replay unchanged.
pub(super) fn stage_options<H: Host>(
    ctx: &WorkflowContext<H>,
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
        // Stages heartbeat while they work, so a dead worker's stage is retried in seconds
        // (the batch's cadence: `heartbeat_every_seconds`).
        .heartbeat_timeout(ctx.state(|s| s.shared().heartbeat_timeout))
        .cancellation_token(token.clone())
        .retry_policy(retry_policy(Duration::from_millis(500), 5))
        .build()
}
