//! The stage activities as typed contracts: name, input and output.
//!
//! Declared here (not in `casebatch-activities`) so workflow code never links the code that
//! does I/O. The activities crate implements each with `#[activity(definition = ...)]`.
//!
//! Current batches run each attempt as three regular activities: [`Start`], [`Settle`],
//! [`Cleanup`]. The six single-stage contracts ([`Provision`] … [`Collect`]) are what batches
//! started before that change still call as local activities; workers keep serving them
//! until no such batch can be running.

use casebatch_proto::pace::PaceAsk;
use casebatch_proto::share::{AskSlotInput, HeldSlot, SlotAnswer};
use casebatch_proto::{
    ActorReport, AttemptKey, AwaitInput, CleanupInput, CleanupReport, Evaluation, Failure,
    FinalizeInput, Prepared, ReleaseInput, SettleInput, Settled, StageResult, StartInput,
    StartResult, SubmitResult, SweepInput, SweepReport,
};
use temporalio_common::ActivityDefinition;

macro_rules! contract {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $input:ty => $output:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $ty;

        impl ActivityDefinition for $ty {
            type Input = $input;
            type Output = $output;

            fn name(&self) -> &str {
                $name
            }
        }
    };
}

contract!(
    /// Provision the attempt's environment and start its job (or find the job already
    /// started for this attempt); for a short job, wait for it and settle it too
    /// ([`casebatch_proto::SettleShort`]). Runs on any worker of the shared task queue.
    Start, "casebatch.start", StartInput => StartResult
);
contract!(
    /// Wait for the job to end, heartbeating its reference (a retry adopts the job), then
    /// run the evaluator and pull the trace: everything that needs the attempt's host.
    Settle, "casebatch.settle", SettleInput => Settled
);
contract!(
    /// Provision the attempt's environment ahead of need (`prepare_ahead`), marking it
    /// prepared: the attempt's `start` then only submits. Runs on any worker.
    Prepare, "casebatch.prepare", AttemptKey => Prepared
);
contract!(
    /// Clean up an environment provisioned ahead for an attempt that will not start in this
    /// run, with a receipt; no attempt is recorded. Runs where it was provisioned.
    Release, "casebatch.release", ReleaseInput => CleanupReport
);
contract!(
    /// Prepare a fresh environment for the attempt (working and evidence directories).
    Provision, "casebatch.provision", AttemptKey => StageResult
);
contract!(
    /// Start the attempt's job, or find the one already started for this attempt.
    Submit, "casebatch.submit", AttemptKey => SubmitResult
);
contract!(
    /// Wait for the job to end, heartbeating its reference; a retry re-attaches (adoption).
    AwaitJob, "casebatch.await", AwaitInput => ActorReport
);
contract!(
    /// Run the evaluator, which observes the actor's effect and writes a verdict.
    Evaluate, "casebatch.evaluate", AttemptKey => Evaluation
);
contract!(
    /// Collect the attempt's trace; a failure keeps the work and is reported apart.
    Collect, "casebatch.collect", AttemptKey => Option<Failure>
);
contract!(
    /// Stop every process of the attempt, confirm they are gone, write the receipt and the
    /// attempt record.
    Cleanup, "casebatch.cleanup", CleanupInput => CleanupReport
);
contract!(
    /// Write the batch-level files of the bundle (results, attempts, summary).
    Finalize, "casebatch.finalize", FinalizeInput => bool
);
contract!(
    /// Kill every job of the batch on every runtime of its plan that can kill by batch (the
    /// agents), without waiting for each case's own cancel: `supersede`'s force-kill.
    Sweep, "casebatch.sweep", SweepInput => SweepReport
);
contract!(
    /// Book one case start on a shared pace (`rate_key`): the `RatePacer` workflow of the key
    /// answers when it may go (µs since the epoch), started by the ask if none runs.
    ReserveStart, "casebatch.reserve_start", PaceAsk => u64
);
contract!(
    /// Ask for a slot on a shared runtime (an agent): the `RuntimeSlots` workflow of the
    /// runtime answers, started by the ask if none runs. Runs on any worker.
    AskSlot, "casebatch.ask_slot", AskSlotInput => SlotAnswer
);
contract!(
    /// Give a slot on a shared runtime back (or withdraw its wait): from an activity, so
    /// the batch's workflow never signals the slots that signal it. Runs on any worker.
    ReturnSlot, "casebatch.return_slot", HeldSlot => ()
);
contract!(
    /// How many cases of every batch wait for each of these shared runtimes' slots (by
    /// slots key; 0 where no slots workflow runs): a new batch with a `queue_limit` asks
    /// before it admits a case. Runs on any worker.
    SlotsWaiting, "casebatch.slots_waiting", Vec<String> => Vec<u32>
);
contract!(
    /// Which of these batch runs (workflow id, run id) have closed: a runtime's slots
    /// workflow frees what they held without giving it back.
    ClosedRuns, "casebatch.closed_runs", Vec<(String, String)> => Vec<(String, String)>
);

/// The signals between a batch and a shared runtime's slots, typed here (not by the two
/// workflows' macros) so each side names the other's signal without importing its workflow.
pub mod slot_signals {
    use casebatch_proto::share::{SLOT_GRANTED, SLOT_RETURN, Ticket};
    use temporalio_common::{SignalDefinition, WorkflowDefinition};

    /// A batch, as the slots workflow addresses it.
    pub struct Batch;
    /// A runtime's slots, as a batch addresses them.
    pub struct Slots;
    /// Slots → batch: this ticket holds a slot now.
    pub struct SlotGranted;
    /// Batch → slots: this ticket's slot is given back, or its wait withdrawn.
    pub struct SlotReturn;

    impl WorkflowDefinition for Batch {
        type Input = serde_json::Value;
        type Output = serde_json::Value;
        fn name(&self) -> &str {
            "BatchWorkflow"
        }
    }

    impl WorkflowDefinition for Slots {
        type Input = serde_json::Value;
        type Output = serde_json::Value;
        fn name(&self) -> &str {
            "RuntimeSlots"
        }
    }

    impl SignalDefinition for SlotGranted {
        type Workflow = Batch;
        type Input = Ticket;
        fn name(&self) -> &str {
            SLOT_GRANTED
        }
    }

    impl SignalDefinition for SlotReturn {
        type Workflow = Slots;
        type Input = Ticket;
        fn name(&self) -> &str {
            SLOT_RETURN
        }
    }
}
