//! `casebatch worker`: one standalone worker replica. Run N of them against a cluster;
//! they share batches through the task queue.

use casebatch_worker::{build_worker, run_worker_until};

use super::{absolute, run};
use crate::cli::WorkerArgs;
use crate::exit::{CliError, CliResult, Exit};

pub async fn run(args: WorkerArgs) -> CliResult {
    let engine = run::connect(&absolute(&args.output_dir)?, &args.engine).await?;
    let runtime = temporalio_sdk::Runtime::from_current_tokio(Default::default())
        .map_err(|e| CliError::engine(format!("failed to start the worker runtime: {e}")))?;
    let mut worker = build_worker(&runtime, engine.client.clone())
        .map_err(|e| CliError::engine(format!("failed to build the worker: {e}")))?;
    eprintln!(
        "worker polling task queues {} and {} on {} (namespace {}); Ctrl-C or SIGTERM to stop",
        casebatch_proto::TASK_QUEUE,
        casebatch_proto::host_task_queue(&casebatch_activities::runtime::local_process::hostname()),
        engine.address,
        engine.namespace
    );
    // Stop on Ctrl-C or SIGTERM (what container runtimes send).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::engine(format!("failed to watch SIGTERM: {e}")))?;
    run_worker_until(&mut worker, async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    })
    .await
    .map_err(|e| CliError::engine(format!("the worker failed: {e}")))?;
    Ok(Exit::Success)
}
