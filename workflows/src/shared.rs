//! What case code shares with its batch, and nothing more: the runtimes' circuits, the tail's
//! view, the cases provisioned ahead, the timeline, a way to wake the admission loop, and the
//! batch's lifecycle (read only). Case code is generic over a [`Host`] that holds a
//! [`Shared`], so it never sees the batch itself (and `case/` does not import `batch`).

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use std::time::Duration;

use casebatch_proto::{TemporalActions, TimelineStep};
use temporalio_sdk::WorkflowContext;

use crate::circuits::Circuits;
use crate::lifecycle::Lifecycle;
use crate::rate_limited::RateWidth;
use crate::runtime_share::RuntimeShares;
use crate::tail::Tail;

/// The timeline keeps its newest steps only, so history stays compact.
const TIMELINE_KEEP: usize = 200;

/// The workflow that runs cases: the batch.
pub(crate) trait Host: 'static {
    fn shared(&self) -> &Shared;
    fn shared_mut(&mut self) -> &mut Shared;
    fn lifecycle(&self) -> Lifecycle;
}

/// State the batch and its cases both read and change.
#[derive(Default)]
pub(crate) struct Shared {
    /// The batch's view of its runtimes' circuits; `None` when no case names a list.
    pub circuits: Option<Circuits>,
    /// Tail speculation's view of the batch; `None` when it is off or nothing is routed.
    pub tail: Option<Tail>,
    /// Cases admitted ahead of a free slot (`prepare_ahead`): provisioning or provisioned,
    /// still queued; each leaves it when granted a slot or released.
    pub prepared: BTreeSet<u32>,
    /// Bumped by every control and every change that may let admission do more, so the
    /// admission loop, waiting for it to change, wakes up.
    pub wakeups: u64,
    pub timeline: Vec<TimelineStep>,
    /// The Temporal actions the batch has cost, counted as its commands are issued.
    pub actions: TemporalActions,
    /// The heartbeat timeout of every stage activity (from the batch's cadence).
    pub heartbeat_timeout: Duration,
    /// The width rate-limited attempts narrow the batch to.
    pub rate: RateWidth,
    /// The batch's slots on shared runtimes; `None` when it runs on none.
    pub shares: Option<RuntimeShares>,
}

impl Shared {
    /// Wakes the admission loop (the batch's width or the cases' needs may have changed).
    pub(crate) fn wake(&mut self) {
        self.wakeups += 1;
    }

    pub(crate) fn push_step(&mut self, at_ms: u64, case: Option<u32>, message: String) {
        self.timeline.push(TimelineStep {
            at_ms,
            case,
            message,
        });
        if self.timeline.len() > TIMELINE_KEEP {
            let excess = self.timeline.len() - TIMELINE_KEEP;
            self.timeline.drain(..excess);
        }
    }
}

/// Workflow time (deterministic under replay) in milliseconds since the epoch.
pub(crate) fn epoch_ms(workflow_time: Option<SystemTime>) -> u64 {
    workflow_time
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, in workflow time.
pub(crate) fn workflow_ms<H>(ctx: &WorkflowContext<H>) -> u64 {
    epoch_ms(ctx.workflow_time())
}

/// Counts a Temporal action the batch costs as it issues the command behind it (the count
/// replays with the history, as the commands do).
pub(crate) fn cost<H: Host>(ctx: &WorkflowContext<H>, add: impl FnOnce(&mut TemporalActions)) {
    ctx.state_mut(|s| add(&mut s.shared_mut().actions));
}

/// Adds a timeline step now (case steps are mostly added when the case ends).
pub(crate) fn note<H: Host>(ctx: &WorkflowContext<H>, case: Option<u32>, message: String) {
    let at_ms = workflow_ms(ctx);
    ctx.state_mut(|s| s.shared_mut().push_step(at_ms, case, message));
}
