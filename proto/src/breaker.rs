//! The circuit breaker of a runtime, shared by every batch that spreads cases over it.
//!
//! One long-lived `RuntimeBreaker` workflow per runtime holds the breaker: `start` activities
//! consult it before dispatching a case there (a query, or the `ask` update when the circuit
//! is not plainly closed) and report what the dispatch did (`ask` again). A batch learns the
//! circuit's state only from its `start` results ([`Circuit`]).

use serde::{Deserialize, Serialize};

/// Workflow type of the breaker.
pub const BREAKER_WORKFLOW: &str = "RuntimeBreaker";
/// The breaker's update: consult before a dispatch, or report its outcome.
pub const ASK: &str = "ask";
/// The breaker's query: its state, without changing it.
pub const QUERY_STATE: &str = "state";

/// Consecutive infra dispatch failures that open a circuit, unless a runtime sets another.
pub const DEFAULT_BREAKER_FAILURES: u32 = 3;
/// How long an open circuit refuses dispatches before one probe may go through.
pub const DEFAULT_BREAKER_COOLDOWN_S: u64 = 30;

/// A runtime's breaker settings (runtimes-table `breaker_failures`, `breaker_cooldown_s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BreakerSettings {
    pub failures: u32,
    pub cooldown_s: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failures: DEFAULT_BREAKER_FAILURES,
            cooldown_s: DEFAULT_BREAKER_COOLDOWN_S,
        }
    }
}

/// Workflow id of the breaker of one runtime. Named by the runtime's name *and* where it is
/// (its endpoint, or the host for `local-process`), so two teams' runtimes that share a name
/// on one namespace never share a breaker.
pub fn breaker_workflow_id(runtime: &str, location: &str) -> String {
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = location.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("casebatch-breaker-{runtime}-{hash:016x}")
}

/// What a `start` activity asks its runtime's breaker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BreakerAsk {
    pub runtime: String,
    pub settings: BreakerSettings,
    pub ask: Ask,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    /// May a case be dispatched now?
    Dispatch,
    /// A dispatch (`probe`: the half-open probe) reached the runtime (`ok`) or failed with a
    /// retryable infra failure.
    Report { ok: bool, probe: bool },
}

/// The breaker's answer to [`Ask::Dispatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// Closed: go.
    Go,
    /// Half-open and this dispatch is its one probe: go, then report.
    Probe,
    /// Open (or its probe is out): try elsewhere.
    Skip,
}

/// The breaker's state, as its query and every answer to `ask` tell it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct BreakerState {
    /// Consecutive retryable infra dispatch failures since the last success.
    pub failures: u32,
    /// Open until this time (ms since the epoch); `None`: closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_until_ms: Option<u64>,
    /// Half-open with its one probe out.
    #[serde(default)]
    pub probing: bool,
}

/// The answer to one [`BreakerAsk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BreakerAnswer {
    pub grant: Grant,
    pub state: BreakerState,
}

/// What a batch learns about a runtime's circuit from a `start` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Circuit {
    pub runtime: String,
    /// Open (or half-open with a probe out): dispatches there are refused until `retry_at_ms`.
    pub open: bool,
    /// When a probe may next go through (ms since the epoch); 0 when closed.
    #[serde(default)]
    pub retry_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_ids_differ_by_location_and_stay_stable() {
        let a = breaker_workflow_id("gpu", "http://127.0.0.1:7001");
        assert_eq!(a, breaker_workflow_id("gpu", "http://127.0.0.1:7001"));
        assert_ne!(a, breaker_workflow_id("gpu", "http://127.0.0.1:7002"));
        assert!(a.starts_with("casebatch-breaker-gpu-"));
        // Pinned: a breaker id that changed between releases would split one runtime's state.
        assert_eq!(
            breaker_workflow_id("a", ""),
            "casebatch-breaker-a-cbf29ce484222325"
        );
    }
}
