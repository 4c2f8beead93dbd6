//! Following a run of the batch's workflow to its outcome, reporting its status as it goes,
//! through engine outages (the embedded server is supervised and may restart under us).

use std::time::{Duration, Instant};

use casebatch_proto::{BatchOutcome, TASK_QUEUE};
use temporalio_client::{WorkflowGetResultOptions, errors::WorkflowGetResultError};

use crate::error::{ControlError, Result};
use crate::events::{DriveEvent, Observer};
use crate::workflow::{Handle, query_status};

/// How long a runner waits for an unreachable engine before giving up.
const ENGINE_OUTAGE: Duration = Duration::from_secs(600);
/// How often a running batch's status is asked for: each query is a Temporal action on a
/// metered namespace, and nobody reads a progress line faster.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// Waits for the workflow's result, reporting status as it goes. Transient RPC errors mean
/// "wait and ask again", for up to [`ENGINE_OUTAGE`] (unless the disk fills meanwhile: see
/// `host.rs`).
pub(crate) async fn follow(handle: &Handle, observer: &mut dyn Observer) -> Result<BatchOutcome> {
    let mut result = Box::pin(handle.get_result(WorkflowGetResultOptions::default()));
    let mut outage_since: Option<Instant> = None;
    let mut warned_no_worker = false;
    let mut tick = tokio::time::interval(STATUS_EVERY);
    loop {
        tokio::select! {
            r = &mut result => match r {
                Ok(outcome) => return Ok(outcome),
                Err(e @ (WorkflowGetResultError::Rpc(_) | WorkflowGetResultError::Other(_)))
                    if outage_since.is_none_or(|t| t.elapsed() < ENGINE_OUTAGE) =>
                {
                    if outage_since.is_none() {
                        observer.on(DriveEvent::EngineUnreachable(&e.to_string()));
                        outage_since = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    result = Box::pin(handle.get_result(WorkflowGetResultOptions::default()));
                }
                Err(WorkflowGetResultError::Terminated { .. }) => {
                    return Err(ControlError::Terminated { workflow_id: handle.info().workflow_id.clone() });
                }
                Err(e) => {
                    let wid = handle.info().workflow_id.clone();
                    return Err(ControlError::engine_call(format!("complete batch workflow {wid}"), e));
                }
            },
            _ = tick.tick() => {
                match tokio::time::timeout(Duration::from_secs(2), query_status(handle)).await {
                    Ok(Ok(s)) => {
                        if outage_since.take().is_some() {
                            observer.on(DriveEvent::EngineBack);
                        }
                        observer.on(DriveEvent::Status(&s));
                    }
                    // Unanswered queries: maybe no worker polls the batch's queue at all.
                    _ if !warned_no_worker && no_poller(handle).await => {
                        warned_no_worker = true;
                        observer.on(DriveEvent::NoWorker { task_queue: TASK_QUEUE });
                    }
                    _ => {}
                }
            }
        }
    }
}

/// True when the engine says no worker polls the batch's workflow task queue (a run with
/// `--no-worker` and no replicas would otherwise wait in silence). Unknown counts as false.
async fn no_poller(handle: &Handle) -> bool {
    crate::pollers::pollers(handle)
        .await
        .is_some_and(|p| p.is_empty())
}
