//! What every stage activity of a case works in: the activities' shared state (the worker's
//! runtimes, the plans it has indexed, the breakers and paces it consults), the attempt an
//! activity is about, its liveness, and how it heartbeats.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use casebatch_attempt::hostname;
use casebatch_bundle::{AttemptJournal, Bundle, BundleError, PlanIndex};
use casebatch_manifest::model::RuntimeSpec;
use casebatch_proto::{AttemptKey, Failure, FailureCode, JobRef, Stage};
use casebatch_runtime::{AttemptEnv, Liveness, Runtimes};
use casebatch_telemetry::Metrics;
use temporalio_sdk::ApplicationFailure;
use temporalio_sdk::activities::ActivityError;

use crate::beats::StageContext;
use crate::breakers::{BreakerOf, Breakers};

/// The stage activities. One instance per worker; runtimes keep per-process state (children
/// this worker spawned, connections to agents) and plans are indexed once per bundle because
/// they never change (a case is read from the file when an activity needs it: a worker never
/// holds a 100,000-case plan whole).
#[derive(Default)]
pub struct CaseActivities {
    /// Where attempts run: one executor picked per attempt ([`Runtimes::executor`]).
    pub(crate) runtimes: Runtimes,
    plans: Mutex<HashMap<String, Arc<PlanIndex>>>,
    /// Without a client (unit tests) every breaker reads as closed.
    pub(crate) breakers: Breakers,
    /// For the shared paces (`reserve_start`); `None` on the host queue's instance, which
    /// never gets that activity.
    pub(crate) client: Option<temporalio_client::Client>,
    /// Recorded as attempts end; a no-op meter unless the worker serves metrics.
    pub(crate) metrics: Metrics,
    /// Set by the worker as it begins shutting down.
    pub(crate) stopping: Stopping,
    /// The shared runtimes' capacities this worker learned (`ask_slot`).
    pub(crate) capacities: crate::slots::Capacities,
    /// The shared runtimes this worker asked for slots ([`CaseActivities::slots_metrics`]).
    pub(crate) asked: Arc<crate::slots::Asked>,
}

/// Whether this process's worker is shutting down. The SDK cancels the activities still
/// running when its grace period ends and does not say why, so the worker says it here, for
/// the log of a cancelled wait (no cancelled wait kills its job). Cloning shares the flag.
#[derive(Clone, Debug, Default)]
pub struct Stopping(Arc<AtomicBool>);

impl Stopping {
    pub fn begin(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Heartbeats through the activity context.
pub(crate) struct ActivityLiveness<'a> {
    pub(crate) ctx: &'a StageContext,
}

#[async_trait]
impl Liveness for ActivityLiveness<'_> {
    async fn heartbeat(&self, job: &JobRef) {
        self.ctx.heartbeat(job.clone()).await;
    }
    fn is_cancelled(&self) -> bool {
        self.ctx.is_cancelled()
    }
    // The SDK does not say why a wait was cancelled (a batch cancel, the worker stopping, or
    // heartbeats a stalled engine did not answer in time), and none of them is a reason to
    // kill the job: the default `OnCancel::EndWait` leaves it to cleanup or to the retry.
}

impl CaseActivities {
    /// Activities that consult the runtimes' circuit breakers and the shared paces through
    /// `client`.
    pub fn with_breakers(client: temporalio_client::Client) -> Self {
        Self {
            breakers: Breakers::new(client.clone()),
            client: Some(client),
            ..Self::default()
        }
    }

