//! Schema-versioned records written into the bundle.

use std::collections::BTreeMap;

use casebatch_attempt::{CleanupReceipt, TraceRef};
use casebatch_proto::{ActorStatus, CaseState, Failure, Verdict};
use serde::{Deserialize, Serialize};

/// `cases/<case_dir>/result.json`: the case's current outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub schema_version: String,
    pub case_id: String,
    pub case_dir: String,
    pub state: CaseState,
    pub attempts: u32,
    pub actor_status: Option<ActorStatus>,
    pub exit_code: Option<i32>,
    pub evaluation_configured: bool,
    pub verdict: Option<Verdict>,
    pub cleanup_confirmed: bool,
    pub failure: Option<Failure>,
    pub collect_failure: Option<Failure>,
    pub adopted: bool,
    /// Processes started for the latest attempt (local-process): 1, or more when a start was
    /// found provably never to have run and was started again (see `events.jsonl`,
    /// `job_restarted`). Absent where the runtime starts no process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_starts: Option<u32>,
    #[serde(default)]
    pub scores: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub outputs: serde_json::Value,
    /// Simulated by the `fake` runtime: nothing ran.
    #[serde(default)]
    pub simulated: bool,
    /// Memory granted to this job only, past the manifest's (OOM escalation).
    #[serde(default)]
    pub memory_boost_mb: Option<u64>,
    /// What is needed to collect the trace again (set when the harness named one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_ref: Option<TraceRef>,
    /// Lineage when this batch re-runs another one's failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// The runtime that ran the latest attempt: its runtimes-table name, or the built-in
    /// (`local-process`, `fake`). Absent in records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

/// Where a case result comes from in a `retry-failed` batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Origin {
    pub retry_of: String,
    /// True when the result was carried over verbatim from `retry_of`, not re-run.
    pub carried: bool,
    /// True when only the trace was collected again (the actor and evaluator did not re-run).
    #[serde(default)]
    pub recollected: bool,
}

/// `lineage.json` of a batch made by `retry-failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lineage {
    pub schema_version: String,
    pub retry_of: String,
    pub class_filter: Vec<String>,
    pub rerun: Vec<String>,
    pub carried: Vec<String>,
    /// Memory granted per re-run case (by case id) after an OOM kill.
    pub memory_boost_mb: std::collections::BTreeMap<String, u64>,
    /// OOM-killed cases left carried because doubling would pass the cap.
    #[serde(default)]
    pub past_cap: Vec<String>,
    /// Collect-failed cases whose trace was pulled again (no re-run), and which of them
    /// recovered.
    #[serde(default)]
    pub recollected: Vec<String>,
    #[serde(default)]
    pub recovered: Vec<String>,
}

/// `cases/<dir>/released/<attempt>-<ms>.json`: an environment provisioned ahead for an attempt
/// that never started (the batch drained or was cancelled first), and the cleanup that
/// removed it. The attempt's number is used again when the case runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleasedRecord {
    pub schema_version: String,
    pub case_id: String,
    pub attempt: u32,
    /// `drain`, `cancel` or `supersede`.
    pub why: String,
    pub released_at_ms: u64,
    pub receipt: CleanupReceipt,
}

/// `manifest.json`: the manifest as the batch saw it, so a retry or an audit does not depend
/// on what the file reads today.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestRecord {
    pub schema_version: String,
    /// Absolute path the manifest was read from.
    pub path: String,
    pub sha256: String,
    pub format: casebatch_manifest::ManifestFormat,
    /// The text itself (empty when the file could not be read again).
    pub content: String,
}

/// `run_config.json`: where the batch runs. Never a secret: only where the engine is, not how
/// to authenticate to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub schema_version: String,
    pub batch_id: String,
    pub casebatch_version: String,
    pub engine: EngineRecord,
    pub settings: casebatch_manifest::BatchSettings,
    pub retry_backoff_ms: u64,
}

/// The engine a batch was started on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRecord {
    pub mode: EngineMode,
    pub address: String,
    pub namespace: String,
    /// The Temporal profile the batch was started with (its name only: credentials stay in
    /// the profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub task_queue: String,
    pub workflow_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineMode {
    /// The local dev server under the output root.
    Embedded,
    /// A Temporal cluster.
    Cluster,
}
