//! How the stages' results become the attempt's summary: activity errors classified by the
//! failure taxonomy, and the one decision of what comes next.

use casebatch_proto::{
    ActorStatus, AttemptKey, AttemptSummary, Failure, FailureClass, FailureCode, Settled, Stage,
};
use temporalio_common::protos::temporal::api::failure::v1::{
    Failure as ProtoFailure, failure::FailureInfo,
};
use temporalio_sdk::{ActivityExecutionError, WorkflowCancellationToken};

use crate::decide::{self, Next, Spent};

/// An activity that failed instead of returning an outcome. A casebatch failure type
/// (`casebatch.<class>`) carries its classified [`Failure`] as details; anything else is the
/// platform's fault.
pub(super) fn activity_failure(stage: Stage, err: &ActivityExecutionError) -> Failure {
    match err.failure().and_then(casebatch_failure) {
        Some(raised) => raised.into_failure(stage),
        None => Failure::infra(stage, FailureCode::ActivityError, err.to_string()),
    }
}

/// A casebatch-typed application failure as the workflow received it.
pub(super) struct Raised<'a> {
    class: FailureClass,
    non_retryable: bool,
    message: &'a str,
    details: Option<Failure>,
}

impl Raised<'_> {
    fn into_failure(self, stage: Stage) -> Failure {
        // The activity classified it where it was born, stage included.
        if let Some(f) = self.details {
            return f;
        }
        // Histories recorded before failures carried details spell the code into the message.
        let (code, message) = match self.message.split_once(": ") {
            Some((code, message)) => (FailureCode::parse(code), message),
            None => (FailureCode::ActivityError, self.message),
        };
        Failure::new(stage, self.class, code, message, !self.non_retryable)
    }
}

/// The first casebatch-typed application failure in a failure chain (local activities raise
/// it at the top; full activities wrap it in an activity failure).
pub(super) fn casebatch_failure(f: &ProtoFailure) -> Option<Raised<'_>> {
    match &f.failure_info {
        Some(FailureInfo::ApplicationFailureInfo(info)) => {
            let class = FailureClass::from_temporal_type(&info.r#type)?;
            let details = info
                .details
                .as_ref()
                .and_then(|d| d.payloads.first())
                .and_then(|p| serde_json::from_slice::<Failure>(&p.data).ok());
            Some(Raised {
                class,
                non_retryable: info.non_retryable,
                message: f.message.as_str(),
                details,
            })
        }
        _ => f.cause.as_deref().and_then(casebatch_failure),
    }
}

/// Folds `settle`'s report into the summary.
pub(super) fn apply_settled(s: &mut AttemptSummary, key: &AttemptKey, settled: &Settled) {
    // Regular activities resolve from history, so a result always belongs to the attempt
    // that scheduled it. If that ever broke, failing this workflow task loudly beats giving
    // one case another case's result.
    assert_eq!(
        (settled.key.case_index, settled.key.attempt),
        (key.case_index, key.attempt),
        "settle result of another attempt delivered to case {} attempt {}",
        key.case_index,
        key.attempt
    );
    s.apply_settled(settled);
}

/// The job's host never came back (or the job never reported): nothing is adoptable, so the
/// case is re-dispatched.
pub(super) fn mark_job_lost(s: &mut AttemptSummary, err: &ActivityExecutionError) {
    s.actor = Some(ActorStatus::Failed);
    s.failure = Some(Failure::infra(
        Stage::Await,
        FailureCode::JobLost,
        format!("no worker could await the job: {err}"),
    ));
}

/// The attempt's outcome and what comes next. Whatever the job reported after a batch cancel
/// is the cancel's doing.
pub(super) fn decide_attempt(
    s: &mut AttemptSummary,
    cancel: &WorkflowCancellationToken,
    policy: decide::Policy,
    spent: Spent,
) -> Next {
    let cancelled = cancel.is_cancelled();
    if cancelled && s.actor != Some(ActorStatus::Finished) {
        s.actor = Some(ActorStatus::Cancelled);
        s.failure = None;
    }
    decide::next(s, cancelled, policy, spent)
}

pub(super) fn summary_cleanup_ok(s: &AttemptSummary) -> bool {
    s.cleanup_confirmed != Some(false)
}

pub(super) fn is_timeout(err: &ActivityExecutionError) -> bool {
    err.as_timeout().is_some()
}

/// Records an unexpected activity error; a cancel is not a failure.
pub(super) fn mark_error(
    s: &mut AttemptSummary,
    cancel: &WorkflowCancellationToken,
    stage: Stage,
    err: &ActivityExecutionError,
) {
    if cancel.is_cancelled() || matches!(err, ActivityExecutionError::Cancelled(_)) {
        s.actor = Some(ActorStatus::Cancelled);
    } else {
        s.actor.get_or_insert(ActorStatus::Failed);
        s.failure = Some(activity_failure(stage, err));
    }
}
