//! The `start` activity's side of the shared circuit breakers (`RuntimeBreaker` workflows):
//! consult a runtime's breaker before dispatching a routed case there, report what the
//! dispatch did.
//!
//! Cheap while a runtime is healthy: the breaker is read with a query (no history written),
//! the answer is cached for a second per worker, and a runtime that never failed has no
//! breaker at all (the query finds none). Only a runtime with failures on record is asked
//! with the `ask` update, which starts its breaker if needed (update with start).
//!
//! The breaker fails open: when Temporal cannot be asked, the dispatch goes ahead, because a
//! breaker that cannot be read must not stop a batch the runtime could run.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use casebatch_bundle::now_ms;
use casebatch_proto::Circuit;
use casebatch_proto::breaker::{
    Ask, BreakerAnswer, BreakerAsk, BreakerSettings, BreakerState, Grant,
};
use casebatch_workflows::RuntimeBreaker;
use casebatch_workflows::breaker::BreakerInput;
use temporalio_client::errors::WorkflowQueryError;
use temporalio_client::{Client, WorkflowQueryOptions};

use crate::shared_workflows::start_or_ask;

/// How long a worker trusts a breaker state it read.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// A breaker call that takes longer is given up (and the dispatch goes ahead).
const CALL_WITHIN: Duration = Duration::from_secs(10);

/// One runtime's breaker, as a dispatch names it.
#[derive(Debug, Clone)]
pub struct BreakerOf {
    /// The runtime's name in the plan.
    pub runtime: String,
    /// The breaker's workflow id (`Plan::breaker_id`: name and where the runtime is).
    pub id: String,
    pub settings: BreakerSettings,
}

impl BreakerOf {
    fn id(&self) -> String {
        self.id.clone()
    }
}

/// A dispatch the breaker let through.
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    /// The half-open probe: its outcome decides the circuit.
    probe: bool,
    /// Failures were on record: a success must be reported to reset them.
    dirty: bool,
}

/// The breakers of every runtime this worker dispatches to.
#[derive(Default)]
pub struct Breakers {
    client: Option<Client>,
    seen: Mutex<HashMap<String, (Instant, BreakerState)>>,
}

fn circuit(runtime: &str, state: &BreakerState) -> Circuit {
    Circuit {
        runtime: runtime.to_string(),
        open: state.open_until_ms.is_some(),
        retry_at_ms: state.open_until_ms.unwrap_or(0),
    }
}

impl Breakers {
    pub fn new(client: Client) -> Self {
        Self {
            client: Some(client),
            seen: Mutex::default(),
        }
    }

    /// Before a dispatch: `Ok` to go ahead, `Err` with the open circuit to go elsewhere.
    pub async fn before(&self, of: &BreakerOf) -> Result<Pass, Circuit> {
        let state = self.state(of).await;
        let dirty = state.failures > 0 || state.open_until_ms.is_some();
        match state.open_until_ms {
            None => {
                return Ok(Pass {
                    probe: false,
                    dirty,
                });
            }
            Some(until) if now_ms() < until => return Err(circuit(&of.runtime, &state)),
            // The cooldown is over: only the breaker may hand out the one probe.
            Some(_) => {}
        }
        match self.ask(of, Ask::Dispatch).await {
            Some(BreakerAnswer {
                grant: Grant::Skip,
                state,
            }) => Err(circuit(&of.runtime, &state)),
            Some(answer) => Ok(Pass {
                probe: answer.grant == Grant::Probe,
                dirty: true,
            }),
            None => Ok(Pass {
                probe: false,
                dirty,
            }),
        }
    }

    /// After a dispatch the breaker let through: `reached` the runtime, or failed with a
    /// retryable infra failure of its own. Returns the circuit when the breaker was told.
    pub async fn after(&self, of: &BreakerOf, pass: Pass, reached: bool) -> Option<Circuit> {
        if reached && !pass.dirty && !pass.probe {
            return None;
        }
        let ask = Ask::Report {
            ok: reached,
            probe: pass.probe,
        };
        let answer = self.ask(of, ask).await?;
        Some(circuit(&of.runtime, &answer.state))
    }

    /// The breaker's state: cached, else queried. A runtime without a breaker is closed.
    async fn state(&self, of: &BreakerOf) -> BreakerState {
        let id = of.id();
        if let Some((at, state)) = self.seen.lock().expect("lock").get(&id)
            && at.elapsed() < FRESH_FOR
        {
            return *state;
        }
        let Some(client) = &self.client else {
            return BreakerState::default();
        };
        let handle = client.get_workflow_handle::<RuntimeBreaker>(id.clone());
        let query = handle.query(RuntimeBreaker::state, (), WorkflowQueryOptions::default());
        let state = match tokio::time::timeout(CALL_WITHIN, query).await {
            Ok(Ok(state)) => state,
            Ok(Err(WorkflowQueryError::NotFound(_))) => BreakerState::default(),
            Ok(Err(e)) => {
                tracing::warn!(breaker = %id, "the breaker could not be read, so it is passed: {e}");
                return BreakerState::default();
            }
            Err(_) => {
                tracing::warn!(breaker = %id, "the breaker did not answer in time, so it is passed");
                return BreakerState::default();
            }
        };
        self.remember(id, state);
        state
    }

    /// Asks the breaker, starting it if it is not running. `None`: it could not be asked.
    async fn ask(&self, of: &BreakerOf, ask: Ask) -> Option<BreakerAnswer> {
        let client = self.client.as_ref()?;
        let id = of.id();
        let options = start_or_ask(&id);
        let input = BreakerInput {
            runtime: of.runtime.clone(),
            state: BreakerState::default(),
        };
        let request = BreakerAsk {
            runtime: of.runtime.clone(),
            settings: of.settings,
            ask,
        };
        let call = client.execute_update_with_start_workflow(
            RuntimeBreaker::run,
            input,
            RuntimeBreaker::ask,
            request,
            options,
        );
        match tokio::time::timeout(CALL_WITHIN, call).await {
            Ok(Ok(answer)) => {
                self.remember(id, answer.state);
                Some(answer)
            }
            Ok(Err(e)) => {
                tracing::warn!(breaker = %id, "the breaker could not be asked: {e}");
                None
            }
            Err(_) => {
                tracing::warn!(breaker = %id, "the breaker did not answer in time");
                None
            }
        }
    }

    fn remember(&self, id: String, state: BreakerState) {
        self.seen
            .lock()
            .expect("lock")
            .insert(id, (Instant::now(), state));
    }
}
