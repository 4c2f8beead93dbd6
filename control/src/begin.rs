//! Start or attach: what a runner does with the batch's workflow as it finds it. Follow the
//! running one, supersede it first, refuse, or start a new run from where the batch stands;
//! the choice is one pure function, [`decide`].

use casebatch_bundle::{Bundle, Event, append_jsonl};
use casebatch_manifest::Plan;

use crate::carry::carried;
use crate::error::{ControlError, Result};
use crate::events::{DriveEvent, Observer};
use crate::operate::supersede_and_wait;
use crate::options::DriveOptions;
use crate::requeue::Requeue;
use crate::start::start;
use crate::workflow::{Handle, Presence, presence};

/// What to do with the batch's workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begin {
    /// It runs: follow that run.
    Attach,
    /// It runs, and this run replaces it: supersede it, wait for its end, then start.
    Supersede,
    /// None runs: start a new run from what the last one (or the bundle) left.
    Start,
}

/// Where a runner stands once it has begun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begun {
    /// A run of the batch's workflow is going: follow it.
    Following,
    /// Every case was already terminal: nothing was started.
    AlreadyComplete,
}

/// Start, attach or refuse, from the workflow's (proven) presence and the run's options. A
/// running batch's finished cases cannot be queued again under it: that needs its end.
pub(crate) fn decide(presence: Presence, opts: &DriveOptions, batch_id: &str) -> Result<Begin> {
    match presence {
        Presence::Running if opts.supersede => Ok(Begin::Supersede),
        Presence::Running if opts.requeue != Requeue::None => Err(ControlError::StillRunning {
            batch_id: batch_id.to_string(),
            action: "rerun cases of",
        }),
        Presence::Running => Ok(Begin::Attach),
        Presence::Absent | Presence::Closed => Ok(Begin::Start),
    }
}

/// Finds the batch's workflow (refusing someone else's), then attaches to it or starts a run.
pub(crate) async fn begin(
    handle: &Handle,
    bundle: &Bundle,
    plan: &Plan,
    opts: &DriveOptions,
    observer: &mut dyn Observer,
) -> Result<Begun> {
    let found = presence(handle, bundle, plan).await?;
    let from = match decide(found, opts, &plan.batch_id)? {
        Begin::Attach => {
            observer.on(DriveEvent::Reattached);
            return Ok(Begun::Following);
        }
        Begin::Supersede => {
            observer.on(DriveEvent::Superseding);
            supersede_and_wait(handle, &plan.batch_id).await?;
            Presence::Closed
        }
        Begin::Start => found,
    };
    let mut carried = carried(handle, from, bundle, plan).await?;
    let mut requeued = Vec::new();
    if let Some(c) = carried.as_mut() {
        requeued = opts.requeue.apply(plan, &mut c.slots);
        if !requeued.is_empty() {
            observer.on(DriveEvent::Requeued(requeued.len()));
        }
        if c.slots.iter().all(|s| s.state.is_terminal()) {
            return Ok(Begun::AlreadyComplete);
        }
    }
    start(handle, bundle, plan, carried, opts, observer).await?;
    record_requeued(bundle, plan, &requeued);
    Ok(Begun::Following)
}

/// Says in the batch's timeline which finished cases were queued again, once the run that
/// re-runs them has started, for an operator reading what happened when. Evidence, not
/// state: the run goes on without it if it cannot be written (a full disk is the run's to
/// report, at its first record), as with the run's own start line.
fn record_requeued(bundle: &Bundle, plan: &Plan, requeued: &[u32]) {
    for &index in requeued {
        let Some(case) = plan.cases.get(index as usize) else {
            continue;
        };
        let event = Event {
            case_id: Some(case.case_id.clone()),
            ..Event::of_batch(
                Event::REQUEUED,
                "queued again after it finished (rerun or resume --retry-failed)".into(),
            )
        };
        if append_jsonl(&bundle.events(), &event).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(supersede: bool, requeue: Requeue) -> DriveOptions {
        DriveOptions {
            supersede,
            requeue,
            ..DriveOptions::default()
        }
    }

    #[test]
    fn a_running_batch_is_followed_unless_superseded() {
        let plain = opts(false, Requeue::None);
        assert_eq!(
            decide(Presence::Running, &plain, "b").unwrap(),
            Begin::Attach
        );
        for requeue in [Requeue::None, Requeue::Failed, Requeue::All] {
            let o = opts(true, requeue);
            assert_eq!(
                decide(Presence::Running, &o, "b").unwrap(),
                Begin::Supersede
            );
        }
    }

    #[test]
    fn rerunning_cases_of_a_running_batch_is_refused() {
        for requeue in [
            Requeue::Failed,
            Requeue::All,
            Requeue::Cases(vec!["a".into()]),
        ] {
            let err = decide(Presence::Running, &opts(false, requeue), "b").unwrap_err();
            assert!(
                matches!(
                    &err,
                    ControlError::StillRunning { batch_id, action: "rerun cases of" }
                        if batch_id == "b"
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn an_absent_or_closed_workflow_gets_a_new_run() {
        for presence in [Presence::Absent, Presence::Closed] {
            for o in [
                opts(false, Requeue::None),
                opts(false, Requeue::All),
                opts(true, Requeue::Failed),
            ] {
                assert_eq!(decide(presence, &o, "b").unwrap(), Begin::Start);
            }
        }
    }
}
