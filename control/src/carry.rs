//! Where a new run of a batch starts from: the last run's result when the engine has one,
//! else the bundle's per-case records.

use casebatch_bundle::{Bundle, CaseResult, case_usage, read_json_if_present};
use casebatch_manifest::Plan;
use casebatch_proto::{Carried, CaseSlot, CaseState, Spending};
use temporalio_client::WorkflowGetResultOptions;

use crate::error::Result;
use crate::workflow::{Handle, Presence};

/// The state a new run carries: from the closed run's result, else from the bundle (`None`:
/// nothing ran yet, every case is queued).
pub(crate) async fn carried(
    handle: &Handle,
    presence: Presence,
    bundle: &Bundle,
    plan: &Plan,
) -> Result<Option<Carried>> {
    let from_engine = match presence {
        Presence::Closed => from_result(handle).await,
        _ => None,
    };
    match from_engine {
        Some(c) => Ok(Some(c)),
        None => from_bundle(bundle, plan),
    }
}

/// The last run's result. A run that was terminated or failed left none; then the bundle's
/// per-case records say where the batch stands.
async fn from_result(handle: &Handle) -> Option<Carried> {
    let prev = handle
        .get_result(WorkflowGetResultOptions::default())
        .await
        .ok()?;
    Some(Carried {
        slots: prev.slots,
        counters: prev.status.counters,
        timeline: prev.status.timeline,
        paused: false,
        segment: prev.status.segment,
        // A resume runs at the plan's limit, not a live-set one.
        concurrency: None,
        // Carried on: the runner that ends the next run records any still missing.
        unrecorded: prev.status.unrecorded,
        spending: prev.status.spending,
        // Like the limit: a resume shares at the plan's priority and weight.
        share: None,
    })
}

/// Where the batch stands by its per-case records, when the engine has no result to carry
/// (a first run, a terminated run, a workflow the engine no longer remembers). A case with no
/// record is queued; one whose record cannot be read is an error: taking it for queued
/// would run a finished case again.
fn from_bundle(bundle: &Bundle, plan: &Plan) -> Result<Option<Carried>> {
    let mut any = false;
    let mut slots = Vec::with_capacity(plan.cases.len());
    let mut spending = Spending::default();
    for c in &plan.cases {
        let Some(r) = read_json_if_present::<CaseResult>(&bundle.case_result(&c.case_dir))? else {
            slots.push(CaseSlot::default());
            continue;
        };
        any = true;
        if let Some(usage) = case_usage(bundle, &c.case_dir)? {
            let finished = matches!(r.state, CaseState::Succeeded | CaseState::Failed);
            spending.record(&usage, finished);
        }
        let state = match r.state {
            CaseState::Succeeded => CaseState::Succeeded,
            CaseState::Failed => CaseState::Failed,
            CaseState::Cancelled => CaseState::Cancelled,
            _ => CaseState::Queued,
        };
        slots.push(CaseSlot {
            state,
            attempts: r.attempts,
        });
    }
    let spent = !spending.spent.is_empty();
    Ok(any.then(|| Carried {
        slots,
        spending: spent.then_some(spending),
        ..Carried::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ControlError;

    #[test]
    fn a_missing_record_is_queued_and_a_damaged_one_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let plan = crate::test_plan::two_cases(dir.path());
        let bundle = Bundle::at(dir.path().join("t"));
        assert!(from_bundle(&bundle, &plan).unwrap().is_none());
        let path = bundle.case_result(&plan.cases[1].case_dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"{\"schema_version\": \"casebatch_v1\", \"sta").unwrap();
        let err = from_bundle(&bundle, &plan).unwrap_err();
        assert!(matches!(err, ControlError::BundleUnreadable(_)), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}
