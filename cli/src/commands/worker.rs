//! `casebatch worker`: one standalone worker replica. Run N of them against a cluster;
//! they share batches through the task queue.

use casebatch_control::Replica;

use crate::cli::WorkerArgs;
use crate::exit::{CliError, CliResult, Exit};

pub async fn run(args: WorkerArgs) -> CliResult {
    let metrics = args.metrics.listen()?;
    let replica = Replica::connect(&args.output_dir, &args.engine.choice()).await?;
    let [shared, host] = replica.task_queues();
    eprintln!(
        "worker polling task queues {shared} and {host} on {} (namespace {}); Ctrl-C or SIGTERM to stop",
        replica.address(),
        replica.namespace()
    );
    // Stop on Ctrl-C or SIGTERM (what container runtimes send).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::usage(format!("failed to watch SIGTERM: {e}")))?;
    if let Some(listen) = &metrics {
        match &listen.address_file {
            Some(file) => eprintln!(
                "metrics, /healthz and /readyz on {} (the bound address goes to {})",
                listen.bind,
                file.display()
            ),
            None => eprintln!("metrics, /healthz and /readyz on http://{}", listen.bind),
        }
    }
    replica
        .run_until(metrics.as_ref(), async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await?;
    Ok(Exit::Success)
}
