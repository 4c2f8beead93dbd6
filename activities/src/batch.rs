//! The activities of a batch as a whole, not of one case: booking a start on a shared pace,
//! `supersede`'s sweep of the batch's jobs, and the closing write of the batch files.

use std::sync::Arc;

use casebatch_bundle::{Bundle, Event, append_jsonl, now_ms, write_final_batch_files};
use casebatch_proto::pace::PaceAsk;
use casebatch_proto::share::{AskSlotInput, HeldSlot, SlotAnswer};
use casebatch_proto::{FinalizeInput, SweepInput, SweepReport};
use temporalio_sdk::ApplicationFailure;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

use crate::beats::StageContext;
use crate::case::context::{CaseActivities, heartbeating, unreadable_plan};

impl CaseActivities {
    pub(crate) async fn reserve_start_on_pace(
        self: Arc<Self>,
        ctx: ActivityContext,
        ask: PaceAsk,
    ) -> Result<u64, ActivityError> {
        // Counted as an action; the ask is short and sends no heartbeat.
        let _ctx = StageContext::new(ctx, &self.metrics);
        let client = self.shared_client("the shared paces")?;
        crate::pacers::reserve(client, ask)
            .await
            .map_err(unanswered)
    }

    /// The client for the namespace's shared workflows (`what`, for the error).
    fn shared_client(&self, what: &str) -> Result<&temporalio_client::Client, ActivityError> {
        (self.client.as_ref())
            .ok_or_else(|| unanswered(format!("this worker has no client for {what}")))
    }

    /// A case's ask for a slot on a shared runtime, with the runtime's capacity as this
    /// worker last learned it from the agent.
    pub(crate) async fn ask_slot_for_case(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: AskSlotInput,
    ) -> Result<SlotAnswer, ActivityError> {
        let _ctx = StageContext::new(ctx, &self.metrics);
        let client = self.shared_client("shared runtimes")?;
        let mut ask = input.ask;
        let key = ask.runtime.key.clone();
        self.asked.now(&key);
        ask.capacity = match self.capacities.fresh(&key) {
            Some(n) => Some(n),
            None => {
                self.learn_capacity(&input.bundle_dir, &ask.runtime.name, &key)
                    .await
            }
        };
        crate::slots::ask(client, ask).await.map_err(unanswered)
    }

    /// The agent's capacity, asked of it (`None` when it cannot be: the slots keep the last
    /// they knew).
    async fn learn_capacity(&self, bundle_dir: &str, name: &str, key: &str) -> Option<u32> {
        let plan = self.plan(bundle_dir).ok()?;
        let spec = plan.plan().runtimes.get(name)?.clone();
        match self.runtimes.agent_capacity(name, &spec).await {
            Ok(n) => {
                self.capacities.learned(key, n);
                Some(n)
            }
            Err(why) => {
                tracing::warn!(
                    runtime = name,
                    "the agent's capacity could not be read: {why}"
                );
                None
            }
        }
    }

    /// Gives a shared runtime's slot back as its job ends, without holding up the caller; the
    /// handle tells whether the slots have it (a return that did not arrive is made again by
    /// the batch as the attempt closes).
    pub(crate) fn give_slot_back(&self, slot: HeldSlot) -> tokio::task::JoinHandle<bool> {
        let client = self.client.clone();
        tokio::spawn(async move {
            match client {
                Some(client) => crate::slots::give_back(&client, slot).await.is_ok(),
                None => false,
            }
        })
    }

    /// The batch's return of a slot its `settle` did not give back (or of a wait withdrawn):
    /// an error, retried by the engine, until the slots have it.
    pub(crate) async fn return_slot_of_case(
        self: Arc<Self>,
        ctx: ActivityContext,
        slot: HeldSlot,
    ) -> Result<(), ActivityError> {
        if ctx.info().attempt <= 1 {
            self.record_slot_wait(&slot);
        }
        let _ctx = StageContext::new(ctx, &self.metrics);
        let client = self.shared_client("shared runtimes")?;
        crate::slots::give_back(client, slot)
            .await
            .map_err(unanswered)
    }

