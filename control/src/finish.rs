//! The end of a run: what the bundle gets from the workflow's outcome (the failures a
//! worker could not record, or the batch files of a batch that was already complete), and
//! what the run adds up to.

use casebatch_bundle::{
    BatchSummary, Bundle, CaseResult, RECORD_SCHEMA_VERSION, write_batch_files, write_json_atomic,
};
use casebatch_manifest::PlanHead;
use casebatch_proto::CaseState;
use casebatch_proto::{BatchEnd, BatchOutcome, UnrecordedFailure};

use crate::error::{ControlError, Result};

/// A batch followed to the end of a run.
#[derive(Debug)]
pub struct RunReport {
    pub bundle: Bundle,
    pub plan: PlanHead,
    pub ending: Ending,
}

#[derive(Debug)]
pub enum Ending {
    /// The workflow ran to this outcome.
    Ran(BatchOutcome),
    /// Every case was already finished: nothing was started. The batch files were rebuilt.
    AlreadyComplete(BatchSummary),
}

/// What a run adds up to, for people and exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every case succeeded (verified by its evaluator where one is configured).
    AllSucceeded,
    /// Drained, paused, superseded or out of budget with queued work remaining:
    /// deliberately incomplete.
    Incomplete,
    /// Failed, cancelled or mixed outcomes (all outputs still written).
    Failures,
}

impl RunReport {
    pub fn verdict(&self) -> Verdict {
        match &self.ending {
            Ending::Ran(o) => {
                let c = &o.status.counts;
                match o.end {
                    // Superseded: its unfinished cases wait for the run that replaces it.
                    BatchEnd::Drained | BatchEnd::Superseded | BatchEnd::BudgetExhausted
                        if c.queued > 0 =>
                    {
                        Verdict::Incomplete
                    }
                    BatchEnd::Cancelled => Verdict::Failures,
                    _ if c.succeeded == c.total() => Verdict::AllSucceeded,
                    _ => Verdict::Failures,
                }
            }
            Ending::AlreadyComplete(s) if s.succeeded() == s.total => Verdict::AllSucceeded,
            Ending::AlreadyComplete(_) => Verdict::Failures,
        }
    }
}

/// Records the run's end in the bundle. `None`: nothing was started, every case was
/// already terminal, and the batch files are rebuilt from the per-case records.
pub(crate) fn finish(
    bundle: Bundle,
    plan: PlanHead,
    ran: Option<BatchOutcome>,
) -> Result<RunReport> {
    let ending = match ran {
        Some(outcome) => {
            record_unrecorded(&bundle, &plan, &outcome.status.unrecorded)?;
            Ending::Ran(outcome)
        }
        None => Ending::AlreadyComplete(write_batch_files(&bundle, &plan)?),
    };
    Ok(RunReport {
        bundle,
        plan,
        ending,
    })
}

/// Writes the results a worker could not (it may not write the bundle; the engine kept their
/// failures), so the bundle and `batch report` show why those cases failed. A result the
/// worker did write is left alone.
fn record_unrecorded(
    bundle: &Bundle,
    plan: &PlanHead,
    unrecorded: &[UnrecordedFailure],
) -> Result<()> {
    let mut wrote = false;
    for u in unrecorded {
        let Some(case) = plan.cases.get(u.case as usize) else {
            continue;
        };
        let path = bundle.case_result(&case.case_dir);
        if path.exists() {
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| ControlError::write(dir, e))?;
        }
        let result = CaseResult {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            case_id: case.case_id.clone(),
            case_dir: case.case_dir.clone(),
            state: CaseState::Failed,
            attempts: u.attempts,
            actor_status: None,
            exit_code: None,
            evaluation_configured: false,
            verdict: None,
            cleanup_confirmed: false,
            failure: Some(u.failure.clone()),
            collect_failure: None,
            adopted: false,
            job_starts: None,
            scores: Default::default(),
            outputs: serde_json::Value::Null,
            simulated: false,
            memory_boost_mb: None,
            trace_ref: None,
            origin: None,
            runtime: Some(case.runtime_label().to_owned()),
        };
        write_json_atomic(&path, &result)?;
        wrote = true;
    }
    if wrote {
        write_batch_files(bundle, plan)?;
    }
    Ok(())
}
