//! The batch workflow's input, result and status: compact state carried through
//! continue-as-new and resume.

use serde::{Deserialize, Serialize};

/// Start (or continue-as-new) input of `BatchWorkflow`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchInput {
    pub batch_id: String,
    /// Absolute path of the batch's bundle directory.
    pub bundle_dir: String,
    /// sha256 of the plan: a batch id only ever runs one task list.
    pub fingerprint: String,
    pub case_count: u32,
    pub concurrency: u32,
    pub max_retries: u32,
    /// Linear backoff step between attempts of one case.
    pub retry_backoff_ms: u64,
    /// Wall-clock budget of one actor attempt, used for the await activity's timeout.
    pub max_timeout_seconds: u64,
    /// State carried from an earlier run (resume) or an earlier segment (continue-as-new).
    #[serde(default)]
    pub carried: Option<Carried>,
    /// Continue-as-new after this many history events (small values exercise it in tests).
    #[serde(default)]
    pub history_budget: Option<u32>,
    /// Re-run OOM-killed cases inside the batch with doubled memory (opt-in).
    #[serde(default)]
    pub oom_auto_boost: bool,
    /// Memory granted to a case's first attempt in this batch, by case index (set by
    /// `retry-failed` for cases that were OOM-killed). The plan is never changed.
    #[serde(default)]
    pub memory_boosts: std::collections::BTreeMap<u32, u64>,
    /// Upsert the `Casebatch*` search attributes as the batch progresses. Set by the starter
    /// only when the namespace has them registered: an upsert of an unknown attribute fails
    /// the workflow task and would wedge the batch. Runs recorded without it never upsert.
    #[serde(default)]
    pub search_attributes: bool,
    /// Runtimes that declare an envelope. Empty, as in every batch started before envelopes
    /// existed: cases are admitted by the concurrency limit alone, in plan order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub envelopes: Vec<Envelope>,
    /// Per case, by index, when `envelopes` is set: the envelope it counts against and the
    /// memory it declares.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::packed::json"
    )]
    #[schemars(with = "crate::packed::Packed")]
    pub case_loads: Vec<CaseLoad>,
    /// Where cases dealt from a `runtime:` list may go. `None` when no case names a list of
    /// two or more runtimes: no breaker is consulted and nothing spills over, as in every
    /// batch started before spillover existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Routes>,
    /// Tail speculation for cases dealt from a list. `None`: off (turned off for the run, no
    /// case names a list, or the batch started before speculation existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Speculation>,
    /// Queued cases whose environment is provisioned while others run (`prepare_ahead`; 0:
    /// off, as in every batch started before it existed). The starter sets 0 for a batch with
    /// `routes`: a routed case's runtime is picked only when it is dispatched.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prepare_ahead: u32,
    /// How often a working stage heartbeats (`heartbeat_every_seconds`); its heartbeat
    /// timeout, and so how soon a dead worker's stage is taken over, is a quarter more.
    /// `None`: [`BatchInput::DEFAULT_HEARTBEAT_EVERY_MS`], as every batch before the setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_every_ms: Option<u64>,
    /// What the batch may spend (`defaults.budget`, or `resume --budget`). `None`: no limit,
    /// as in every batch started before budgets existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::Budget>,
    /// Rate-limited attempts of a case retried on their own count (`max_rate_limit_retries`;
    /// `None`: the default, 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rate_limit_retries: Option<u32>,
    /// How fast cases may start (`defaults.rate`). `None`: unpaced, as every batch started
    /// before paces existed (so their histories have no pacing commands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<crate::Pace>,
    /// How the batch shares the runtimes other batches use too (agents). `None`: on none, or
    /// started before sharing (its cases ask for no slot, so its history replays unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<crate::share::ShareInput>,
}

impl BatchInput {
    /// 4 s: what stages sent before the setting existed (the SDK throttles heartbeats to 80 %
    /// of a 5 s timeout), so a worker's death is still noticed within 5 s.
    pub const DEFAULT_HEARTBEAT_EVERY_MS: u64 = 4_000;

