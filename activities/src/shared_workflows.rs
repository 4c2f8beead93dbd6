//! What the clients of the namespace's shared workflows (a runtime's breaker and slots, a
//! shared pace) have in common: each is asked with update-with-start, so the first ask starts
//! it, every later one (from any worker replica) asks the one running, and one that ended
//! after an idle spell is started again.

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
