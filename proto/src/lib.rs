//! Stable wire types: everything that crosses a process boundary through Temporal.
//!
//! Owns the workflow input/result, activity inputs/outputs, the names of signals and
//! queries, and the failure taxonomy. These payloads live in Temporal history, so they stay
//! compact (ids, statuses, small summaries) and change only in backward-compatible ways: new
//! fields are `#[serde(default)]`. This crate must not depend on the engine, and does no I/O but
//! one: reading the runtime agent's bearer token from where its source names (`token`), which
//! both ends of that wire share.

pub mod batch;
pub mod breaker;
pub mod failure;
pub mod pace;
pub mod packed;
pub mod planned_case_v1;
pub mod runtime_v1;
pub mod share;
pub mod stage;
pub mod token;
pub mod usage;
pub mod visibility;

pub use batch::*;
pub use breaker::{BreakerSettings, Circuit};
pub use failure::{Failure, FailureClass, FailureCode, Stage};
pub use pace::Pace;
pub use stage::*;
pub use usage::{Budget, Spending, Usage};

/// Task queue the worker polls and batches are started on.
pub const TASK_QUEUE: &str = "casebatch";

/// Activity task queue of one host. Every worker on the host polls it, so a job started
/// there is awaited (and after a crash, adopted) by a worker that can see its processes.
pub fn host_task_queue(hostname: &str) -> String {
    format!("{TASK_QUEUE}@{hostname}")
}

/// For `skip_serializing_if`: a zero count is left out of a payload (and older ones read).
pub(crate) fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// Workflow id of a batch: one workflow per batch id.
pub fn workflow_id(batch_id: &str) -> String {
    format!("casebatch-{batch_id}")
}

/// Names of the operations, usable from `temporal workflow signal/update/query` as well as the
/// CLI. Each control operation is both a signal (accepted unchecked, as the stock CLI sends
/// it) and an update of the same name, which a validator can refuse.
pub mod ops {
    pub const DRAIN: &str = "drain";
    pub const PAUSE: &str = "pause";
    pub const UNPAUSE: &str = "unpause";
    pub const CANCEL: &str = "cancel";
    pub const SUPERSEDE: &str = "supersede";
    pub const SET_CONCURRENCY: &str = "set_concurrency";
    pub const QUERY_STATUS: &str = "status";
}
