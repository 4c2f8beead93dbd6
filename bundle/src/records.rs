//! Schema-versioned records written into the bundle.

use std::collections::BTreeMap;

use casebatch_proto::{ActorStatus, AttemptSummary, CaseState, Failure, Stage, Verdict};
use serde::{Deserialize, Serialize};

pub const RECORD_SCHEMA_VERSION: &str = "casebatch_v1";

/// `cases/<case_dir>/result.json`: the case's current outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub schema_version: String,
    pub case_id: String,
    pub case_dir: String,
    pub state: CaseRecordState,
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

/// A trace source named by the harness: `{"trace": {"url": "http://..."}}` in its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRef {
    pub url: String,
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

/// The state a case's record shows; `Retrying` while another attempt is coming.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CaseRecordState {
    Queued,
    Running,
    Retrying,
    Succeeded,
    Failed,
    Cancelled,
}

impl From<CaseState> for CaseRecordState {
    fn from(s: CaseState) -> Self {
        match s {
            CaseState::Queued => Self::Queued,
            CaseState::Running => Self::Running,
            CaseState::Succeeded => Self::Succeeded,
            CaseState::Failed => Self::Failed,
            CaseState::Cancelled => Self::Cancelled,
        }
    }
}

impl CaseRecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The engine's record of one attempt (its journal's `record` entry; `attempt.json` before).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub schema_version: String,
    pub case_id: String,
    pub summary: AttemptSummary,
    pub cleanup_confirmed: bool,
    pub will_retry: bool,
    /// The runtime's kind (`local-process`, `fake`, `agent`).
    pub runtime: String,
    /// The runtimes-table entry that ran the attempt (absent for the built-ins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_name: Option<String>,
    /// Whether the runtime held a job of this attempt at cleanup (its receipt's `held_job`):
    /// an attempt kept as evidence that held one was paid for twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_job: Option<bool>,
    /// When each stage of the attempt began and ended, in the order they ran (a stage retried
    /// after a worker died appears once per try). Absent in records made before they were kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageTiming>,
}

/// One stage's wall-clock span, as the worker that ran it saw it (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageTiming {
    pub stage: Stage,
    pub started_at_ms: u64,
    pub ended_at_ms: u64,
    pub duration_ms: u64,
}

/// The journal's `prepared` entry: the attempt's environment was provisioned ahead of need
/// (`prepare_ahead`); its `start` only submits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedRecord {
    pub schema_version: String,
    pub marker: String,
    pub prepared_at_ms: u64,
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

/// The cleanup receipt (the journal's `cleanup` entry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CleanupReceipt {
    pub schema_version: String,
    pub marker: String,
    pub cleanup_confirmed: bool,
    /// Processes carrying the marker that were found and signalled.
    pub killed: Vec<u32>,
    /// Processes still alive (or unreadable) after the last scan: why it is unconfirmed.
    pub remaining: Vec<u32>,
    pub scans: u32,
    pub message: String,
    /// How the attempt's processes were found and killed: `cgroup_v2`, `cgroup_v1_freezer`,
    /// `cgroup_v1_pids`, `proc_marker_scan` (or `simulation`). Absent in older receipts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// What was checked before the receipt says confirmed, in order: `cgroup_empty` (the
    /// attempt's cgroup had no member left after the kill), `marker_scan` (no process started
    /// since the job carries its marker), `not_submitted` (the runtime was never reached).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<String>,
    /// Processes that left the attempt's cgroup and were found by the marker they carry
    /// (killed; they keep the receipt unconfirmed: cleanup cannot vouch for the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escaped: Vec<u32>,
    /// Whether the runtime held a job of this attempt (absent in older receipts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_job: Option<bool>,
    /// The attempt's containers as the engine knew them before their removal (an attempt in
    /// a `sandbox.provider: container` sandbox; absent otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerFacts>,
}

/// One container of an attempt, as its cleanup found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFacts {
    /// `actor` (the harness) or `evaluator`.
    pub role: String,
    pub name: String,
    pub id: String,
    /// The image as the manifest names it, and the engine's id (digest) of what ran.
    pub image: String,
    pub image_id: String,
    pub exit_code: Option<i64>,
    /// The engine's `State.OOMKilled`.
    pub oom_killed: bool,
    /// True once the engine answered that it no longer knows the container.
    pub removed: bool,
}

/// The attempt's evaluation (the journal's `evaluation` entry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluationRecord {
    pub schema_version: String,
    pub configured: bool,
    pub verdict: Option<Verdict>,
    #[serde(default)]
    pub scores: BTreeMap<String, serde_json::Value>,
    pub failure: Option<Failure>,
    pub exit_code: Option<i32>,
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub ts_ms: u64,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    pub message: String,
}

impl Event {
    /// A runner started a run of the batch's workflow.
    pub const RUN_STARTED: &str = "run_started";
    /// A run ended (finalize wrote the batch files).
    pub const RUN_ENDED: &str = "run_ended";

    /// An event of the batch as a whole (no case).
    pub fn of_batch(kind: &str, message: String) -> Self {
        Self {
            ts_ms: crate::now_ms(),
            kind: kind.into(),
            case_id: None,
            attempt: None,
            message,
        }
    }
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