    /// The same, recording into `metrics`.
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        Self { metrics, ..self }
    }

    /// What keeps the slots metrics of the shared runtimes these activities ask of (run it
    /// beside the worker while it serves metrics); `None` without a client.
    pub fn slots_metrics(&self) -> Option<impl std::future::Future<Output = ()> + use<>> {
        let client = self.client.clone()?;
        Some(crate::slots::watch(
            client,
            self.asked.clone(),
            self.metrics.clone(),
        ))
    }

    /// The same, handing jobs back once `stopping` is set.
    pub fn with_stopping(self, stopping: Stopping) -> Self {
        Self { stopping, ..self }
    }

    pub(crate) fn plan(&self, bundle_dir: &str) -> Result<Arc<PlanIndex>, ActivityError> {
        if let Some(p) = self.plans.lock().expect("lock").get(bundle_dir) {
            return Ok(p.clone());
        }
        let plan =
            Arc::new(PlanIndex::open(&Bundle::at(bundle_dir).plan()).map_err(unreadable_plan)?);
        self.plans
            .lock()
            .expect("lock")
            .insert(bundle_dir.to_string(), plan.clone());
        Ok(plan)
    }

    pub(crate) fn env(&self, key: &AttemptKey) -> Result<AttemptEnv, ActivityError> {
        let index = self.plan(&key.bundle_dir)?;
        let plan = index.plan();
        let mut case = index
            .case(key.case_index)
            .map_err(unreadable_plan)?
            .ok_or_else(|| {
                classified(&Failure::config(
                    Stage::Provision,
                    FailureCode::CaseNotInPlan,
                    format!(
                        "case index {} is not in the plan of {}: the bundle does not match the batch",
                        key.case_index, key.bundle_dir
                    ),
                ))
            })?;
        // A routed attempt runs where the workflow sent it, one of the case's list.
        if let Some(name) = &key.runtime {
            let (kind, spec) = plan.runtime_named(name).ok_or_else(|| {
                classified(&Failure::config(
                    Stage::Provision,
                    FailureCode::RuntimeUnreachable,
                    format!(
                        "runtime `{name}` is not in the runtimes table of {}: the bundle \
                         does not match the batch",
                        key.bundle_dir
                    ),
                ))
            })?;
            case.runtime = kind;
            case.runtime_name = spec.map(|_| name.clone());
        }
        // The case's entry of the runtimes table; a missing one is the runtime's to report
        // (a config failure of the stage, an unconfirmed cleanup), not an activity error.
        let spec = case
            .runtime_name
            .as_ref()
            .and_then(|n| plan.runtimes.get(n).cloned());
        let env = AttemptEnv::new(key.clone(), case);
        Ok(match spec {
            Some(spec) => env.with_runtime_spec(spec),
            None => env,
        })
    }

    /// The breaker a routed attempt consults; `None` for a case on one runtime.
    pub(crate) fn breaker_of(&self, env: &AttemptEnv) -> Option<BreakerOf> {
        let runtime = env.key.runtime.clone()?;
        let index = self.plan(&env.key.bundle_dir).ok()?;
        let plan = index.plan();
        let spec = plan.runtime_named(&runtime).and_then(|(_, spec)| spec);
        let settings = spec.map(RuntimeSpec::breaker).unwrap_or_default();
        Some(BreakerOf {
            id: plan.breaker_id(&runtime, &hostname())?,
            runtime,
            settings,
        })
    }
}

/// Shared storage can blip: an unreadable plan is infra, retried by the activity policy.
pub(crate) fn unreadable_plan(e: BundleError) -> ActivityError {
    classified(&Failure::infra(
        Stage::Provision,
        FailureCode::BundleUnreadable,
        e.to_string(),
    ))
}

/// A classified failure as a Temporal failure of type `casebatch.<class>`, so activity retry
/// policies key on the class; the whole [`Failure`] travels as the failure's details.
pub(crate) fn classified(f: &Failure) -> ActivityError {
    ActivityError::application(
        ApplicationFailure::builder(f.message.clone())
            .type_name(f.class.temporal_type())
            .non_retryable(!f.retryable)
            .details(f.clone())
            .build(),
    )
}

/// The attempt's journal, read on a blocking thread. One that cannot be read (replaced by
/// the attempt's processes, an I/O error) reads as empty, named in the log: what it would
/// have said is done again (an evaluation) or left out (timings).
pub(crate) async fn journal_of(env: &AttemptEnv) -> Arc<AttemptJournal> {
    let dir = env.dir.clone();
    let read = tokio::task::spawn_blocking(move || AttemptJournal::read(&dir)).await;
    match read {
        Ok(Ok(journal)) => journal,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the attempt's journal is unreadable");
            Arc::default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the attempt's journal failed");
            Arc::default()
        }
    }
}

/// One span per attempt: every log line of its stages carries batch, case and attempt.
pub(crate) fn attempt_span(env: &AttemptEnv) -> tracing::Span {
    tracing::info_span!(
        "attempt",
        batch = %env.key.batch_id,
        case = %env.case.case_id,
        attempt = env.key.attempt,
        runtime = env.case.runtime_label(),
    )
}

/// How often a working stage offers a heartbeat; [`StageContext`] sends one per the batch's
/// cadence (a few seconds by default), so a worker that dies mid-stage is noticed within
/// seconds and the stage retried elsewhere.
const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs `work`, heartbeating `details` until it is done.
pub(crate) async fn heartbeating<T, D>(
    ctx: &StageContext,
    details: D,
    work: impl std::future::Future<Output = T>,
) -> T
where
    D: temporalio_common::data_converters::TemporalSerializable + Clone + 'static,
{
    tokio::pin!(work);
    let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = beat.tick() => ctx.heartbeat(details.clone()).await,
        }
    }
}
