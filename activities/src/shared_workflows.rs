//! What the clients of the namespace's shared workflows (a runtime's breaker and slots, a
//! shared pace) have in common: each is asked with update-with-start, so the first ask starts
//! it, every later one (from any worker replica) asks the one running, and one that ended
//! after an idle spell is started again.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use casebatch_proto::TASK_QUEUE;
use temporalio_client::{
    WorkflowIdConflictPolicy, WorkflowIdReusePolicy, WorkflowUpdateWithStartOptions,
};

/// The options of an ask of the shared workflow `id`.
pub(crate) fn start_or_ask(id: &str) -> WorkflowUpdateWithStartOptions {
    WorkflowUpdateWithStartOptions::new(
        TASK_QUEUE,
        id.to_string(),
        WorkflowIdConflictPolicy::UseExisting,
    )
    .id_reuse_policy(WorkflowIdReusePolicy::AllowDuplicate)
    .build()
}

/// An ask that takes longer fails; the activity's retry asks again.
pub(crate) const CALL_WITHIN: Duration = Duration::from_secs(10);

/// `call`, an ask of the shared workflow `what` (as its error names it), within
/// [`CALL_WITHIN`].
pub(crate) async fn answer_within<T, E: Display>(
    what: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_WITHIN, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(format!("{what} could not be asked: {e}")),
        Err(_) => Err(format!("{what} did not answer within {CALL_WITHIN:?}")),
    }
}
