//! `batch status --json`, `batch report --json` and `batch history --json`: a batch looked at.

use std::path::PathBuf;

use casebatch_bundle::BatchSummary;
use casebatch_proto::{BatchEnd, BatchStatus};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The answer of `batch status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StatusView {
    /// The workflow is running (the status may still come from the bundle when no worker
    /// answers the query).
    pub live: bool,
    /// How the last run ended, when it ended with a result.
    pub end: Option<BatchEnd>,
    /// Where the status was read.
    pub source: StatusSource,
    /// The batch's status, as its workflow (or its bundle) reports it.
    pub status: BatchStatus,
    /// Cases in flight whose job a cluster scheduler holds in its queue (not running yet),
    /// as their attempts' journals last recorded it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<QueuedCase>,
}

/// A case in flight whose job waits in a cluster scheduler's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueuedCase {
    pub case_id: String,
    pub attempt: u32,
    /// `slurm`.
    pub scheduler: String,
    /// The scheduler's job id, once it answered the submit.
    pub job_id: Option<String>,
    /// Why the scheduler holds it (Slurm's reason: `Priority`, `Resources`, ...).
    pub reason: Option<String>,
    /// When it was submitted, in ms since the epoch.
    pub submitted_at_ms: u64,
}

/// Where `batch status` read the batch's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StatusSource {
    /// The running workflow answered its status query.
    Workflow,
    /// The workflow's result: how its last run ended.
    Result,
    /// The cases' result records alone (counts only): the workflow runs but no worker
    /// answered within 5 s, or it ended without a result (terminated, failed).
    Bundle,
    /// The cases' result records alone (counts only): the workflow is open but no worker polls
    /// its task queue (its runner was stopped or killed), so none was asked; `batch resume`
    /// continues it.
    NoWorker,
}

/// The answer of `batch report --json` (read from the bundle alone).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReportView {
    /// `batch_summary.json` as rebuilt from the per-case records.
    pub summary: BatchSummary,
    /// Attempts whose job was lost with nothing to adopt, so the case was run again.
    pub redispatched: usize,
}

/// The answer of `batch history --json`: where a run's workflow history was exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BatchHistoryView {
    /// The batch's workflow id.
    pub workflow_id: String,
    /// The file the history was written to.
    pub out: PathBuf,
}
