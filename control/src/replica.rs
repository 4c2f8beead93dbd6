//! `casebatch worker`: one standalone worker replica. Run N of them against a cluster; they
//! share batches through the task queue.

use std::future::Future;
use std::path::Path;

use casebatch_attempt::hostname;
use casebatch_proto::{TASK_QUEUE, host_task_queue};
use casebatch_worker::{Engine, EngineError, Telemetry, host_served_until};

use crate::error::{ControlError, Result};
use crate::location::{EngineChoice, absolute};

/// A worker replica connected to its engine, not yet polling.
pub struct Replica {
    engine: Engine,
}

impl Replica {
    pub async fn connect(output_dir: &Path, engine: &EngineChoice) -> Result<Self> {
        let engine = engine.connect(&absolute(output_dir)?).await?;
        Ok(Self { engine })
    }

    /// [`Replica::connect`], for as long as it takes: a replica is a service, and an engine
    /// that does not answer yet (a cluster still starting, a network not up) is waited for,
    /// telling `waiting` after each bounded round. Anything final (bad settings, credentials,
    /// an unknown namespace) still ends it.
    pub async fn connect_waiting(
        output_dir: &Path,
        engine: &EngineChoice,
        mut waiting: impl FnMut(&ControlError),
    ) -> Result<Self> {
        loop {
            match Self::connect(output_dir, engine).await {
                Err(e @ ControlError::Engine(EngineError::Unreachable { .. })) => waiting(&e),
                done => return done,
            }
        }
    }

    pub fn address(&self) -> &str {
        &self.engine.address
    }

    /// Where the embedded engine serves its Web UI, when it does (`--ui`).
    pub fn ui_address(&self) -> Option<String> {
        self.engine.embedded.as_ref()?.ui_address()
    }

    pub fn namespace(&self) -> &str {
        &self.engine.namespace
    }

    /// The shared queue and this host's queue.
    pub fn task_queues(&self) -> [String; 2] {
        [TASK_QUEUE.to_string(), host_task_queue(&hostname())]
    }

    /// Polls until `stop` completes, then shuts down gracefully. With `telemetry` (a listener
    /// already serving), its metrics record there and `/readyz` answers 200 while it polls.
    pub async fn run_until(
        self,
        telemetry: Option<&Telemetry>,
        stop: impl Future<Output = ()>,
    ) -> Result<()> {
        host_served_until(self.engine.client.clone(), telemetry, stop)
            .await
            .map_err(|e| ControlError::engine_call("host the worker", e))
    }
}
