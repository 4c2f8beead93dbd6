//! `casebatch engine status|stop|ui` (and the hidden `engine keep`, the engine's keeper).

use std::path::Path;
use std::time::Duration;

use casebatch_worker::{DevServer, StopRefused};

use crate::exit::{CliError, CliResult, Exit};

pub fn status(output_dir: &Path, json: bool) -> CliResult {
    let s = DevServer::status(output_dir);
    if json {
        crate::render::json(&s);
        return Ok(Exit::Success);
    }
    let root = output_dir.display();
    match (&s.address, s.server_pid) {
        (Some(address), Some(pid)) => {
            let keeper = s
                .keeper_pid
                .map_or_else(|| "no keeper".into(), |k| format!("keeper pid {k}"));
            say!("embedded engine of {root}: running at {address} (server pid {pid}, {keeper})");
            if let Some(ui) = &s.ui_address {
                say!("  Web UI at {ui} (loopback only)");
            }
            if s.users.is_empty() {
                match s.idle_timeout_secs {
                    Some(secs) if s.keeper_pid.is_some() => say!(
                        "  used by no casebatch process: its keeper stops it after {secs}s idle"
                    ),
                    _ => say!(
                        "  used by no casebatch process: `casebatch engine stop --output-dir {root}` stops it"
                    ),
                }
            } else {
                say!("  used by casebatch process(es) {:?}", s.users);
            }
        }
        _ => say!("embedded engine of {root}: not running"),
    }
    say!("  database {}", s.db);
    say!("  log      {}", s.log);
    Ok(Exit::Success)
}

pub fn stop(output_dir: &Path) -> CliResult {
    match DevServer::stop_unused(output_dir) {
        Ok(true) => say!("stopped the embedded engine of {}", output_dir.display()),
        Ok(false) => say!("no embedded engine runs for {}", output_dir.display()),
        Err(e @ StopRefused::InUse { .. }) => return Err(CliError::usage(e)),
        Err(StopRefused::Io(e)) => {
            return Err(CliError::usage(format!(
                "failed to stop the embedded engine of {}: {e}",
                output_dir.display()
            )));
        }
    }
    Ok(Exit::Success)
}

pub fn keep(state_dir: &Path, port: u16, idle_secs: u64, ui_port: Option<u16>) -> CliResult {
    let idle = Duration::from_secs(idle_secs);
    let code = casebatch_worker::devserver::keep(state_dir, port, ui_port, idle);
    std::process::exit(code)
}

/// `casebatch engine ui`: the embedded engine with its Web UI, held (a lease, like any
/// command using the engine, and supervised: restarted with its UI if it dies) until Ctrl-C
/// or SIGTERM.
pub async fn ui(output_dir: &Path) -> CliResult {
    let root = std::path::absolute(output_dir).map_err(|e| {
        CliError::usage(format!(
            "failed to use the output directory {}: {e}",
            output_dir.display()
        ))
    })?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::usage(format!("failed to watch SIGTERM: {e}")))?;
    let ensured = {
        let root = root.clone();
        tokio::task::spawn_blocking(move || DevServer::ensure_with(&root, true))
    };
    let mut server = ensured
        .await
        .map_err(|e| CliError {
            exit: Exit::Engine,
            message: format!("failed to start the embedded engine: {e}"),
        })?
        .map_err(|e| {
            CliError::from(casebatch_control::ControlError::from(
                casebatch_worker::EngineError::from(e),
            ))
        })?;
    match server.ui_address() {
        Some(ui) => say!("{ui}"),
        None => {
            return Err(CliError {
                exit: Exit::Engine,
                message: format!(
                    "the embedded engine of {} runs without its Web UI; see {}",
                    root.display(),
                    server.log.display()
                ),
            });
        }
    }
    eprintln!(
        "Temporal Web UI of the embedded engine at {} (loopback only; engine {}); Ctrl-C or SIGTERM to stop using it",
        server.ui_address().unwrap_or_default(),
        server.address
    );
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    // Blocking: the last user out stops the engine and waits for it to go.
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .map_err(|e| CliError::usage(format!("failed to stop using the engine: {e}")))?;
    Ok(Exit::Success)
}