    /// The stages' heartbeat timeout: the cadence plus a quarter, so that the SDK (which
    /// sends at most one heartbeat per 80 % of the timeout) sends every one the stage records.
    pub fn heartbeat_timeout(&self) -> std::time::Duration {
        let every = self
            .heartbeat_every_ms
            .unwrap_or(Self::DEFAULT_HEARTBEAT_EVERY_MS);
        std::time::Duration::from_millis(every + every / 4)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// When a straggler of a routed case gets a duplicate on another runtime of its list: once
/// every case has been dispatched, after `2 ×` the median duration of the batch's finished
/// attempts, never sooner than [`Speculation::FLOOR_MS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Speculation {
    /// The run-history index's median for this harness: the median used until an attempt of
    /// this batch has run to its end. `None`: no duplicate before one has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_ms: Option<u64>,
}

impl Speculation {
    /// A straggler is never duplicated sooner than this after its dispatch.
    pub const FLOOR_MS: u64 = 10_000;
}

/// The runtime lists of a batch, compact: runtimes are named once, lists and cases refer to
/// them by index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Routes {
    /// Every runtime some list names, with its breaker settings.
    pub runtimes: Vec<RouteRuntime>,
    /// The distinct lists, each as indices into `runtimes` in the order written.
    pub lists: Vec<Vec<u16>>,
    /// Per case, by index: its list and the position of its share in it; `None` for a case
    /// on one runtime. Packed (`packed::json`): one entry per case.
    #[serde(with = "crate::packed::json")]
    #[schemars(with = "crate::packed::Packed")]
    pub cases: Vec<Option<CaseRoute>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RouteRuntime {
    pub name: String,
    #[serde(default)]
    pub breaker: crate::BreakerSettings,
}

/// `[list, home]`: the index into `Routes::lists` and the position, in that list, of the
/// runtime the plan dealt the case to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CaseRoute(pub u16, pub u16);

/// What a runtime lets one batch run on it at once (a runtimes-table entry's
/// `max_concurrent` and `memory_budget_mb`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Envelope {
    /// The runtimes-table name, for the timeline.
    pub runtime: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mb: Option<u64>,
}

/// One case's load, compact (`[envelope, memory_mb]` in history): the index into
/// `BatchInput::envelopes` it counts against (`None`: its runtime has no envelope), and its
/// declared memory in MiB (0: none declared, admitted outside the budget).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct CaseLoad(pub Option<u16>, pub u64);

/// Cases one batch may hold: its carried state is proven to fit a payload up to here
/// (`packed.rs`'s million-case tests), whatever the cases' states.
pub const MAX_BATCH_CASES: u32 = 1_000_000;

/// Active case limit: what a manifest may ask for and what `set_concurrency` accepts.
pub const CONCURRENCY_RANGE: std::ops::RangeInclusive<u32> = 1..=512;

/// Memory escalation stops here: past it the fix is a spec change, not more headroom.
pub const OOM_BOOST_CAP_MB: u64 = 16 * 1024;

/// Compact state that survives continue-as-new and resume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Carried {
    /// Packed (`packed::slots`): a plain array per case outgrew the payload limit.
    #[serde(with = "crate::packed::slots")]
    #[schemars(with = "crate::packed::Packed")]
    pub slots: Vec<CaseSlot>,
    pub counters: Counters,
    pub timeline: Vec<TimelineStep>,
    pub paused: bool,
    /// How many workflow runs (segments) this batch has had.
    pub segment: u32,
    /// The limit an operator set while the batch ran (`set_concurrency`), kept across
    /// continue-as-new; `None`: the input's.
    #[serde(default)]
    pub concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unrecorded: Vec<UnrecordedFailure>,
    /// What the batch's cases have spent so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spending: Option<crate::Spending>,
    /// The priority and weight an operator set while the batch ran (`set_share`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<crate::share::ShareChange>,
}

/// A case's final failure that its worker could not write into the bundle (it may not write
/// there): kept by the engine so the runner, which can, records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UnrecordedFailure {
    pub case: u32,
    pub attempts: u32,
    pub failure: crate::Failure,
}

/// A case's state: in the workflow (where `Running` never survives a run: a resumed run
/// re-queues it) and in the case's record in the bundle, which also shows `Retrying` while
/// another attempt is coming (the workflow holds such a case as `Running` or `Queued`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CaseState {
    #[default]
    Queued,
    Running,
    Retrying,
    Succeeded,
    Failed,
    Cancelled,
}

impl CaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            CaseState::Succeeded | CaseState::Failed | CaseState::Cancelled
        )
    }
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct CaseSlot {
    #[serde(rename = "s")]
    pub state: CaseState,
    /// Attempts made so far.
    #[serde(rename = "a", default)]
    pub attempts: u32,
}

