//! Which finished cases of a batch get a new attempt (rerun, resume --retry-failed).

use casebatch_manifest::Plan;
use casebatch_manifest::model::PlannedCase;
use casebatch_proto::{CaseSlot, CaseState};

/// Which finished cases get a new attempt; their earlier attempts stay in the bundle.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// None: a plain resume runs only unfinished cases.
    #[default]
    None,
    /// Failed and cancelled cases.
    Failed,
    /// The cases these names select: a task id selects every run of the task (with epochs,
    /// `TASK#1`, `TASK#2`, ...), a case id one case.
    Cases(Vec<String>),
    /// Every case.
    All,
}

/// What `--case NAME` selects: the case of that id, or every run of the task of that id.
fn names(case: &PlannedCase, name: &str) -> bool {
    case.case_id == name || case.epoch.as_ref().is_some_and(|e| e.task_id == name)
}

impl Requeue {
    /// Queues the chosen terminal cases again; returns their indices.
    pub(crate) fn apply(&self, plan: &Plan, slots: &mut [CaseSlot]) -> Vec<u32> {
        let mut queued = Vec::new();
        for (case, slot) in plan.cases.iter().zip(slots.iter_mut()) {
            let pick = match self {
                Requeue::None => false,
                Requeue::Failed => matches!(slot.state, CaseState::Failed | CaseState::Cancelled),
                Requeue::Cases(ids) => ids.iter().any(|id| names(case, id)),
                Requeue::All => true,
            };
            if pick && slot.state.is_terminal() {
                slot.state = CaseState::Queued;
                queued.push(case.index);
            }
        }
        queued
    }

    /// The first name that selects no case of the plan.
    pub(crate) fn unknown_case<'a>(&'a self, plan: &Plan) -> Option<&'a str> {
        let Requeue::Cases(ids) = self else {
            return None;
        };
        ids.iter()
            .find(|id| !plan.cases.iter().any(|c| names(c, id)))
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 58: `rerun --case TASK` of an epochs batch was refused ("use one of its task
    /// ids") although TASK is the task id; only `TASK#1` worked.
    #[test]
    fn a_task_id_selects_every_run_and_a_case_id_one() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("m.yaml");
        std::fs::write(
            &manifest,
            "batch_id: t\ndefaults:\n  runtime: fake\n  epochs: 3\ntasks:\n  - task_id: \
             Amazon--5\n  - task_id: other\n    epochs: 1\n",
        )
        .unwrap();
        let plan = casebatch_manifest::load_plan(&manifest, &Default::default()).unwrap();
        let ids: Vec<&str> = plan.cases.iter().map(|c| c.case_id.as_str()).collect();
        assert_eq!(ids, ["Amazon--5#1", "Amazon--5#2", "Amazon--5#3", "other"]);
        let finished = || {
            vec![
                CaseSlot {
                    state: CaseState::Succeeded,
                    attempts: 1,
                };
                4
            ]
        };

        let task = Requeue::Cases(vec!["Amazon--5".into()]);
        assert_eq!(task.unknown_case(&plan), None);
        assert_eq!(task.apply(&plan, &mut finished()), vec![0, 1, 2]);

        let one = Requeue::Cases(vec!["Amazon--5#2".into(), "other".into()]);
        assert_eq!(one.unknown_case(&plan), None);
        assert_eq!(one.apply(&plan, &mut finished()), vec![1, 3]);

        let neither = Requeue::Cases(vec!["Amazon--5#4".into()]);
        assert_eq!(neither.unknown_case(&plan), Some("Amazon--5#4"));
    }
}
