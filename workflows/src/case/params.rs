//! What a case is given (its batch's static facts, the pipeline its run keeps) and what it
//! hands back to admission when it ends.

use casebatch_proto::{AttemptKey, CaseState, Counters, Failure, Usage};
use futures::future::LocalBoxFuture;
use temporalio_sdk::WorkflowContext;

use crate::decide;
use crate::shared::Host;

/// Patch id recorded by runs whose attempts use regular activities ([`Pipeline::Activities`]).
pub(crate) const STAGES_AS_ACTIVITIES: &str = "stages-as-activities";

/// Patch id recorded by runs whose `settle` closes final attempts itself (see
/// [`SettleInput::close_from`]); runs recorded before it keep a `cleanup` per attempt.
pub(crate) const SETTLE_CLOSES: &str = "settle-closes-final-attempts";

/// Patch id recorded by runs whose `start` may watch its job briefly and settle it
/// ([`casebatch_proto::SettleShort`]); runs recorded before it always follow with `settle`.
pub(crate) const START_SETTLES: &str = "start-settles-short-jobs";

/// Patch id recorded by runs that keep the rules for runtimes that fail or stop answering
/// ([`CaseParams::outage_rules`]); runs recorded before it replay as they ran.
pub(crate) const OUTAGE_RULES: &str = "runtime-outage-rules";

/// Patch id recorded by runs that retry rate-limited attempts on their own cap after the
/// wait their harness asked for ([`crate::decide::Next::RateLimited`]); runs recorded
/// before it spend `max_retries` on them, after the linear backoff.
pub(crate) const RATE_LIMIT_RULES: &str = "rate-limit-rules";

/// How a run executes attempts. Chosen once per run: a history recorded without the patch
/// marker keeps the pipeline it began with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pipeline {
    /// start / settle / cleanup as regular activities.
    Activities,
    /// Six local activities per attempt ([`legacy`]): only for runs recorded that way.
    LocalActivities,
}

impl Pipeline {
    pub(crate) fn of_run<H: Host>(ctx: &WorkflowContext<H>) -> Self {
        if marked(ctx, STAGES_AS_ACTIVITIES) {
            Pipeline::Activities
        } else {
            Pipeline::LocalActivities
        }
    }

    /// Whether `settle` may close final attempts in this run. Asked once, at the run's start.
    pub(crate) fn settle_closes<H: Host>(self, ctx: &WorkflowContext<H>) -> bool {
        self == Pipeline::Activities && marked(ctx, SETTLE_CLOSES)
    }

    /// Whether `start` may settle short jobs in this run ([`START_SETTLES`]; only where
    /// `settle` closes, since the short path closes as it does). Asked once, at the run's
    /// start.
    pub(crate) fn start_settles<H: Host>(
        self,
        ctx: &WorkflowContext<H>,
        settle_closes: bool,
    ) -> bool {
        settle_closes && marked(ctx, START_SETTLES)
    }

    /// Whether this run keeps [`RATE_LIMIT_RULES`]. Asked once, at the run's start.
    pub(crate) fn rate_limit_rules<H: Host>(self, ctx: &WorkflowContext<H>) -> bool {
        self == Pipeline::Activities && marked(ctx, RATE_LIMIT_RULES)
    }

    /// Whether this run keeps [`OUTAGE_RULES`]. Asked once, at the run's start.
    pub(crate) fn outage_rules<H: Host>(self, ctx: &WorkflowContext<H>) -> bool {
        self == Pipeline::Activities && marked(ctx, OUTAGE_RULES)
    }
}

/// Patch id recorded by runs that give a shared runtime's slots back from activities, never
/// by a signal from the batch's workflow ([`CaseParams::slot_returns_by_activity`]).
pub(crate) const SLOT_RETURNS_BY_ACTIVITY: &str = "slot-returns-by-activity";

/// Whether this run keeps [`SLOT_RETURNS_BY_ACTIVITY`]: asked once, at the start of a run
/// that shares a runtime.
pub(crate) fn slot_returns_by_activity<H: Host>(ctx: &WorkflowContext<H>, shares: bool) -> bool {
    shares && marked(ctx, SLOT_RETURNS_BY_ACTIVITY)
}

