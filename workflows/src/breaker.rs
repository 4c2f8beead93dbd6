//! `RuntimeBreaker`: the circuit breaker of one runtime, as a long-lived workflow that every
//! batch's `start` activities consult and report to (`ask`, an update; `state`, a query).
//!
//! ```text
//!   closed ──(N consecutive infra dispatch failures)──► open (cooldown)
//!     ▲                                                  │ cooldown over
//!     └──── probe reached the runtime ◄── half-open: one probe ──(probe failed)──► open again
//! ```
//!
//! Why a workflow: the breaker must outlive any one batch (a batch started during an outage
//! skips the dead runtime from its first case) and be one source of truth for every worker
//! replica, without a store of our own. A workflow is exactly that on Temporal: durable,
//! serialised (no two probes), addressable by id, and its cooldown is workflow time, so it is
//! deterministic and replay-tested like the batch. It is started by the first report (update
//! with start) and ends after an idle spell with its circuit closed, so healthy runtimes cost
//! nothing.

use std::time::{Duration, UNIX_EPOCH};

use casebatch_proto::BreakerSettings;
use casebatch_proto::breaker::{Ask, BreakerAnswer, BreakerAsk, BreakerState, Grant};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ContinueAsNewOptions, SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult,
};

/// A closed breaker with nothing asked of it this long ends its run.
const IDLE: Duration = Duration::from_secs(600);
/// Continue as new past this many history events (each ask costs a few).
const HISTORY_BUDGET: u32 = 2_000;

/// The breaker's decisions, pure: every answer depends only on the state, the ask and the
/// workflow time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breaker {
    pub state: BreakerState,
}

impl Breaker {
    pub fn answer(&mut self, ask: Ask, settings: BreakerSettings, now_ms: u64) -> BreakerAnswer {
        let cooldown_ms = settings.cooldown_s.saturating_mul(1000);
        let s = &mut self.state;
        let grant = match ask {
            Ask::Dispatch => match s.open_until_ms {
                None => Grant::Go,
                Some(until) if now_ms < until => Grant::Skip,
                // Half-open: this dispatch is the one probe. Until it reports (or a further
                // cooldown passes, in case its worker died), every other dispatch skips.
                Some(_) => {
                    s.probing = true;
                    s.open_until_ms = Some(now_ms + cooldown_ms);
                    Grant::Probe
                }
            },
            Ask::Report { ok: true, .. } => {
                *s = BreakerState::default();
                Grant::Go
            }
            Ask::Report { ok: false, probe } => {
                s.failures = s.failures.saturating_add(1);
                let closed = s.open_until_ms.is_none();
                if probe || (closed && s.failures >= settings.failures.max(1)) {
                    // Opens, or a failed probe re-arms the cooldown.
                    s.open_until_ms = Some(now_ms + cooldown_ms);
                    s.probing = false;
                }
                if s.open_until_ms.is_some() {
                    Grant::Skip
                } else {
                    Grant::Go
                }
            }
        };
        BreakerAnswer { grant, state: *s }
    }

    fn is_quiet(&self) -> bool {
        self.state == BreakerState::default()
    }
}

/// Input of a breaker run: its runtime and, after continue-as-new, its state.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BreakerInput {
    pub runtime: String,
    #[serde(default)]
    pub state: BreakerState,
}

#[workflow]
pub struct RuntimeBreaker {
    runtime: String,
    breaker: Breaker,
    /// Counts asks, so the run can tell an idle spell from a busy one.
    asks: u64,
}

