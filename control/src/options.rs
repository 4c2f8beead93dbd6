//! How a run drives its batch: the flags of `run`, `resume` and `rerun` that reach past the
//! plan (who hosts the worker, which finished cases run again, supersede, speculation).

use std::path::PathBuf;

use crate::requeue::Requeue;

/// How to follow a batch.
#[derive(Debug, Clone, Default)]
pub struct DriveOptions {
    /// Host a worker in this process (the default); `false` leaves the work to replicas.
    pub without_worker: bool,
    /// Events per run before continue-as-new (tests use small values).
    pub history_budget: Option<u32>,
    /// Finished cases that get a new attempt.
    pub requeue: Requeue,
    /// A run of the batch that is still going is superseded (its jobs killed, its
    /// unfinished cases queued) and this run replaces it, instead of following it.
    pub supersede: bool,
    /// No tail speculation in this run (it is on for cases dealt from a `runtime:` list).
    pub no_speculation: bool,
    /// The run-history index (`None`: `CASEBATCH_HISTORY_DB`, else under the output root).
    pub history_db: Option<PathBuf>,
    /// Serve the in-process worker's metrics, `/healthz` and `/readyz` here.
    pub metrics: Option<casebatch_worker::Listen>,
    /// Limits that replace the plan's budget's of the same name (`resume --budget`).
    pub budget: Option<casebatch_proto::Budget>,
}