/// `ctx.patched(id)`, counting the marker it records (a Temporal action).
fn marked<H: Host>(ctx: &WorkflowContext<H>, id: &str) -> bool {
    let on = ctx.patched(id);
    if on {
        crate::shared::cost(ctx, |a| a.markers += 1);
    }
    on
}

/// Static facts the pipeline needs about its batch.
#[derive(Debug, Clone)]
pub(crate) struct CaseParams {
    pub batch_id: String,
    pub bundle_dir: String,
    pub case_index: u32,
    /// Attempts made by earlier runs of this batch (resume continues the numbering).
    pub attempts_before: u32,
    pub policy: decide::Policy,
    /// Memory for the first attempt (set by retry-failed after an OOM kill).
    pub memory_boost_mb: Option<u64>,
    pub retry_backoff_ms: u64,
    pub max_timeout_seconds: u64,
    pub pipeline: Pipeline,
    /// `settle` closes final attempts ([`Pipeline::settle_closes`]).
    pub settle_closes: bool,
    /// `start` may settle a short job ([`Pipeline::start_settles`]).
    pub start_settles: bool,
    /// The run keeps the rules for runtimes that fail or stop answering ([`OUTAGE_RULES`]):
    /// a failed probe costs the case nothing, an unanswered job is asked about again or left
    /// stranded, never started twice unseen.
    pub outage_rules: bool,
    /// The run gives slots back from activities ([`SLOT_RETURNS_BY_ACTIVITY`]); runs
    /// recorded before it signal the slots from the workflow.
    pub slot_returns_by_activity: bool,
    /// Admitted ahead of a free slot: provision the first attempt's environment, then wait
    /// for the batch to grant a slot ([`ahead`]).
    pub ahead: bool,
}

/// What a finished case reports back to admission.
pub(crate) struct CaseDone {
    pub case_index: u32,
    pub state: CaseState,
    pub attempts: u32,
    /// What it did, counted the way the batch counts it (added to the batch's counters).
    pub tally: Counters,
    /// What its attempts in this run reported they consumed (added to the batch's spending).
    pub usage: Usage,
    /// Timeline messages about this case (the case is named by the step, not the text).
    pub notes: Vec<String>,
    /// Cleanup could not write the attempt's records: its worker may not write the bundle.
    pub bundle_refused: Option<Failure>,
    /// The case's final failure, when the bundle could not hold it (the runner records it).
    pub unrecorded_failure: Option<Failure>,
    /// Cleanups of attempts it left behind that are still running: the batch drives them
    /// on, so the case's slot is free once its own outcome is final.
    pub left_behind: Vec<LeftBehind>,
}

impl CaseParams {
    /// The key of the case's attempt number `attempt`.
    pub(super) fn key(&self, attempt: u32, memory_boost_mb: Option<u64>) -> AttemptKey {
        AttemptKey {
            batch_id: self.batch_id.clone(),
            bundle_dir: self.bundle_dir.clone(),
            case_index: self.case_index,
            attempt,
            memory_boost_mb,
            runtime: None,
        }
    }
}

impl CaseDone {
    /// A case before its first attempt of this run.
    pub(super) fn starting(p: &CaseParams) -> Self {
        Self {
            case_index: p.case_index,
            state: CaseState::Failed,
            attempts: p.attempts_before,
            tally: Counters::default(),
            usage: Usage::default(),
            notes: Vec::new(),
            bundle_refused: None,
            unrecorded_failure: None,
            left_behind: Vec::new(),
        }
    }
}

/// The cleanup of an attempt left behind (stranded, or a speculation's loser), running.
pub(crate) type LeftBehind = LocalBoxFuture<'static, CleanedUp>;

/// What the cleanup of an attempt left behind found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CleanedUp {
    pub stranded: bool,
    pub confirmed: bool,
    /// Its runtime held a job for it: the case paid for that one and the one counting.
    pub held_job: bool,
}

impl CleanedUp {
    /// Adds what it found to `tally`.
    pub(crate) fn count(self, tally: &mut Counters) {
        tally.stranded += u32::from(self.stranded);
        tally.cleanup_unconfirmed += u32::from(!self.confirmed);
        tally.paid_twice += u32::from(self.held_job);
    }
}
