//! The batch operations as a library: validate and plan, run (a batch or one case), resume
//! and rerun, retry-failed, status, report, history, control operations, and a standalone worker.
//!
//! Every operation takes typed inputs and returns a typed outcome or a [`ControlError`]; it
//! prints nothing. Progress while a batch runs reaches the caller as [`DriveEvent`]s through
//! an [`Observer`]. The CLI parses flags, calls one operation, renders what comes back and
//! maps errors to exit codes; policy (what a success is, what gets re-run) lives here and in
//! `casebatch_workflows::decide`, never in the CLI.
//!
//! An operation is its steps called in order from one function: locate (`location.rs`) →
//! plan (`run_history.rs`, `retry_failed.rs`) → prepare the bundle (`prepare.rs`) → start or
//! attach (`begin.rs`) → follow (`follow.rs`) → finish (`finish.rs`); `drive.rs` is the tail
//! from start or attach on that every run shares. Files import downwards only
//! (`scripts/import-cycles.py control` checks there is no circle).

mod begin;
mod bootstrap;
mod carry;
pub mod compare;
mod drive;
mod error;
mod events;
mod finish;
mod follow;
mod host;
mod input;
mod inspect;
mod location;
mod logs;
mod operate;
mod options;
mod pollers;
mod prepare;
mod replica;
mod requeue;
mod retry_failed;
mod run;
mod run_history;
mod scheduling;
mod space;
mod start;
#[cfg(test)]
mod test_plan;
mod user;
mod workflow;

pub use compare::{BatchDiff, Listed, diff, list};
pub use error::{ControlError, Result};
pub use events::{DriveEvent, Observer};
pub use finish::{Ending, RunReport, Verdict};
pub use inspect::{HistoryOf, ReportView, StatusView, history, report, status};
pub use location::{BatchLocation, EngineChoice};
pub use logs::{LogsOf, LogsRequest, LogsShown, logs};
pub use operate::{Applied, Control, control};
pub use options::DriveOptions;
pub use replica::Replica;
pub use requeue::Requeue;
pub use retry_failed::{PreparedRetry, RetryRequest};
pub use run::{
    ManifestInput, Planned, ResumeRequest, RunRequest, plan, prepare_start, resume, run, run_case,
};
pub use run_history::{
    HISTORY_DB_ENV, HistoryView, index_path as history_index_path, show as history_view,
};

/// `retry-failed`, in two steps so the caller can show the plan before it runs.
pub mod retry {
    pub use crate::retry_failed::prepare;
}
