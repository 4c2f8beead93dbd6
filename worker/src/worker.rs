//! The worker: registers `BatchWorkflow` and `CaseActivities` on the casebatch task queue.
//! Several replicas on one task queue share batches safely: the workflow owns continuation.

use std::future::Future;
use std::time::Duration;

use casebatch_activities::CaseActivities;
use casebatch_proto::TASK_QUEUE;
use casebatch_workflows::BatchWorkflow;
use temporalio_client::Client;
use temporalio_sdk::{Runtime, Worker, WorkerOptions};

/// Builds a worker for the casebatch task queue.
pub fn build_worker(runtime: &Runtime, client: Client) -> anyhow::Result<Worker> {
    let options = WorkerOptions::new(TASK_QUEUE)
        .register_workflow::<BatchWorkflow>()?
        .register_activities(CaseActivities::default())
        // A crashed worker's sticky queue is abandoned quickly.
        .sticky_queue_schedule_to_start_timeout(Duration::from_secs(3))
        .graceful_shutdown_period(Duration::from_secs(2))
        .build();
    Ok(Worker::new(runtime, client, options)?)
}

/// Runs the worker until `until` completes, then shuts it down. `Worker::run` is not `Send`,
/// so both are driven in the current task.
pub async fn run_worker_until<F, T>(worker: &mut Worker, until: F) -> anyhow::Result<T>
where
    F: Future<Output = T>,
{
    let shutdown = worker.shutdown_handle();
    let run = worker.run();
    tokio::pin!(run);
    tokio::pin!(until);
    tokio::select! {
        r = &mut run => {
            r?;
            anyhow::bail!("the worker stopped before the work was done")
        }
        out = &mut until => {
            shutdown();
            run.await?;
            Ok(out)
        }
    }
}
