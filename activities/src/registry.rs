//! The activities a worker registers: each stage contract of `casebatch_workflows::contracts`
//! and where it is carried out (`case/` for a case's stages, `batch.rs` for the batch's).

use std::sync::Arc;

use casebatch_proto::pace::PaceAsk;
use casebatch_proto::share::{AskSlotInput, HeldSlot, SlotAnswer};
use casebatch_proto::{
    ActorReport, AttemptKey, AwaitInput, CleanupInput, CleanupReport, Evaluation, Failure,
    FinalizeInput, Prepared, ReleaseInput, SettleInput, Settled, StageResult, StartInput,
    StartResult, SubmitResult, SweepInput, SweepReport,
};
use casebatch_workflows::contracts;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

use crate::case::context::CaseActivities;

#[activities]
impl CaseActivities {
    /// An attempt's provision and submit (`case/start.rs`); a short job is settled here too.
    #[activity(definition = contracts::Start)]
    pub async fn start(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: StartInput,
    ) -> Result<StartResult, ActivityError> {
        self.start_attempt(ctx, input).await
    }

    /// An attempt's wait for its job, its evaluation and collection (`case/settle.rs`).
    #[activity(definition = contracts::Settle)]
    pub async fn settle(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: SettleInput,
    ) -> Result<Settled, ActivityError> {
        self.settle_attempt(ctx, input).await
    }

    /// Provisions an attempt's environment while other cases run (`prepare_ahead`) and marks
    /// it prepared. A failure is reported, not raised: the attempt's `start` provisions again
    /// and fails as provision failures always do (`case/ahead.rs`).
    #[activity(definition = contracts::Prepare)]
    pub async fn prepare(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Prepared, ActivityError> {
        self.prepare_ahead(ctx, key).await
    }

    /// Cleans up an environment provisioned ahead for an attempt that will not start in this
    /// run: the runtime's cleanup, its receipt kept under the case's `released/`, and the
    /// attempt's directory removed once confirmed, so the attempt starts fresh when the case
    /// runs. Nothing is recorded as an attempt (`case/ahead.rs`).
    #[activity(definition = contracts::Release)]
    pub async fn release(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: ReleaseInput,
    ) -> Result<CleanupReport, ActivityError> {
        self.release_unused(ctx, input).await
    }

    /// The end of every attempt: kill, receipt, record, the case's result (`case/cleanup.rs`).
    #[activity(definition = contracts::Cleanup)]
    pub async fn cleanup(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: CleanupInput,
    ) -> Result<CleanupReport, ActivityError> {
        self.cleanup_attempt(ctx, input).await
    }

    /// Books one case start on the batch's shared pace (`rate_key`).
    #[activity(definition = contracts::ReserveStart)]
    pub async fn reserve_start(
        self: Arc<Self>,
        ctx: ActivityContext,
        ask: PaceAsk,
    ) -> Result<u64, ActivityError> {
        self.reserve_start_on_pace(ctx, ask).await
    }

    /// A case's ask for a slot on a shared runtime (`slots.rs`).
    #[activity(definition = contracts::AskSlot)]
    pub async fn ask_slot(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: AskSlotInput,
    ) -> Result<SlotAnswer, ActivityError> {
        self.ask_slot_for_case(ctx, input).await
    }

    /// A batch's return of a slot on a shared runtime (`slots.rs`).
    #[activity(definition = contracts::ReturnSlot)]
    pub async fn return_slot(
        self: Arc<Self>,
        ctx: ActivityContext,
        slot: HeldSlot,
    ) -> Result<(), ActivityError> {
        self.return_slot_of_case(ctx, slot).await
    }

    /// How many cases wait for each of these shared runtimes' slots (`slots.rs`).
    #[activity(definition = contracts::SlotsWaiting)]
    pub async fn slots_waiting(
        self: Arc<Self>,
        ctx: ActivityContext,
        keys: Vec<String>,
    ) -> Result<Vec<u32>, ActivityError> {
        self.slots_waiting_on(ctx, keys).await
    }

    /// Which batch runs holding a shared runtime's slots have closed (`slots.rs`).
    #[activity(definition = contracts::ClosedRuns)]
    pub async fn closed_runs(
        self: Arc<Self>,
        ctx: ActivityContext,
        runs: Vec<(String, String)>,
    ) -> Result<Vec<(String, String)>, ActivityError> {
        self.closed_batch_runs(ctx, runs).await
    }

    /// `supersede`'s force-kill: every agent of the plan kills the batch's jobs at once. The
    /// cases' own cancel and cleanup still run after it (and stop local processes, which
    /// live with a worker); this only makes sure no job keeps burning compute meanwhile.
    #[activity(definition = contracts::Sweep)]
    pub async fn sweep(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: SweepInput,
    ) -> Result<SweepReport, ActivityError> {
        self.sweep_batch(ctx, input).await
    }

    /// The closing write of the batch files (`batch_results.json`, the summary, ...).
    #[activity(definition = contracts::Finalize)]
    pub async fn finalize(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: FinalizeInput,
    ) -> Result<bool, ActivityError> {
        self.finalize_batch(ctx, input).await
    }

    // The single stages of the local-activity pipeline (`case/legacy.rs`).

    #[activity(definition = contracts::Provision)]
    pub async fn provision(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<StageResult, ActivityError> {
        self.provision_alone(ctx, key).await
    }

    #[activity(definition = contracts::Submit)]
    pub async fn submit(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<SubmitResult, ActivityError> {
        self.submit_alone(ctx, key).await
    }

    #[activity(definition = contracts::AwaitJob)]
    pub async fn await_job(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: AwaitInput,
    ) -> Result<ActorReport, ActivityError> {
        self.await_alone(ctx, input).await
    }

    #[activity(definition = contracts::Evaluate)]
    pub async fn evaluate(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Evaluation, ActivityError> {
        self.evaluate_alone(ctx, key).await
    }

    #[activity(definition = contracts::Collect)]
    pub async fn collect(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Option<Failure>, ActivityError> {
        self.collect_alone(ctx, key).await
    }
}
