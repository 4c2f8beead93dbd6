//! Fair share of a runtime many batches use at once (an agent with `--max-concurrent`): the
//! wire between a batch and the `RuntimeSlots` workflow of that runtime.
//!
//! A case asks for a slot before its job starts (`ask`, through an activity that starts the
//! runtime's slots workflow if none runs) and gives it back when the job has ended (`return`,
//! a signal). The slots workflow grants free slots by weighted fair queuing and tells the
//! batch by signal (`slot_granted`). Every slot is a [`Ticket`]: one attempt of one case of
//! one batch run, so every message is idempotent.

use serde::{Deserialize, Serialize};

/// Priority levels: a waiting case of a higher level always gets the next free slot.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<u32> = 1..=5;
pub const DEFAULT_PRIORITY: u32 = 3;
/// A batch's weight within its priority level.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=100;
pub const DEFAULT_WEIGHT: u32 = 1;

/// The batch's signal that carries grants.
pub const SLOT_GRANTED: &str = "slot_granted";
/// The slots workflow's signal that takes a ticket back (held or still waiting).
pub const SLOT_RETURN: &str = "slot_return";
/// The batch's update that changes its priority and weight.
pub const SET_SHARE: &str = "set_share";

/// Workflow id of the slots of the runtime reached at `key` (an agent's endpoint).
pub fn slots_workflow_id(key: &str) -> String {
    format!("casebatch-slots:{key}")
}

/// One slot, asked or held: one attempt of one case of one batch run (the run id, so a
/// resumed batch never inherits the tickets of a run that ended without returning them).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Ticket {
    pub workflow_id: String,
    pub run_id: String,
    pub case: u32,
    pub attempt: u32,
}

/// A slot held on a shared runtime: the ticket, and the slots workflow it is held from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HeldSlot {
    pub slots_workflow_id: String,
    pub ticket: Ticket,
    /// How long the ticket waited for the slot, for the first activity that gets the slot to
    /// record (then dropped, so no other records it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<SlotWait>,
}

/// A ticket's wait for its slot, from its ask to its grant, on the engine's clock (workflow
/// time, as Temporal's own timers keep).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SlotWait {
    /// The slots' key: the agent's endpoint.
    pub endpoint: String,
    /// The priority the ticket asked at.
    pub priority: u32,
    pub waited_ms: u64,
}

/// How a batch shares: its user (the owner), its priority level and its weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShareSettings {
    pub user: String,
    pub priority: u32,
    pub weight: u32,
}

impl Default for ShareSettings {
    fn default() -> Self {
        Self {
            user: String::new(),
            priority: DEFAULT_PRIORITY,
            weight: DEFAULT_WEIGHT,
        }
    }
}

impl ShareSettings {
    /// Why `priority` and `weight` are out of range, if they are.
    pub fn check(priority: u32, weight: u32) -> Result<(), String> {
        if !PRIORITY_RANGE.contains(&priority) {
            return Err(format!(
                "priority {priority} is outside {}..={}",
                PRIORITY_RANGE.start(),
                PRIORITY_RANGE.end()
            ));
        }
        if !WEIGHT_RANGE.contains(&weight) {
            return Err(format!(
                "weight {weight} is outside {}..={}",
                WEIGHT_RANGE.start(),
                WEIGHT_RANGE.end()
            ));
        }
        Ok(())
    }
}

/// `set_share`'s argument: the batch's new priority and weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShareChange {
    pub priority: u32,
    pub weight: u32,
}

/// What a batch needs to share its runtimes: how it shares, the runtimes that are shared
/// (agents: their slots workflow is keyed by endpoint), and per case the runtime it runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShareInput {
    pub settings: ShareSettings,
    pub runtimes: Vec<SharedRuntime>,
    /// Per case, by index: the index into `runtimes` of its runtime; `None` for a case on a
    /// runtime that is not shared (or dealt from a list: routed cases are not queued here).
    #[serde(with = "crate::packed::json")]
    #[schemars(with = "crate::packed::Packed")]
    pub cases: Vec<Option<u16>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SharedRuntime {
    /// The runtimes-table name, for `status` and the timeline.
    pub name: String,
    /// What the slots workflow is keyed by: the agent's endpoint.
    pub key: String,
    /// A batch starts nothing while this many cases or more wait for the runtime's slots
    /// (the runtime's `queue_limit`): it waits to be admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_limit: Option<u32>,
}

/// `ask`: a ticket wants a slot on the runtime named `runtime`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SlotAsk {
    pub runtime: SharedRuntime,
    pub ticket: Ticket,
    pub share: ShareSettings,
    /// The runtime's slots as the asking worker last learned them; `None` when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
}

/// The `ask_slot` activity's input: the ask, and the bundle whose runtimes table says how to
/// reach the runtime (to learn its capacity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AskSlotInput {
    pub bundle_dir: String,
    pub ask: SlotAsk,
}

/// The slots workflow's answer to an ask.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SlotAnswer {
    /// Granted now (no signal follows).
    pub granted: bool,
    /// Otherwise: waiting tickets ahead of it in the order slots are granted now.
    pub position: u32,
    /// What the batch holds now, and its fair share of the runtime's slots (in thousandths
    /// of a slot).
    pub held: u32,
    pub fair_share_milli: u32,
    pub capacity: u32,
}

/// The slots workflow's view, for `state` queries and `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SlotsView {
    pub capacity: u32,
    pub held: u32,
    pub waiting: u32,
    pub batches: Vec<BatchShareView>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchShareView {
    pub workflow_id: String,
    pub user: String,
    pub priority: u32,
    pub weight: u32,
    pub held: u32,
    pub waiting: u32,
    pub fair_share: f64,
}

/// One shared runtime as a batch sees it, in `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RuntimeShare {
    pub runtime: String,
    /// The batch's cases holding a slot there.
    pub held: u32,
    /// The batch's cases waiting for one.
    pub waiting: u32,
    /// Its fair share of the runtime's slots (in thousandths of a slot) and the runtime's
    /// slots, as last answered.
    pub fair_share_milli: u32,
    pub capacity: u32,
    /// The best place of its waiting cases in the runtime's queue, as last answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// Workflow time (ms) since which some case has waited, while one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since_ms: Option<u64>,
}
