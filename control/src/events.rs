//! What a runner reports while it drives a batch: [`DriveEvent`]s, received by an
//! [`Observer`] (the CLI draws them). Every step of a run reports here; none prints.

use casebatch_manifest::PlanHead;
use casebatch_proto::BatchStatus;

/// What a runner sees while it follows a batch; the CLI draws it.
#[derive(Debug)]
pub enum DriveEvent<'a> {
    /// The batch being followed; always the first event.
    Batch(&'a PlanHead),
    /// The batch was running already: this runner follows it.
    Reattached,
    /// The batch was running already: that run is superseded, and this one replaces it once
    /// it has ended.
    Superseding,
    /// This many finished cases get a new attempt.
    Requeued(usize),
    /// A new run of the batch's workflow started.
    Started {
        workflow_id: &'a str,
        cases: usize,
        concurrency: u32,
    },
    Status(&'a BatchStatus),
    /// The namespace lacks the `Casebatch*` search attributes: the batch runs without them.
    Unsearchable,
    /// No worker polls the batch's task queue: nothing will run until one does.
    NoWorker {
        task_queue: &'a str,
    },
    EngineUnreachable(&'a str),
    EngineBack,
    /// The embedded engine serves its Web UI at this address (`--ui`), while the run lasts.
    EngineUi(&'a str),
}

/// Receives [`DriveEvent`]s.
pub trait Observer {
    fn on(&mut self, event: DriveEvent<'_>);
}

/// An observer that ignores everything.
impl Observer for () {
    fn on(&mut self, _: DriveEvent<'_>) {}
}
