//! What Temporal's own tools (`temporal workflow list/describe`, the web UI) see of a batch:
//! the search attributes it is found by and the memo it is read by. The names here are
//! registered on the embedded dev server and documented for clusters (docs/operations.md).

use crate::{BatchEnd, Counts};

/// Search attribute names and their Temporal types.
pub mod search_attr {
    /// Keyword: the batch id (set at start).
    pub const BATCH_ID: &str = "CasebatchBatchId";
    /// Keyword: one of [`super::outcome`].
    pub const OUTCOME: &str = "CasebatchOutcome";
    /// Int: cases succeeded so far.
    pub const SUCCEEDED: &str = "CasebatchSucceeded";
    /// Int: cases failed so far.
    pub const FAILED: &str = "CasebatchFailed";

    /// Every attribute with its type as `temporal operator search-attribute create --type`
    /// and `temporal server start-dev --search-attribute` spell it.
    pub const ALL: [(&str, &str); 4] = [
        (BATCH_ID, "Keyword"),
        (OUTCOME, "Keyword"),
        (SUCCEEDED, "Int"),
        (FAILED, "Int"),
    ];
}

/// Values of `CasebatchOutcome`. A run that failed or was terminated keeps `running`: read
/// it together with Temporal's `ExecutionStatus`.
pub mod outcome {
    /// The run is admitting or finishing cases (also while paused, draining, cancelling, and
    /// across continue-as-new).
    pub const RUNNING: &str = "running";
    /// Every case reached a terminal state and none failed.
    pub const COMPLETED: &str = "completed";
    /// Every case reached a terminal state and at least one failed.
    pub const FAILED_CASES_PRESENT: &str = "failed_cases_present";
    /// Drained: admitted cases finished, queued work remains for `resume`.
    pub const DRAINED: &str = "drained";
    /// Cancelled: in-flight cases were cancelled.
    pub const CANCELLED: &str = "cancelled";
    /// A run stopped by `supersede`, its running jobs killed (usually replaced by a newer
    /// run of the same batch).
    pub const SUPERSEDED: &str = "superseded";
    /// The budget is spent: admitted cases finished, queued work remains for
    /// `resume --budget`.
    pub const BUDGET_EXHAUSTED: &str = "budget_exhausted";
}

/// The `CasebatchOutcome` a run that ended this way records.
pub fn outcome_of(end: BatchEnd, counts: &Counts) -> &'static str {
    match end {
        BatchEnd::Completed if counts.failed > 0 => outcome::FAILED_CASES_PRESENT,
        BatchEnd::Completed => outcome::COMPLETED,
        BatchEnd::Drained => outcome::DRAINED,
        BatchEnd::Cancelled => outcome::CANCELLED,
        BatchEnd::Superseded => outcome::SUPERSEDED,
        BatchEnd::BudgetExhausted => outcome::BUDGET_EXHAUSTED,
    }
}

/// Memo keys, set once at start (continue-as-new keeps them).
pub mod memo {
    /// Path of the manifest the plan was made from.
    pub const MANIFEST: &str = "manifest";
    /// `user@host` that started the run.
    pub const OWNER: &str = "owner";
    /// Number of cases in the plan.
    pub const CASES: &str = "cases";
    /// The plan's fingerprint (sha256): a batch id only ever runs one task list.
    pub const FINGERPRINT: &str = "fingerprint";
    /// Absolute path of the bundle directory.
    pub const BUNDLE_DIR: &str = "bundle_dir";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names_failed_cases_only_for_completed_runs() {
        let failed = Counts {
            succeeded: 2,
            failed: 1,
            ..Counts::default()
        };
        let clean = Counts {
            succeeded: 3,
            ..Counts::default()
        };
        assert_eq!(outcome_of(BatchEnd::Completed, &clean), "completed");
        assert_eq!(
            outcome_of(BatchEnd::Completed, &failed),
            "failed_cases_present"
        );
        assert_eq!(outcome_of(BatchEnd::Drained, &failed), "drained");
        assert_eq!(outcome_of(BatchEnd::Cancelled, &clean), "cancelled");
    }
}
