//! `casebatch health`: one probe of a worker's or an agent's listener. The images' HEALTHCHECK
//! runs it (they carry no curl); its exit code is what Docker and podman expect: 0 healthy,
//! 1 unhealthy.

use std::time::Duration;

use crate::cli::HealthArgs;
use crate::exit::{CliResult, Exit};

pub async fn probe(args: &HealthArgs) -> CliResult {
    let path = if args.ready { "/readyz" } else { "/healthz" };
    let timeout = Duration::from_secs(args.timeout_secs.max(1));
    // No address file yet is a process still starting: unhealthy, not a usage error.
    let answered = match (&args.address, &args.address_file) {
        (Some(addr), _) => Ok(*addr),
        (None, Some(file)) => casebatch_telemetry::read_address(file),
        (None, None) => unreachable!("clap requires one of --address and --address-file"),
    };
    let answered = match answered {
        Ok(addr) => casebatch_telemetry::check(addr, path, timeout)
            .await
            .map(|()| format!("http://{addr}{path} answered 200")),
        Err(why) => Err(why),
    };
    match answered {
        Ok(what) => {
            println!("healthy: {what}");
            Ok(Exit::Success)
        }
        Err(why) => {
            println!("unhealthy: {why}");
            Ok(Exit::Incomplete)
        }
    }
}
