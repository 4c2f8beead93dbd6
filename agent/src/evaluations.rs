//! Evaluate's bookkeeping: at most one evaluator run per job at a time, and cleanup's stop of
//! a running one. The record itself lives in the job table (`Jobs::evaluate`).
//!
//! ```text
//! Evaluate ── recorded? ─yes─► the record
//!    │ no (ended, not cleaned up)
//!    ▼
//!  begin(key): closed ─► refused · running ─► wait for its record · else run it:
//!    task: LocalProcess::evaluate (in the job's cgroup) → table (the first record stands)
//!          → finish: watchers get it, the slot goes
//! Cleanup ── close(key): no evaluator starts any more, a running one is told to stop and
//!            waited for; only then the cgroup kill and the receipt, so no evaluator can
//!            join the cgroup after the kill.
//! ```

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use casebatch_attempt::EvaluationRecord;
use tokio::sync::watch;

/// The end of a run: its record, or `None` when it ended without one.
type Done = watch::Receiver<Option<EvaluationRecord>>;

type Slots = Arc<Mutex<HashMap<String, Slot>>>;

#[derive(Default)]
pub(crate) struct Evaluations {
    slots: Slots,
}

#[derive(Default)]
struct Slot {
    /// Cleanup has begun: no evaluator may start for the job.
    closed: bool,
    running: Option<(Arc<AtomicBool>, Done)>,
}

pub(crate) enum Begin {
    /// Nothing runs: the caller runs the evaluator and reports the end through [`Run`].
    Run(Run),
    /// A run is under way: wait for its end (the sender goes when it ends without a record).
    Wait(Done),
    /// Cleanup has begun.
    Closed,
}

/// The one run of a job's evaluator; dropping it ends the run (with no record, unless
/// [`Run::finish`] gave one).
pub(crate) struct Run {
    key: String,
    /// Set by cleanup: the evaluator is to be killed.
    pub(crate) stop: Arc<AtomicBool>,
    tx: watch::Sender<Option<EvaluationRecord>>,
    slots: Slots,
}

fn lock(slots: &Slots) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
    slots.lock().unwrap_or_else(|p| p.into_inner())
}

impl Evaluations {
    pub(crate) fn begin(&self, key: &str) -> Begin {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(key.to_string()).or_default();
        if slot.closed {
            return Begin::Closed;
        }
        if let Some((_, done)) = &slot.running {
            return Begin::Wait(done.clone());
        }
        let (tx, done) = watch::channel(None);
        let stop = Arc::new(AtomicBool::new(false));
        slot.running = Some((stop.clone(), done));
        Begin::Run(Run {
            key: key.to_string(),
            stop,
            tx,
            slots: self.slots.clone(),
        })
    }

    /// Cleanup begins: nothing starts for `key` any more, and a running evaluator is told to
    /// stop. Returns its end, to wait for before the cgroup is killed.
    pub(crate) fn close(&self, key: &str) -> Option<Done> {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(key.to_string()).or_default();
        slot.closed = true;
        slot.running.as_ref().map(|(stop, done)| {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            done.clone()
        })
    }

    /// Cleanup is recorded in the table, which refuses evaluations from now on.
    pub(crate) fn forget(&self, key: &str) {
        let mut slots = lock(&self.slots);
        if slots.get(key).is_some_and(|s| s.running.is_none()) {
            slots.remove(key);
        }
    }
}

impl Run {
    /// The run ended with `record`, written to the table before: waiters get it.
    pub(crate) fn finish(self, record: EvaluationRecord) {
        self.tx.send_replace(Some(record));
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let mut slots = lock(&self.slots);
        let closed = slots.get(&self.key).is_some_and(|s| s.closed);
        if closed {
            if let Some(slot) = slots.get_mut(&self.key) {
                slot.running = None;
            }
        } else {
            slots.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_run_at_a_time_and_none_after_close() {
        let e = Evaluations::default();
        let Begin::Run(run) = e.begin("b/0/1") else {
            panic!("the first call runs it");
        };
        let Begin::Wait(mut done) = e.begin("b/0/1") else {
            panic!("a second call waits");
        };
        run.finish(EvaluationRecord::not_configured());
        assert!(done.borrow_and_update().is_some());
        assert!(
            matches!(e.begin("b/0/1"), Begin::Run(_)),
            "the slot is free again"
        );

        let Begin::Run(run) = e.begin("b/0/2") else {
            panic!("runs");
        };
        let stop = run.stop.clone();
        assert!(
            e.close("b/0/2").is_some(),
            "cleanup waits for the running one"
        );
        assert!(
            stop.load(std::sync::atomic::Ordering::SeqCst),
            "and stops it"
        );
        drop(run);
        assert!(matches!(e.begin("b/0/2"), Begin::Closed));
        assert!(e.close("b/0/3").is_none(), "nothing to wait for");
        assert!(matches!(e.begin("b/0/3"), Begin::Closed));
        e.forget("b/0/3");
        assert!(lock(&e.slots).get("b/0/3").is_none());
    }
}
