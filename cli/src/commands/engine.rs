//! `casebatch engine status|stop` (and the hidden `engine keep`, the engine's keeper).

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

pub fn keep(state_dir: &Path, port: u16, idle_secs: u64) -> CliResult {
    let code = casebatch_worker::devserver::keep(state_dir, port, Duration::from_secs(idle_secs));
    std::process::exit(code)
}
