//! `batch run|resume|rerun|retry-failed --json`: how a run ended.

use std::path::PathBuf;

use casebatch_proto::{BatchEnd, Counters, Counts};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunEnd {
    /// Every case reached a final state.
    Completed,
    /// Drained: admitted cases finished, queued ones wait for resume.
    Drained,
    /// Cancelled: in-flight cases were cancelled and cleaned up.
    Cancelled,
    /// Superseded by another run of the same batch.
    Superseded,
    /// The budget is spent: admitted cases finished, queued ones wait for `resume --budget`.
    BudgetExhausted,
    /// The batch had already completed: nothing was run again.
    AlreadyComplete,
}

impl From<BatchEnd> for RunEnd {
    fn from(end: BatchEnd) -> Self {
        match end {
            BatchEnd::Completed => RunEnd::Completed,
            BatchEnd::Drained => RunEnd::Drained,
            BatchEnd::Cancelled => RunEnd::Cancelled,
            BatchEnd::Superseded => RunEnd::Superseded,
            BatchEnd::BudgetExhausted => RunEnd::BudgetExhausted,
        }
    }
}

/// The outcome of a run, one object on stdout; the exit code is the text output's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunView {
    /// The batch's id.
    pub batch_id: String,
    /// The batch's result bundle (`<output-dir>/<batch_id>/`).
    pub bundle: PathBuf,
    /// Some case ran on the fake runtime: nothing was executed for it.
    pub simulated: bool,
    /// How the run ended.
    pub end: RunEnd,
    /// Cases by state at the end (from the bundle's summary when already complete).
    pub counts: Counts,
    /// What the run's workflow counted (absent when nothing ran: already complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}
