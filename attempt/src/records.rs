//! The typed records of an attempt's journal (`attempt.jsonl`, [`crate::journal`]), one type
//! per kind of line: what was provisioned, the job a runtime started, the container, the
//! evaluation, the cleanup receipt and the attempt's record. Every runtime writes these same
//! types, on a worker's host or an agent's.

use std::collections::BTreeMap;
use std::path::PathBuf;

use casebatch_proto::{AttemptKey, AttemptSummary, Failure, Stage, Verdict};
use serde::{Deserialize, Serialize};

use crate::local::cgroup::Tracking;
use crate::local::memlimit::MemoryLimit;
use crate::local::procfs::ProcessId;

/// The `schema_version` of every record casebatch writes.
pub const RECORD_SCHEMA_VERSION: &str = "casebatch_v1";

/// A trace source named by the harness: `{"trace": {"url": "http://..."}}` in its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRef {
    pub url: String,
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

/// One stage's span: its start on the engine's clock (ms since the epoch, the clock workflow
/// times are on), its duration measured on a clock that does not step, its end their sum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageTiming {
    pub stage: Stage,
    pub started_at_ms: u64,
    pub ended_at_ms: u64,
    pub duration_ms: u64,
    /// The stage ran in a retry of its activity (this try's number): the try before was lost
    /// with its worker or to the engine's patience (a wait that spanned an outage), and the
    /// time between is in no stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<u32>,
}

/// The journal's `prepared` entry: the attempt's environment was provisioned ahead of need
/// (`prepare_ahead`); its `start` only submits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedRecord {
    pub schema_version: String,
    pub marker: String,
    pub prepared_at_ms: u64,
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
    /// The attempt's job as its cluster scheduler last reported it (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_job: Option<SchedulerFacts>,
}

impl CleanupReceipt {
    /// `method`'s receipt for the attempt `marker` before it has found anything: not
    /// confirmed, nothing killed or checked. Each runtime fills in what its cleanup finds.
    pub fn begun(marker: String, method: &str) -> Self {
        Self {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker,
            cleanup_confirmed: false,
            killed: Vec::new(),
            remaining: Vec::new(),
            scans: 0,
            message: String::new(),
            method: Some(method.into()),
            checks: Vec::new(),
            escaped: Vec::new(),
            held_job: None,
            containers: Vec::new(),
            scheduler_job: None,
        }
    }
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
    /// Set when no evaluator ran and the case's `pass_when` gave the verdict from a score: the
    /// rule as applied (`score match = 0, pass_when at_least 1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_when: Option<String>,
}

/// Where a job record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// The intent: written before the process is spawned; pid not known yet.
    Starting,
    /// The process is known (pid, start time). Records from before intents read as this.
    #[default]
    Running,
}

fn one() -> u32 {
    1
}

/// A process job's record (the journal's `job` entry): the local machinery's record of the
/// job it starts, an intent first, then the process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub schema_version: String,
    pub marker: String,
    #[serde(default)]
    pub state: JobState,
    /// The wrapper (group leader); `None` while starting, or when only its traces were found.
    pub pid: Option<u32>,
    pub start_ticks: Option<u64>,
    pub started_at_ms: u64,
    /// The same moment on the host's boot clock (`local::boot_clock`), which a deadline is
    /// measured on: a wall clock that steps moves no deadline. Absent in records from before
    /// it was kept: then the wrapper's start time stands in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_boot_ms: Option<u64>,
    pub timeout_seconds: u64,
    pub memory: MemoryLimit,
    /// The cgroup that holds the attempt's processes (`marker_scan` when none was writable,
    /// and in records from before cgroups).
    #[serde(default)]
    pub tracking: Tracking,
    /// How many processes were started for this attempt: 1, unless an intent was found that
    /// provably never ran and the attempt was started again.
    #[serde(default = "one")]
    pub starts: u32,
    /// The worker process that wrote the intent and spawned the process.
    #[serde(default)]
    pub owner: Option<ProcessId>,
    /// True when a later worker completed this record from the start's traces (it died in
    /// the submit window).
    #[serde(default)]
    pub recovered: bool,
    /// The harness's working directory (its input file beside it), outside the bundle
    /// ([`crate::scratch`]). Absent in records from before scratch space, and in records
    /// rebuilt from traces: then this host's own path for the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<PathBuf>,
}

