//! What can go wrong in a batch operation, one variant per meaning, so the CLI can map each
//! to its exit code (usage, engine, local I/O) without reading messages.

use std::path::PathBuf;

use casebatch_bundle::BundleError;
use casebatch_manifest::ManifestError;
use casebatch_worker::EngineError;

pub type Result<T, E = ControlError> = std::result::Result<T, E>;

/// What a command naming one case takes (`run --case`, `logs --case`).
pub(crate) const ONE_CASE: &str =
    "name a case by its id: its task id, or with epochs one run of it (`TASK#2`)";
/// What `rerun --case` takes.
pub(crate) const TASK_OR_CASE: &str =
    "name a task id (every run of the task) or a case id (`TASK#2`, one run of a task with epochs)";

/// Messages read "failed to ..." and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The manifest is invalid; every problem is listed. Nothing was written.
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    /// An argument names something unusable (a batch id that would leave the output root).
    #[error("failed to use {what} {value:?}: {hint}")]
    BadArgument {
        what: &'static str,
        value: String,
        hint: &'static str,
    },
    #[error(
        "failed to find batch {batch_id}: no bundle at {} (check --batch-id and --output-dir)",
        path.display()
    )]
    NoBundle { batch_id: String, path: PathBuf },
    /// `hint` says what the command takes: `rerun` a task id (every run) or a case id.
    #[error("failed to find case {case_id:?} in {within}: {hint}")]
    UnknownCase {
        case_id: String,
        within: String,
        hint: &'static str,
    },
    /// A batch id only ever runs one task list.
    #[error(
        "failed to start batch {batch_id}: {} already holds a different task list (plan fingerprint {existing} vs {planned}). A new task list belongs in a new batch: pass another --batch-id",
        path.display()
    )]
    PlanConflict {
        batch_id: String,
        path: PathBuf,
        existing: String,
        planned: String,
    },
    #[error("failed to create batch {batch_id}: {} already exists; pick another --new-batch-id", path.display())]
    BatchExists { batch_id: String, path: PathBuf },
    #[error(
        "failed to {action} batch {batch_id}: it is not running (see `casebatch batch status`)"
    )]
    NotRunning {
        batch_id: String,
        action: &'static str,
    },
    /// The batch's validator refused the operation (it would be wrong in this state).
    #[error("batch {batch_id} refused `{action}`: {reason}")]
    Refused {
        batch_id: String,
        action: &'static str,
        reason: String,
    },
    #[error(
        "failed to {action} batch {batch_id}: it is still running; wait for it to finish or drain it"
    )]
    StillRunning {
        batch_id: String,
        action: &'static str,
    },
    /// The workflow under this batch's id belongs to another batch (another output root or
    /// task list): a shared namespace is never acted on by guess.
    #[error(
        "failed to use workflow {workflow_id}: it runs {theirs}, not this batch's {ours}. Batch ids are shared by everyone on the namespace: pick another --batch-id (e.g. prefixed with your team or user)"
    )]
    NotOurBatch {
        workflow_id: String,
        theirs: String,
        ours: String,
    },
    /// Flags (or `TEMPORAL_ADDRESS`) name another engine than the one the batch runs on.
    #[error(
        "failed to use {asked} for batch {batch_id}: it runs on {recorded} (see its run_config.json). Drop the engine flags to use that engine"
    )]
    EngineMismatch {
        batch_id: String,
        recorded: String,
        asked: String,
    },
    /// Someone terminated the batch's workflow; its finished cases are in the bundle.
    #[error(
        "batch workflow {workflow_id} was terminated (not by casebatch); finished cases are kept in the bundle and `casebatch batch resume` continues the rest"
    )]
    Terminated { workflow_id: String },
    /// A record of the bundle is there but cannot be read (truncated, invalid, a directory
    /// where a file belongs): the command stops before acting on a guess.
    #[error(
        "{0}. The batch's bundle is damaged there: restore that file from a copy of the bundle, then run the command again"
    )]
    BundleUnreadable(#[source] BundleError),
    /// Writing the bundle (or another output file) failed; what the engine holds is intact.
    #[error(transparent)]
    Write(BundleError),
    /// The bundle's or the embedded engine's file system is (nearly) full: the run stopped
    /// before the engine died of it or the bundle was left half-written (see `space.rs`).
    #[error(
        "failed to {action}: {} is out of space: {space}. The engine's state and the bundle are intact: free space on that file system, then {then}",
        path.display()
    )]
    OutOfSpace {
        /// What stopped: `continue batch X`, `start the embedded engine`.
        action: String,
        path: PathBuf,
        space: String,
        /// What to run once space is back.
        then: String,
    },
    /// The engine could not be reached, started or trusted.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The engine answered a call with an error.
    #[error("failed to {action}: {message}")]
    EngineCall { action: String, message: String },
    /// The run-history index cannot be opened or read.
    #[error(
        "the run-history index {index} is unusable: {message}; it is only an index of the bundles: delete it, or run `casebatch history rebuild`"
    )]
    History { index: String, message: String },
}

impl From<BundleError> for ControlError {
    fn from(e: BundleError) -> Self {
        match e {
            BundleError::Write { .. } => ControlError::Write(e),
            BundleError::Read { .. } | BundleError::Parse { .. } => {
                ControlError::BundleUnreadable(e)
            }
        }
    }
}

impl ControlError {
    pub(crate) fn engine_call(action: impl Into<String>, e: impl std::fmt::Display) -> Self {
        ControlError::EngineCall {
            action: action.into(),
            message: e.to_string(),
        }
    }

    pub(crate) fn write(path: &std::path::Path, source: std::io::Error) -> Self {
        ControlError::Write(BundleError::Write {
            path: path.display().to_string(),
            source,
        })
    }
}
