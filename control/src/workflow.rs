//! The batch's workflow on the engine: its handle, whether it exists and runs, and the one
//! ownership check that every attach, signal, query and carry-over passes first.
//!
//! Many users share a namespace, and the same batch id in another output root (or with
//! another task list) is someone else's batch: a workflow is this batch's only when its
//! current run was started for this plan's fingerprint and this bundle.

use casebatch_bundle::Bundle;
use casebatch_manifest::Plan;
use casebatch_proto::{BatchInput, BatchStatus, workflow_id};
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{
    Client, WorkflowDescribeOptions, WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryOptions,
    errors::WorkflowInteractionError, tonic,
};
use temporalio_common::protos::temporal::api::common::v1::WorkflowExecution;
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;
use temporalio_common::protos::temporal::api::workflowservice::v1::GetWorkflowExecutionHistoryRequest;

use crate::error::{ControlError, Result};

pub(crate) type Handle = WorkflowHandle<Client, BatchWorkflow>;

/// The handle of the batch's workflow (its latest run).
pub(crate) fn handle<C>(client: &Client, plan: &Plan<C>) -> Handle {
    client.get_workflow_handle(workflow_id(&plan.batch_id))
}

/// Whether the batch's workflow exists, and whether it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    Absent,
    Running,
    Closed,
}

/// Finds the batch's workflow and proves it is this batch (see the module doc). Nothing is
/// attached to, signalled or carried over unless this holds.
pub(crate) async fn presence<C>(
    handle: &Handle,
    bundle: &Bundle,
    plan: &Plan<C>,
) -> Result<Presence> {
    let wid = &handle.info().workflow_id;
    let found = match handle.describe(WorkflowDescribeOptions::default()).await {
        Ok(d) if d.status() == WorkflowExecutionStatus::Running => Presence::Running,
        Ok(_) => Presence::Closed,
        Err(WorkflowInteractionError::NotFound(_)) => return Ok(Presence::Absent),
        Err(e) => {
            return Err(ControlError::engine_call(
                format!("look up workflow {wid}"),
                e,
            ));
        }
    };
    prove(found, owner(handle).await?, Owner::of(bundle, plan), wid)
}

/// [`presence`] of the batch's workflow, looked up by its id: a run refuses someone else's
/// batch under its id before it writes anything.
pub(crate) async fn claim(client: &Client, bundle: &Bundle, plan: &Plan) -> Result<Presence> {
    presence(&handle(client, plan), bundle, plan).await
}

/// Who a batch workflow runs for: the plan and the bundle its current run was started with.
#[derive(Debug, PartialEq, Eq)]
struct Owner {
    fingerprint: String,
    bundle_dir: String,
}

impl Owner {
    fn of<C>(bundle: &Bundle, plan: &Plan<C>) -> Self {
        Owner {
            fingerprint: plan.fingerprint.clone(),
            bundle_dir: bundle.root().display().to_string(),
        }
    }

    /// The owner a start input names; `None` when it is not a batch's input.
    fn in_input(payload: &[u8]) -> Option<Self> {
        let input = serde_json::from_slice::<BatchInput>(payload).ok()?;
        Some(Owner {
            fingerprint: input.fingerprint,
            bundle_dir: input.bundle_dir,
        })
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = &self.fingerprint[..self.fingerprint.len().min(12)];
        write!(f, "bundle {} (plan {short})", self.bundle_dir)
    }
}

/// The ownership check itself: the workflow `found` is ours only when its owner is.
fn prove(found: Presence, theirs: Option<Owner>, ours: Owner, wid: &str) -> Result<Presence> {
    match theirs {
        Some(theirs) if theirs == ours => Ok(found),
        theirs => Err(ControlError::NotOurBatch {
            workflow_id: wid.to_string(),
            theirs: theirs.map_or_else(
                || "a workflow casebatch did not start".into(),
                |o| o.to_string(),
            ),
            ours: ours.to_string(),
        }),
    }
}

/// The owner recorded in the current run's input (its first history event); `None` when the
/// workflow is not a casebatch batch. One event is asked for: a page of a busy batch's history
/// took a quarter of a second to fetch, and `status` proves the owner again on every retry.
async fn owner(handle: &Handle) -> Result<Option<Owner>> {
    let request = GetWorkflowExecutionHistoryRequest {
        namespace: handle.info().namespace.clone(),
        execution: Some(WorkflowExecution {
            workflow_id: handle.info().workflow_id.clone(),
            // Empty: the current run, as the describe before this one looked at.
            run_id: String::new(),
        }),
        maximum_page_size: 1,
        ..Default::default()
    };
    let page = handle
        .client()
        .connection()
        .workflow_service()
        .get_workflow_execution_history(tonic::Request::new(request))
        .await
        .map_err(|e| ControlError::engine_call("read the batch's history", e.message()))?
        .into_inner();
    let first = page.history.and_then(|h| h.events.into_iter().next());
    let Some(Attributes::WorkflowExecutionStartedEventAttributes(started)) =
        first.and_then(|e| e.attributes)
    else {
        return Ok(None);
    };
    Ok(started
        .input
        .and_then(|i| i.payloads.into_iter().next())
        .and_then(|p| Owner::in_input(&p.data)))
}

/// The running batch's live status (needs a worker to answer).
pub(crate) async fn query_status(handle: &Handle) -> Result<BatchStatus> {
    handle
        .query(BatchWorkflow::status, (), WorkflowQueryOptions::default())
        .await
        .map_err(|e| ControlError::engine_call("query the batch's status", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(fingerprint: &str, bundle_dir: &str) -> Owner {
        Owner {
            fingerprint: fingerprint.into(),
            bundle_dir: bundle_dir.into(),
        }
    }

    #[test]
    fn only_the_same_plan_in_the_same_bundle_is_ours() {
        let ours = || owner("f00d", "/out/b");
        for found in [Presence::Running, Presence::Closed] {
            assert_eq!(
                prove(found, Some(ours()), ours(), "casebatch-b").unwrap(),
                found
            );
        }
        for theirs in [owner("f00d", "/other/b"), owner("beef", "/out/b")] {
            let shown = theirs.to_string();
            let err = prove(Presence::Running, Some(theirs), ours(), "casebatch-b").unwrap_err();
            let ControlError::NotOurBatch {
                workflow_id,
                theirs,
                ours,
            } = err
            else {
                panic!("not NotOurBatch: {err}");
            };
            assert_eq!(workflow_id, "casebatch-b");
            assert_eq!((theirs, ours), (shown, "bundle /out/b (plan f00d)".into()));
        }
    }

    #[test]
    fn a_workflow_casebatch_did_not_start_is_refused() {
        let err = prove(Presence::Closed, None, owner("f", "/out/b"), "w").unwrap_err();
        assert!(
            err.to_string()
                .contains("a workflow casebatch did not start"),
            "{err}"
        );
    }

    #[test]
    fn the_owner_is_read_from_a_batch_start_input_only() {
        let input = BatchInput {
            fingerprint: "f00d".into(),
            bundle_dir: "/out/b".into(),
            ..BatchInput::default()
        };
        let payload = serde_json::to_vec(&input).unwrap();
        assert_eq!(Owner::in_input(&payload), Some(owner("f00d", "/out/b")));
        assert_eq!(Owner::in_input(b"[1, 2]"), None);
    }
}
