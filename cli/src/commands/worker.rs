//! `casebatch worker`: one standalone worker replica. Run N of them against a cluster;
//! they share batches through the task queue.

use casebatch_control::Replica;
use casebatch_telemetry::Telemetry;
use tokio::sync::watch;

use crate::cli::WorkerArgs;
use crate::exit::{CliError, CliResult, Exit};

pub async fn run(args: WorkerArgs) -> CliResult {
    let metrics = args.metrics.listen()?;
    // Serving before the engine answers: `/healthz` (liveness) from the first moment, so a
    // probe never kills a replica that is only waiting for its engine; `/readyz` answers 503
    // until it polls.
    let telemetry =
        match &metrics {
            Some(listen) => Some(Telemetry::serve(listen).await.map_err(|e| {
                CliError::usage(format!("failed to serve metrics and probes: {e:#}"))
            })?),
            None => None,
        };
    if let (Some(listen), Some(t)) = (&metrics, &telemetry) {
        match &listen.address_file {
            Some(file) => eprintln!(
                "metrics, /healthz and /readyz on http://{} (named in {})",
                t.addr,
                file.display()
            ),
            None => eprintln!("metrics, /healthz and /readyz on http://{}", t.addr),
        }
    }
    // Stop on Ctrl-C or SIGTERM (what container runtimes send), while waiting for the engine
    // as well as while polling.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::usage(format!("failed to watch SIGTERM: {e}")))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    let stopped = || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    let engine = casebatch_control::EngineChoice {
        ui: args.ui,
        ..args.engine.choice()
    };
    let connect = Replica::connect_waiting(&args.output_dir, &engine, |e| {
        eprintln!("warning: {e}; still waiting for it (/readyz answers 503 until it does)")
    });
    let replica = tokio::select! {
        replica = connect => replica?,
        () = stopped() => return Ok(Exit::Success),
    };
    if let Some(ui) = replica.ui_address() {
        eprintln!("Temporal Web UI: {ui} (loopback only; served while this worker runs)");
    }
    let [shared, host] = replica.task_queues();
    eprintln!(
        "worker polling task queues {shared} and {host} on {} (namespace {}); Ctrl-C or SIGTERM to stop",
        replica.address(),
        replica.namespace()
    );
    replica.run_until(telemetry.as_ref(), stopped()).await?;
    Ok(Exit::Success)
}
