//! `casebatch history --json`: the run-history index refreshed, and its medians.

use std::path::PathBuf;

use casebatch_history::{MedianRow, Refreshed};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What `casebatch history` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryView {
    /// The index file.
    pub index: PathBuf,
    /// What refreshing (or rebuilding) it from the bundles did.
    pub refreshed: Refreshed,
    /// Attempt duration medians by harness and runtime.
    pub medians: Vec<MedianRow>,
}
