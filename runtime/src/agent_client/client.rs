//! The worker's client of its agents: one per worker, holding a channel per agent and how
//! long it waits on them.

use std::time::Duration;

use casebatch_proto::runtime_v1::runtime_client::RuntimeClient;
use tonic::transport::Channel;

use super::error::AgentError;
use super::target::{AgentTarget, Channels};
use super::waits::Outage;

/// How long the client waits on an agent.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long an awaited job's agent may stay unreachable (without a break) before the
    /// attempt fails as `RUNTIME_UNREACHABLE`.
    pub unreachable_grace: Duration,
    /// How long a submit retries an unreachable agent (inside the `start` activity's
    /// deadline).
    pub submit_grace: Duration,
    /// The same, for an attempt routed over its case's runtime list, which can move on.
    pub spill_grace: Duration,
    /// How long cleanup retries an unreachable agent before an unconfirmed receipt (inside
    /// the `cleanup` activity's deadline).
    pub cleanup_grace: Duration,
    /// How long a cancelled job is waited for after the kill.
    pub cancel_wait: Duration,
    /// The longest pause between tries.
    pub max_backoff: Duration,
    pub heartbeat_every: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            unreachable_grace: Duration::from_secs(60),
            submit_grace: Duration::from_secs(20),
            spill_grace: Duration::from_secs(2),
            cleanup_grace: Duration::from_secs(40),
            cancel_wait: Duration::from_secs(30),
            max_backoff: Duration::from_secs(5),
            heartbeat_every: Duration::from_secs(1),
        }
    }
}

/// The runtime for cases on an agent. One per worker: it holds one channel per agent.
#[derive(Default)]
pub struct AgentClient {
    channels: Channels,
    pub(super) timing: Timing,
}

impl AgentClient {
    pub fn new(timing: Timing) -> Self {
        Self {
            channels: Channels::default(),
            timing,
        }
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    pub(super) fn client(&self, t: &AgentTarget) -> Result<RuntimeClient<Channel>, AgentError> {
        self.channels.client(t)
    }

    pub(super) fn outage(&self, grace: Duration) -> Outage {
        Outage::new(grace, self.timing.max_backoff)
    }
}