/// Running totals the report shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Counters {
    /// Attempts whose in-flight job was re-attached after a crash (zero re-run).
    pub adopted: u32,
    /// Attempts re-dispatched because nothing was adoptable.
    pub redispatched: u32,
    /// Extra attempts after retryable failures.
    pub retries: u32,
    pub cleanup_unconfirmed: u32,
    /// In-batch OOM auto-boosts (re-runs with doubled memory).
    #[serde(default)]
    pub oom_boosts: u32,
    /// Attempts moved to another runtime of the case's list after an infra dispatch failure.
    #[serde(default)]
    pub spillovers: u32,
    /// Dispatches sent elsewhere without trying because the runtime's circuit was open.
    #[serde(default)]
    pub circuit_skips: u32,
    /// Changes of the effective width (concurrency) because circuits opened or closed.
    #[serde(default)]
    pub width_changes: u32,
    /// Stragglers given a duplicate on another runtime by tail speculation.
    #[serde(default)]
    pub speculations: u32,
    /// Speculations whose duplicate finished first (the original was killed).
    #[serde(default)]
    pub speculation_wins: u32,
    /// Cases whose environment was provisioned ahead of need (`prepare_ahead`).
    #[serde(default)]
    pub prepared: u32,
    /// Environments provisioned ahead and then cleaned up unused (drain, cancel).
    #[serde(default)]
    pub released: u32,
    /// Times an attempt asked its runtime again about a job it had not answered for, instead
    /// of starting another (the job was then harvested or watched on).
    #[serde(default)]
    pub reattached: u32,
    /// Attempts left behind on a runtime that stopped answering while the case moved on.
    #[serde(default)]
    pub stranded: u32,
    /// Jobs paid for twice: stranded jobs their runtime held when it answered again, and
    /// speculations' losers. With one job per case, job starts = cases + this.
    #[serde(default)]
    pub paid_twice: u32,
    /// Attempts their harness declared `RATE_LIMITED`, retried after a wait on their own cap.
    #[serde(default, skip_serializing_if = "crate::is_zero_u32")]
    pub rate_limited: u32,
    /// Times rate limits halved the batch's width.
    #[serde(default, skip_serializing_if = "crate::is_zero_u32")]
    pub rate_width_cuts: u32,
    /// The Temporal actions the batch has cost so far (the batch's own count; see
    /// [`TemporalActions`]). Kept by the batch, never added from a case's tally.
    #[serde(default)]
    pub temporal_actions: TemporalActions,
}

/// Temporal actions, as a namespace on Temporal Cloud is metered (about 500 a second by
/// default, and billed): counted by the batch workflow as it issues the commands behind them,
/// so the figure replays with its history. Queries are not in it (a query cannot change the
/// workflow; the runner's own status queries are its to count), nor are the server's own
/// retries of an activity, nor what the shared circuit breakers' workflows cost.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct TemporalActions {
    /// Workflow runs: the start, and each continue-as-new.
    pub runs: u32,
    /// Activities scheduled (every stage of every attempt, a supersede's sweep, the closing
    /// write of the batch files).
    pub activities: u32,
    /// Heartbeats the activities sent, as their results report them.
    pub heartbeats: u32,
    /// Timers started (retry backoffs, pauses before asking a runtime again, the tail's).
    pub timers: u32,
    /// Signals and updates the batch received (drain, pause, cancel, set_concurrency, …).
    pub controls: u32,
    /// Search-attribute upserts.
    pub upserts: u32,
    /// Markers recorded: patch markers (one per patch per run) and local activities.
    pub markers: u32,
}

impl TemporalActions {
    pub fn total(&self) -> u64 {
        let TemporalActions {
            runs,
            activities,
            heartbeats,
            timers,
            controls,
            upserts,
            markers,
        } = *self;
        [
            runs, activities, heartbeats, timers, controls, upserts, markers,
        ]
        .iter()
        .map(|&n| u64::from(n))
        .sum()
    }

    /// The kinds and their counts, by name (the metric's `kind` label, the report's rows).
    pub fn by_kind(&self) -> [(&'static str, u32); 7] {
        [
            ("runs", self.runs),
            ("activities", self.activities),
            ("heartbeats", self.heartbeats),
            ("timers", self.timers),
            ("controls", self.controls),
            ("upserts", self.upserts),
            ("markers", self.markers),
        ]
    }
}

impl Counters {
    /// Adds `other`'s counts to these (a finished case's tally to its batch's).
    pub fn add(&mut self, other: &Counters) {
        // Destructured, so a counter added to the struct cannot be forgotten here.
        let Counters {
            adopted,
            redispatched,
            retries,
            cleanup_unconfirmed,
            oom_boosts,
            spillovers,
            circuit_skips,
            width_changes,
            speculations,
            speculation_wins,
            prepared,
            released,
            reattached,
            stranded,
            paid_twice,
            rate_limited,
            rate_width_cuts,
            // The batch counts its actions itself; a case's tally holds none.
            temporal_actions: _,
        } = other;
        self.adopted += adopted;
        self.redispatched += redispatched;
        self.retries += retries;
        self.cleanup_unconfirmed += cleanup_unconfirmed;
        self.oom_boosts += oom_boosts;
        self.rate_limited += rate_limited;
        self.rate_width_cuts += rate_width_cuts;
        self.spillovers += spillovers;
        self.circuit_skips += circuit_skips;
        self.width_changes += width_changes;
        self.speculations += speculations;
        self.speculation_wins += speculation_wins;
        self.prepared += prepared;
        self.released += released;
        self.reattached += reattached;
        self.stranded += stranded;
        self.paid_twice += paid_twice;
    }
}

/// One step of the progress timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TimelineStep {
    /// Workflow time (ms since the epoch), deterministic under replay.
    pub at_ms: u64,
    /// The case (plan index) the step is about; `None` for batch-level steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case: Option<u32>,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Counts {
    pub queued: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub cancelled: u32,
}

