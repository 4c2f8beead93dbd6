//! The activities' side of shared runtimes' slots (`RuntimeSlots` workflows, one per agent
//! endpoint): a case's ask, with update-with-start so the first batch to ask starts the
//! runtime's slots and every later one, on any worker replica, asks the same; the agent's
//! capacity, learned here and cached; and which batch runs holding slots have closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use casebatch_proto::share::{
    HeldSlot, PRIORITY_RANGE, SlotAnswer, SlotAsk, SlotsView, slots_workflow_id,
};
use casebatch_telemetry::Metrics;
use casebatch_workflows::RuntimeSlots;
use casebatch_workflows::fair_share::FairQueue;
use temporalio_client::errors::{WorkflowInteractionError, WorkflowQueryError};
use temporalio_client::{
    Client, UntypedWorkflow, WorkflowDescribeOptions, WorkflowExecutionStatus,
    WorkflowQueryOptions, WorkflowSignalOptions,
};

use crate::shared_workflows::{CALL_WITHIN, answer_within, start_or_ask};

/// How long a worker trusts an agent's capacity it learned (an agent restarted with another
/// `--max-concurrent` is noticed within this).
const CAPACITY_FRESH_FOR: Duration = Duration::from_secs(30);

/// The agents' capacities this worker learned, by endpoint.
#[derive(Default)]
pub(crate) struct Capacities(Mutex<HashMap<String, (Instant, u32)>>);

impl Capacities {
    pub(crate) fn fresh(&self, key: &str) -> Option<u32> {
        let seen = self.0.lock().expect("lock");
        let (at, n) = seen.get(key)?;
        (at.elapsed() < CAPACITY_FRESH_FOR).then_some(*n)
    }

    pub(crate) fn learned(&self, key: &str, n: u32) {
        let mut seen = self.0.lock().expect("lock");
        seen.insert(key.to_string(), (Instant::now(), n));
    }
}

/// How often a worker serving metrics reads the slots it asked of, and for how long after its
/// last ask.
const WATCH_EVERY: Duration = Duration::from_secs(5);
const WATCH_FOR: Duration = Duration::from_secs(15 * 60);

/// The shared runtimes this worker asked for slots, by endpoint, with when it last did: the
/// ones whose slots its metrics show.
#[derive(Default)]
pub(crate) struct Asked(Mutex<HashMap<String, Instant>>);

impl Asked {
    pub(crate) fn now(&self, key: &str) {
        let mut asked = self.0.lock().expect("lock");
        asked.insert(key.to_string(), Instant::now());
    }

    /// The endpoints asked within [`WATCH_FOR`] (the others are forgotten).
    fn recent(&self) -> Vec<String> {
        let mut asked = self.0.lock().expect("lock");
        asked.retain(|_, at| at.elapsed() < WATCH_FOR);
        asked.keys().cloned().collect()
    }
}

/// Keeps the slots metrics of the runtimes this worker asked of: every [`WATCH_EVERY`], each
/// one's `state`, read from its slots workflow (the one count every replica shares, so the
/// figures agree across workers and drop to zero when the queue drains, with no ask).
pub(crate) async fn watch(client: Client, asked: Arc<Asked>, metrics: Metrics) {
    let mut every = tokio::time::interval(WATCH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        for endpoint in asked.recent() {
            match read(&client, &endpoint).await {
                Ok(Some(view)) => {
                    let waiting = waiting_by_priority(&view);
                    metrics.slots(&endpoint, view.capacity, view.held, waiting);
                }
                Ok(None) => {
                    metrics.slots(&endpoint, 0, 0, waiting_by_priority(&SlotsView::default()))
                }
                Err(why) => tracing::debug!("{why}"),
            }
        }
    }
}

/// The slots of the runtime keyed `key`, as their workflow counts them; `None` when none
/// runs (never asked, or ended idle).
pub(crate) async fn read(client: &Client, key: &str) -> Result<Option<SlotsView>, String> {
    let id = slots_workflow_id(key);
    let handle = client.get_workflow_handle::<RuntimeSlots>(id.clone());
    let query = handle.query(RuntimeSlots::state, (), WorkflowQueryOptions::default());
    match tokio::time::timeout(CALL_WITHIN, query).await {
        Ok(Ok(view)) => Ok(Some(view)),
        Ok(Err(WorkflowQueryError::NotFound(_))) => Ok(None),
        Ok(Err(e)) => Err(format!("the slots {id} could not be read: {e}")),
        Err(_) => Err(format!(
            "the slots {id} did not answer within {CALL_WITHIN:?}"
        )),
    }
}

/// Cases waiting at each priority level, every level listed.
fn waiting_by_priority(view: &SlotsView) -> Vec<(u32, u32)> {
    (PRIORITY_RANGE)
        .map(|level| {
            let at_level = view.batches.iter().filter(|b| b.priority == level);
            (level, at_level.map(|b| b.waiting).sum())
        })
        .collect()
}

/// Asks the slots of `ask`'s runtime for a slot.
pub(crate) async fn ask(client: &Client, ask: SlotAsk) -> Result<SlotAnswer, String> {
    let id = slots_workflow_id(&ask.runtime.key);
    let options = start_or_ask(&id);
    let call = client.execute_update_with_start_workflow(
        RuntimeSlots::run,
        FairQueue::default(),
        RuntimeSlots::ask,
        ask,
        options,
    );
    answer_within(&format!("the slots {id}"), call).await
}

/// Gives a held slot back, or withdraws its wait: a signal from this client, never from the
/// batch's workflow. The slots signal the batch (its grants); while the batch signalled
/// back, the engine held both workflows half a second at each crossing, and the agent idled
/// a quarter of the time (docs/benchmarks.md).
pub(crate) async fn give_back(client: &Client, slot: HeldSlot) -> Result<(), String> {
    let id = &slot.slots_workflow_id;
    let handle = client.get_workflow_handle::<RuntimeSlots>(id.clone());
    let sent = handle.signal(
        RuntimeSlots::give_back,
        slot.ticket,
        WorkflowSignalOptions::default(),
    );
    match tokio::time::timeout(CALL_WITHIN, sent).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the slot could not be given back to {id}: {e}")),
        Err(_) => Err(format!(
            "{id} did not take the slot back within {CALL_WITHIN:?}"
        )),
    }
}

/// Which of `runs` (workflow id, run id) are over: closed, or followed by another run. A
/// run whose state cannot be read is taken as running.
pub(crate) async fn closed(client: &Client, runs: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut over = Vec::new();
    for (workflow_id, run_id) in runs {
        let handle = client.get_workflow_handle::<UntypedWorkflow>(workflow_id.clone());
        let described = handle.describe(WorkflowDescribeOptions::default());
        let closed = match tokio::time::timeout(CALL_WITHIN, described).await {
            Ok(Ok(d)) => d.status() != WorkflowExecutionStatus::Running || d.run_id() != run_id,
            Ok(Err(WorkflowInteractionError::NotFound(_))) => true,
            Ok(Err(_)) | Err(_) => false,
        };
        if closed {
            over.push((workflow_id, run_id));
        }
    }
    over
}