    /// Records how long the slot's case waited for it, if the slot carries its wait (the
    /// first activity to get the slot: `settle`, else the batch's return of it).
    pub(crate) fn record_slot_wait(&self, slot: &HeldSlot) {
        if let Some(w) = &slot.wait {
            let waited = std::time::Duration::from_millis(w.waited_ms);
            self.metrics.slot_wait(&w.endpoint, w.priority, waited);
        }
    }

    /// How many cases wait for each of these shared runtimes' slots (0 where no slots
    /// workflow runs); an error, retried by the engine, when one cannot be read.
    pub(crate) async fn slots_waiting_on(
        self: Arc<Self>,
        ctx: ActivityContext,
        keys: Vec<String>,
    ) -> Result<Vec<u32>, ActivityError> {
        let _ctx = StageContext::new(ctx, &self.metrics);
        let client = self.shared_client("shared runtimes")?;
        let mut waiting = Vec::with_capacity(keys.len());
        for key in &keys {
            let view = crate::slots::read(client, key).await.map_err(unanswered)?;
            waiting.push(view.map_or(0, |v| v.waiting));
        }
        Ok(waiting)
    }

    /// Which batch runs holding slots have closed (for a shared runtime's slots).
    pub(crate) async fn closed_batch_runs(
        self: Arc<Self>,
        ctx: ActivityContext,
        runs: Vec<(String, String)>,
    ) -> Result<Vec<(String, String)>, ActivityError> {
        let _ctx = StageContext::new(ctx, &self.metrics);
        let Some(client) = &self.client else {
            return Ok(Vec::new());
        };
        Ok(crate::slots::closed(client, runs).await)
    }

    pub(crate) async fn sweep_batch(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: SweepInput,
    ) -> Result<SweepReport, ActivityError> {
        // Counted as an action; the sweep is short and sends no heartbeat.
        let _ctx = StageContext::new(ctx, &self.metrics);
        // The whole plan, for the sandboxes of its cases: a supersede is rare.
        let plan = Bundle::at(&input.bundle_dir)
            .read_plan()
            .map_err(unreadable_plan)?;
        let swept = self
            .runtimes
            .kill_batch(&plan, &input.batch_id, &input.bundle_dir)
            .await;
        let (report, places) = (
            SweepReport {
                killed: swept.killed,
                unreachable: swept.unreachable,
            },
            swept.places,
        );
        let message = format!(
            "superseded: {} job(s) killed on {}{}",
            report.killed.len(),
            if places.is_empty() {
                "no runtime (nothing to sweep)".to_string()
            } else {
                places.join(" and ")
            },
            if report.unreachable.is_empty() {
                String::new()
            } else {
                format!("; not reached: {}", report.unreachable.join("; "))
            }
        );
        let _ = append_jsonl(
            &Bundle::at(&input.bundle_dir).events(),
            &Event {
                ts_ms: now_ms(),
                kind: "superseded".into(),
                case_id: None,
                attempt: None,
                message,
            },
        );
        Ok(report)
    }

    pub(crate) async fn finalize_batch(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: FinalizeInput,
    ) -> Result<bool, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        // Reading every case's records takes seconds on a large batch: off the async
        // threads, heartbeating meanwhile (as a regular activity; a local one does not).
        let write = tokio::task::spawn_blocking(move || -> Result<bool, ActivityError> {
            let bundle = Bundle::at(&input.bundle_dir);
            let plan = bundle.read_plan_head().map_err(unreadable_plan)?;
            write_final_batch_files(&bundle, &plan, input.status.counters.temporal_actions)?;
            append_jsonl(
                &bundle.events(),
                &Event::of_batch(
                    Event::RUN_ENDED,
                    serde_json::to_string(&input.status.counts).unwrap_or_default(),
                ),
            )?;
            Ok(true)
        });
        heartbeating(&ctx, (), write).await.map_err(|e| {
            let message = format!("the closing write of the batch files stopped: {e}");
            ActivityError::application(ApplicationFailure::builder(message).build())
        })?
    }
}

/// A shared workflow that could not be asked: the activity fails (and is retried).
fn unanswered(message: String) -> ActivityError {
    ActivityError::application(ApplicationFailure::builder(message).build())
}