impl Counts {
    pub fn of(slots: &[CaseSlot]) -> Self {
        let mut c = Counts::default();
        for s in slots {
            match s.state {
                CaseState::Queued => c.queued += 1,
                // A slot never holds `Retrying` (a record's state): it counts as running.
                CaseState::Running | CaseState::Retrying => c.running += 1,
                CaseState::Succeeded => c.succeeded += 1,
                CaseState::Failed => c.failed += 1,
                CaseState::Cancelled => c.cancelled += 1,
            }
        }
        c
    }

    pub fn total(&self) -> u32 {
        self.queued + self.running + self.succeeded + self.failed + self.cancelled
    }

    pub fn done(&self) -> u32 {
        self.succeeded + self.failed + self.cancelled
    }
}

/// What admission is doing.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    #[default]
    Running,
    Paused,
    Draining,
    Cancelling,
    /// The workflow has returned (see [`BatchEnd`]).
    Finished,
}

/// How a workflow run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BatchEnd {
    /// Every case reached a terminal state.
    Completed,
    /// Drained: admitted cases finished, queued work remains for `resume`.
    Drained,
    /// Cancelled: in-flight cases were cancelled (cleanup ran); done work is kept.
    Cancelled,
    /// Superseded: admissions stopped and every running job of the batch was killed on every
    /// runtime (cleanup ran); done work is kept and the killed cases are queued again, for the
    /// run that replaces this one (`batch run --supersede`) or `resume`.
    Superseded,
    /// The budget is spent: admissions stopped, admitted cases finished, queued work remains
    /// for `resume --budget`.
    BudgetExhausted,
}

/// Answer of the `status` query, and (with `end`) the workflow's result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchStatus {
    pub batch_id: String,
    pub phase: Phase,
    pub counts: Counts,
    /// Case indices currently admitted.
    pub in_flight: Vec<u32>,
    pub counters: Counters,
    pub timeline: Vec<TimelineStep>,
    pub segment: u32,
    pub concurrency: u32,
    /// Per runtime envelope: what the batch has in flight there and what waits for room.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub envelopes: Vec<EnvelopeUse>,
    /// Cases admitted at once now, when open circuits hold it below `concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// The batch's runtimes whose circuit it last saw open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open_circuits: Vec<crate::Circuit>,
    /// How long a routed case may be in flight before tail speculation duplicates it, once
    /// the threshold is known (speculation on, a median or a seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculate_after_ms: Option<u64>,
    /// Queued cases whose environment is provisioned ahead (or being provisioned), next to
    /// start when a slot frees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepared: Vec<u32>,
    /// Finished cases whose worker could not write their result into the bundle.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unrecorded: Vec<UnrecordedFailure>,
    /// What the batch's cases have spent (absent while none reported usage and no budget
    /// is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spending: Option<crate::Spending>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::Budget>,
    /// Cases admitted at once now, when rate limits hold the batch below `concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_width: Option<u32>,
    /// Per shared runtime: the batch's slots, its fair share, and its place in the queue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<crate::share::RuntimeShare>,
    /// The batch's priority and weight on shared runtimes, when it runs on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<crate::share::ShareChange>,
}

/// One runtime envelope's use by the batch, in `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EnvelopeUse {
    pub runtime: String,
    /// The batch's cases in flight on the runtime.
    pub running: u32,
    /// The memory they declare, in MiB.
    pub memory_mb: u64,
    /// Queued cases of the runtime: they wait for room in its envelope (or for the batch's
    /// own limit).
    pub waiting: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mb: Option<u64>,
}

/// The workflow's result: final status plus the per-case slots a resume starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchOutcome {
    pub end: BatchEnd,
    pub status: BatchStatus,
    #[serde(with = "crate::packed::slots")]
    #[schemars(with = "crate::packed::Packed")]
    pub slots: Vec<CaseSlot>,
}
