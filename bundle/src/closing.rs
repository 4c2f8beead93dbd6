//! What closing an attempt writes: the attempt's record (its journal's `record` line) and,
//! for the attempt that counts, the case's result (`cases/<dir>/result.json`). Built here
//! from what the stages learnt; the activity that closes the attempt only gathers it.

use casebatch_attempt::harness::HarnessResult;
use casebatch_attempt::{
    AttemptRecord, CleanupReceipt, EvaluationRecord, RECORD_SCHEMA_VERSION, StageTiming,
};
use casebatch_manifest::model::{PlannedCase, RuntimeKind};
use casebatch_proto::AttemptSummary;
use casebatch_proto::CaseState;

use crate::records::{CaseResult, Lineage, Origin};
use crate::{Bundle, read_json};

/// The record of `summary`'s attempt of `case`, cleaned up as `receipt` says, with the
/// timings of its stages.
pub fn attempt_record(
    case: &PlannedCase,
    summary: &AttemptSummary,
    receipt: &CleanupReceipt,
    will_retry: bool,
    stages: Vec<StageTiming>,
) -> AttemptRecord {
    AttemptRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        case_id: case.case_id.clone(),
        summary: summary.clone(),
        cleanup_confirmed: receipt.cleanup_confirmed,
        will_retry,
        runtime: case.runtime.as_str().into(),
        runtime_name: case.runtime_name.clone(),
        held_job: receipt.held_job,
        stages,
    }
}

/// What an attempt left beyond its summary, for the case's result.
#[derive(Debug, Default)]
pub struct Harvest {
    /// Processes its runtime started for its job (`Executor::job_starts`).
    pub job_starts: Option<u32>,
    /// The harness's result file, as far as the engine reads it.
    pub harness: HarnessResult,
    /// The evaluator's record, whose scores join the harness's.
    pub evaluation: Option<EvaluationRecord>,
}

/// The result of `case` after the attempt of `summary` closed in state `state`.
pub fn case_result(
    bundle: &Bundle,
    case: &PlannedCase,
    summary: &AttemptSummary,
    state: CaseState,
    cleanup_confirmed: bool,
    harvest: Harvest,
) -> CaseResult {
    let Harvest {
        job_starts,
        harness,
        evaluation,
    } = harvest;
    let mut scores = harness.scores;
    if let Some(e) = evaluation {
        scores.extend(e.scores);
    }
    let s = summary;
    CaseResult {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        case_id: case.case_id.clone(),
        case_dir: case.case_dir.clone(),
        state,
        attempts: s.attempt,
        actor_status: s.actor,
        exit_code: s.exit_code,
        evaluation_configured: s.evaluation_configured,
        verdict: s.verdict,
        cleanup_confirmed,
        // A failed trace pull is what keeps an otherwise verified case from passing.
        failure: s.failure.clone().or_else(|| s.collect_failure.clone()),
        collect_failure: s.collect_failure.clone(),
        adopted: s.adopted,
        job_starts,
        scores,
        trace_ref: harness.trace,
        outputs: harness.outputs,
        simulated: case.runtime == RuntimeKind::Fake,
        memory_boost_mb: s.memory_boost_mb,
        origin: read_json::<Lineage>(&bundle.lineage())
            .ok()
            .map(|l| Origin {
                retry_of: l.retry_of,
                carried: false,
                recollected: false,
            }),
        runtime: Some(case.runtime_label().to_owned()),
    }
}