/// The journal's `spec` entry: the attempt as it was provisioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecRecord {
    pub schema_version: String,
    pub key: AttemptKey,
    /// The planned case, as the worker resolved it: evidence for readers of the bundle. Its
    /// type is the manifest's, which this crate sits below; nothing in the engine reads it
    /// back (the job is rebuilt from the plan).
    pub case: serde_json::Value,
    /// Simulated by the `fake` runtime: nothing runs.
    #[serde(default)]
    pub simulated: bool,
}

/// The journal's `job` entry: a runtime's record of the job it started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum JobEntry {
    /// A process started by the local machinery (on a worker's host or an agent's).
    Process(JobRecord),
    /// A simulated job (the `fake` runtime): only when it began.
    Simulated(SimulatedJob),
    /// A job handed to a cluster scheduler (Slurm).
    Scheduled(ScheduledJob),
}

impl JobEntry {
    /// The process record, if this is one.
    pub fn process(&self) -> Option<&JobRecord> {
        match self {
            JobEntry::Process(r) => Some(r),
            JobEntry::Simulated(_) | JobEntry::Scheduled(_) => None,
        }
    }

    /// The scheduler's job, if this is one.
    pub fn scheduled(&self) -> Option<&ScheduledJob> {
        match self {
            JobEntry::Scheduled(j) => Some(j),
            JobEntry::Process(_) | JobEntry::Simulated(_) => None,
        }
    }
}

/// A job handed to a cluster scheduler: what any worker needs to find it there again. The
/// scheduler's own record is the truth while it keeps one; this one is written before the
/// submit (an intent, `job_id` unknown) and again as the job moves, so a job the scheduler
/// has forgotten is still known to have been submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledJob {
    pub schema_version: String,
    /// `slurm`.
    pub scheduler: String,
    pub marker: String,
    /// The job's name in the scheduler, from the attempt's marker: how it is found again.
    pub name: String,
    /// The scheduler's id for it, once it answered the submit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    pub state: ScheduledState,
    /// Why the scheduler holds it pending (Slurm's reason: `Priority`, `Resources`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where it ran, once it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When the submit was decided (the intent), in ms since the epoch.
    pub submitted_at_ms: u64,
    /// Submits made for the attempt: 1, unless an intent provably never reached the
    /// scheduler and the attempt was submitted again.
    pub starts: u32,
}

/// Where a scheduled job stands, as the worker last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduledState {
    /// Written before the submit: the scheduler's answer is not known yet.
    Submitting,
    /// Queued by the scheduler, not running.
    Pending,
    Running,
    /// The scheduler reports it ended.
    Ended,
}

/// A scheduler's job as cleanup last saw it (a receipt's `scheduler_job`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerFacts {
    /// `slurm`.
    pub scheduler: String,
    pub job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The scheduler's state (`COMPLETED`, `OUT_OF_MEMORY`, `CANCELLED`, ...).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
}

/// The `fake` runtime's job: when the simulated job began, so a re-attached wait only waits
/// the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimulatedJob {
    pub schema_version: String,
    pub simulated: bool,
    pub marker: String,
    pub started_at_ms: u64,
}

/// The journal's `container` entry: written before the attempt's container is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub name: String,
    pub image: String,
    pub created_at_ms: u64,
    /// Created by `provision` (ahead of its slot, with `prepare_ahead`), not yet started.
    /// Records without it were written by `submit`, which starts what it creates.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provisioned: bool,
    /// When `submit` first started it: the attempt's deadline (its timeout, capped by the
    /// sandbox lifetime) counts from here, else from `created_at_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    /// The same moment on the host's boot clock, which the deadline is measured on (a
    /// wall-clock step moves no deadline). Absent in records from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_boot_ms: Option<u64>,
    /// The process that started it: a wait in any other process, once that one is gone,
    /// adopted it. Absent in records from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<ProcessId>,
}

impl ContainerRecord {
    /// Whether a start of the actor was attempted: what a job held, for its receipt.
    pub fn start_attempted(&self) -> bool {
        !self.provisioned || self.started_at_ms.is_some()
    }
}

/// One line of `events.jsonl`, the batch's timeline (written by the engine's stages and by
/// the runtimes about an attempt).
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
    /// A finished case was queued again (`batch rerun`, `resume --retry-failed`): its latest
    /// outcome is a re-run's.
    pub const REQUEUED: &str = "requeued";

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
