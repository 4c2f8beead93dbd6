//! `casebatch worker`: one standalone worker replica. Run N of them against a cluster; they
//! share batches through the task queue.

use std::future::Future;
use std::path::Path;

use casebatch_proto::{TASK_QUEUE, host_task_queue};
use casebatch_runtime::local_process::hostname;
use casebatch_worker::{Engine, Listen, host_until};

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

    pub fn address(&self) -> &str {
        &self.engine.address
    }

    pub fn namespace(&self) -> &str {
        &self.engine.namespace
    }

    /// The shared queue and this host's queue.
    pub fn task_queues(&self) -> [String; 2] {
        [TASK_QUEUE.to_string(), host_task_queue(&hostname())]
    }

    /// Polls until `stop` completes, then shuts down gracefully. With `metrics`, serves the
    /// worker's metrics, `/healthz` and `/readyz` there meanwhile.
    pub async fn run_until(
        self,
        metrics: Option<&Listen>,
        stop: impl Future<Output = ()>,
    ) -> Result<()> {
        host_until(self.engine.client.clone(), metrics, stop)
            .await
            .map_err(|e| ControlError::engine_call("host the worker", e))
    }
}
