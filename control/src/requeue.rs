//! Which finished cases of a batch get a new attempt (rerun, resume --retry-failed).

use casebatch_manifest::Plan;
use casebatch_proto::{CaseSlot, CaseState};

/// Which finished cases get a new attempt; their earlier attempts stay in the bundle.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// None: a plain resume runs only unfinished cases.
    #[default]
    None,
    /// Failed and cancelled cases.
    Failed,
    /// These case ids.
    Cases(Vec<String>),
    /// Every case.
    All,
}

impl Requeue {
    /// Queues the chosen terminal cases again; returns how many.
    pub(crate) fn apply(&self, plan: &Plan, slots: &mut [CaseSlot]) -> usize {
        let mut n = 0;
        for (case, slot) in plan.cases.iter().zip(slots.iter_mut()) {
            let pick = match self {
                Requeue::None => false,
                Requeue::Failed => matches!(slot.state, CaseState::Failed | CaseState::Cancelled),
                Requeue::Cases(ids) => ids.contains(&case.case_id),
                Requeue::All => true,
            };
            if pick && slot.state.is_terminal() {
                slot.state = CaseState::Queued;
                n += 1;
            }
        }
        n
    }

    /// The first named case the plan does not have.
    pub(crate) fn unknown_case<'a>(&'a self, plan: &Plan) -> Option<&'a str> {
        let Requeue::Cases(ids) = self else {
            return None;
        };
        ids.iter()
            .find(|id| !plan.cases.iter().any(|c| &c.case_id == *id))
            .map(String::as_str)
    }
}
