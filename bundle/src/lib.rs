//! The result bundle on disk: `<output-dir>/<batch_id>/`.
//!
//! Owns the layout (which file lives where), schema-versioned JSON records, atomic writes,
//! the per-case current result and attempt history, and assembling the batch-level files
//! (`batch_results.json`, `batch_attempts.json`, `batch_summary.json`, `batch_summary.csv`)
//! from them. Knows nothing of Temporal or of how cases run.
//!
//! ```text
//! <batch_id>/
//!   manifest.json  run_config.json  batch_plan.json  events.jsonl
//!   batch_results.json  batch_attempts.json  batch_summary.json  [batch_summary.csv]
//!   cases/<case_dir>/result.json                 current outcome of the case
//!   cases/<case_dir>/attempts/<n>/               attempt.jsonl result.json stdout.log stderr.log
//!                                                output/   (attempt.jsonl: spec, job, timings,
//!                                                evaluation, cleanup receipt, record)
//! ```

pub mod closing;
pub mod epochs;
pub mod layout;
pub mod mean;
pub mod plan_file;
pub mod records;
pub mod stats;
pub mod summary;
mod write;

// An attempt's directory, journal and records are the attempt crate's; the bundle holds
// attempts, so its readers find those types here too.
pub use casebatch_attempt::journal::append_jsonl;
pub use casebatch_attempt::{
    AttemptJournal, AttemptRecord, CleanupReceipt, ContainerFacts, Entry, EvaluationRecord, Event,
    PreparedRecord, RECORD_SCHEMA_VERSION, StageTiming, TraceRef, attempt_files, now_ms,
};
pub use layout::Bundle;
pub use plan_file::PlanIndex;
pub use records::*;
pub use summary::{
    BatchLineage, BatchSummary, SummaryRow, assemble, case_usage, write_assembled,
    write_batch_files, write_final_batch_files,
};
pub use write::{read_json, read_json_if_present, write_bytes_atomic, write_json_atomic};

/// Errors reading or writing the bundle; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("failed to read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON of the expected shape: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl From<casebatch_attempt::files::FileError> for BundleError {
    /// A refused read of an attempt file reads as the bundle's read error naming it.
    fn from(e: casebatch_attempt::files::FileError) -> Self {
        casebatch_attempt::JournalError::from(e).into()
    }
}

impl From<casebatch_attempt::JournalError> for BundleError {
    fn from(e: casebatch_attempt::JournalError) -> Self {
        use casebatch_attempt::JournalError as J;
        match e {
            J::Read { path, source } => BundleError::Read { path, source },
            J::Write { path, source } => BundleError::Write { path, source },
            J::Parse { path, source } => BundleError::Parse { path, source },
        }
    }
}
