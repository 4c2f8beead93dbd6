//! `casebatch agent`: the runtime service on this host. Runs until SIGTERM or Ctrl-C; its
//! jobs keep running after it stops, and the next agent on the same data dir re-attaches them.

use casebatch_agent::Agent;

use crate::cli::AgentArgs;
// The agent's errors map to their exit codes in exit.rs, with every other error.
use crate::exit::{CliError, CliResult, Exit};

pub async fn run(args: AgentArgs) -> CliResult {
    let config = args.config()?;
    let metrics = args.metrics.listen()?;
    // Watched before anything starts, so a stop signal is never missed.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::usage(format!("failed to watch SIGTERM: {e}")))?;
    let agent = Agent::start(config).await?;
    let ready = match metrics {
        None => None,
        Some(listen) => {
            let metrics = agent.metrics();
            let render: casebatch_telemetry::Render = std::sync::Arc::new(move || {
                let metrics = metrics.clone();
                Box::pin(async move { metrics.render().await })
            });
            let (addr, ready) = casebatch_telemetry::serve_rendered(&listen, render)
                .await
                .map_err(|e| CliError::usage(format!("--metrics-bind: {e}")))?;
            eprintln!("metrics on http://{addr}/metrics (probes: /healthz, /readyz)");
            Some(ready)
        }
    };
    eprintln!(
        "casebatch agent listening on {} (data dir {}, {} jobs re-attached); Ctrl-C or SIGTERM to stop",
        agent.addr(),
        agent.data_dir().display(),
        agent.reattached()
    );
    // Ready from here: bound, and every job of the table re-attached.
    ready.iter().for_each(|r| r.set(true));
    agent
        .serve(async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            ready.iter().for_each(|r| r.set(false));
        })
        .await?;
    eprintln!("casebatch agent stopped; its running jobs go on");
    Ok(Exit::Success)
}