#[workflow_methods]
impl RuntimeBreaker {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, input: BreakerInput) -> Self {
        Self {
            runtime: input.runtime,
            breaker: Breaker { state: input.state },
            asks: 0,
        }
    }

    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<BreakerState> {
        loop {
            let seen = ctx.state(|s| s.asks);
            ctx.timer(IDLE).await;
            let (asks, quiet) = ctx.state(|s| (s.asks, s.breaker.is_quiet()));
            if asks == seen && quiet {
                return Ok(ctx.state(|s| s.breaker.state));
            }
            if ctx.history_length() >= HISTORY_BUDGET {
                let next = ctx.state(|s| BreakerInput {
                    runtime: s.runtime.clone(),
                    state: s.breaker.state,
                });
                return match ctx.continue_as_new(next, ContinueAsNewOptions::default()) {
                    Err(termination) => Err(termination),
                    Ok(never) => match never {},
                };
            }
        }
    }

    /// Consult the breaker before a dispatch, or report one.
    #[update(name = "ask")]
    pub fn ask(&mut self, ctx: &mut SyncWorkflowContext<Self>, ask: BreakerAsk) -> BreakerAnswer {
        self.asks += 1;
        let now_ms = ctx
            .workflow_time()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        self.breaker.answer(ask.ask, ask.settings, now_ms)
    }

    #[query(name = "state")]
    pub fn state(&self, _ctx: &WorkflowContextView) -> BreakerState {
        self.breaker.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: BreakerSettings = BreakerSettings {
        failures: 3,
        cooldown_s: 30,
    };
    const FAIL: Ask = Ask::Report {
        ok: false,
        probe: false,
    };

    fn grant(b: &mut Breaker, ask: Ask, now_ms: u64) -> Grant {
        b.answer(ask, SETTINGS, now_ms).grant
    }

    #[test]
    fn three_consecutive_failures_open_the_circuit_and_a_success_between_resets_the_count() {
        let mut b = Breaker::default();
        assert_eq!(grant(&mut b, FAIL, 0), Grant::Go);
        assert_eq!(grant(&mut b, FAIL, 0), Grant::Go);
        let ok = Ask::Report {
            ok: true,
            probe: false,
        };
        assert_eq!(grant(&mut b, ok, 0), Grant::Go);
        assert_eq!(b.state.failures, 0);
        grant(&mut b, FAIL, 10);
        grant(&mut b, FAIL, 10);
        assert_eq!(grant(&mut b, FAIL, 10), Grant::Skip);
        assert_eq!(b.state.open_until_ms, Some(30_010));
        assert_eq!(grant(&mut b, Ask::Dispatch, 30_009), Grant::Skip);
    }

    #[test]
    fn after_the_cooldown_exactly_one_probe_goes_and_its_outcome_decides() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            grant(&mut b, FAIL, 0);
        }
        assert_eq!(grant(&mut b, Ask::Dispatch, 30_000), Grant::Probe);
        // Everyone else waits for the probe.
        assert_eq!(grant(&mut b, Ask::Dispatch, 30_001), Grant::Skip);
        assert_eq!(grant(&mut b, Ask::Dispatch, 45_000), Grant::Skip);
        // A failed probe re-arms the cooldown from now.
        let failed_probe = Ask::Report {
            ok: false,
            probe: true,
        };
        assert_eq!(grant(&mut b, failed_probe, 46_000), Grant::Skip);
        assert_eq!(b.state.open_until_ms, Some(76_000));
        assert!(!b.state.probing);
        assert_eq!(grant(&mut b, Ask::Dispatch, 75_999), Grant::Skip);
        assert_eq!(grant(&mut b, Ask::Dispatch, 76_000), Grant::Probe);
        let ok_probe = Ask::Report {
            ok: true,
            probe: true,
        };
        assert_eq!(grant(&mut b, ok_probe, 77_000), Grant::Go);
        assert_eq!(b.state, BreakerState::default());
        assert_eq!(grant(&mut b, Ask::Dispatch, 77_001), Grant::Go);
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced_after_another_cooldown() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            grant(&mut b, FAIL, 0);
        }
        assert_eq!(grant(&mut b, Ask::Dispatch, 30_000), Grant::Probe);
        assert_eq!(grant(&mut b, Ask::Dispatch, 59_999), Grant::Skip);
        assert_eq!(grant(&mut b, Ask::Dispatch, 60_000), Grant::Probe);
    }

    #[test]
    fn failures_reported_while_open_do_not_extend_the_cooldown() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            grant(&mut b, FAIL, 0);
        }
        // Dispatches that went out before the circuit opened report late.
        assert_eq!(grant(&mut b, FAIL, 20_000), Grant::Skip);
        assert_eq!(b.state.open_until_ms, Some(30_000));
    }
}
