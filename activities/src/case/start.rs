//! `start`: an attempt's provision and submit (after its runtime's breaker, for a routed
//! case), a full runtime waited out without spending an attempt, and a short job watched and
//! settled in the same activity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use casebatch_attempt::SpecRecord;
use casebatch_bundle::{BundleError, Entry, RECORD_SCHEMA_VERSION};
use casebatch_manifest::model::RuntimeKind;
use casebatch_proto::{
    ActorStatus, FailureCode, JobRef, SettleShort, Stage, StageResult, StartInput, StartResult,
};
use casebatch_runtime::{AttemptEnv, Liveness, NotStarted};
use casebatch_workflows::decide;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tracing::Instrument;

use super::context::{CaseActivities, attempt_span, heartbeating, journal_of};
use super::settle::Ended;
use super::space::{bundle_write, make_dir, refused_write, with_space};
use crate::beats::StageContext;
use crate::timings::StageTimings;

/// Pauses between submits to a full runtime: 1 s, growing to 5 s.
const FULL_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
const FULL_MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// `start`'s liveness while it watches its job: the wait ends at `until` (or on cancel),
/// leaving the job running.
struct Watching<'a> {
    ctx: &'a StageContext,
    until: Instant,
}

#[async_trait]
impl Liveness for Watching<'_> {
    async fn heartbeat(&self, job: &JobRef) {
        self.ctx.heartbeat(job.clone()).await;
    }
    fn is_cancelled(&self) -> bool {
        self.ctx.is_cancelled() || Instant::now() >= self.until
    }
}

impl CaseActivities {
    pub(crate) async fn start_attempt(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: StartInput,
    ) -> Result<StartResult, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(input.key())?;
        let span = attempt_span(&env);
        async move {
            let mut timings = ctx.timings();
            // Heartbeating throughout: the breaker's answer can take a moment too.
            let start = async {
                // A routed case consults its runtime's breaker first: an open circuit sends it
                // elsewhere before anything is provisioned.
                let breaker = self.breaker_of(&env);
                let pass = match &breaker {
                    None => None,
                    Some(of) => match self.breakers.before(of).await {
                        Ok(pass) => Some(pass),
                        Err(circuit) => {
                            let message =
                                format!("runtime {}: circuit open, not dispatched", of.runtime);
                            env.event("circuit_open", message);
                            return Ok(StartResult::Skipped { circuit });
                        }
                    },
                };
                let mut result = self.dispatch_stage(&ctx, &env, &mut timings).await?;
                if let (Some(of), Some(pass)) = (&breaker, pass) {
                    match &mut result {
                        StartResult::Started(_) => {
                            self.breakers.after(of, pass, true).await;
                        }
                        // Only the runtime's own failures count against it.
                        StartResult::Failed {
                            failure, circuit, ..
                        } if decide::spills(failure) => {
                            *circuit = self.breakers.after(of, pass, false).await;
                        }
                        StartResult::Failed { .. }
                        | StartResult::Skipped { .. }
                        | StartResult::Watched { .. }
                        | StartResult::Settled { .. } => {}
                    }
                }
                Ok(result)
            };
            let started = heartbeating(&ctx, (), start).await;
            timings.append_to(&env);
            let started = match (started, input.settle()) {
                (Ok(StartResult::Started(job)), Some(short))
                    if self.runtimes.executor(&env).settles_at_start(&env) =>
                {
                    self.settle_short(&ctx, &env, job, short).await
                }
                (started, _) => started,
            };
            match &started {
                Ok(StartResult::Started(job) | StartResult::Watched { job, .. }) => {
                    tracing::info!(job = %job.marker, "started")
                }
                Ok(StartResult::Settled { job, .. }) => {
                    tracing::info!(job = %job.marker, "started and settled")
                }
                Ok(StartResult::Failed { failure, .. }) => {
                    tracing::info!(%failure, "start failed")
                }
                Ok(StartResult::Skipped { .. }) => tracing::info!("not dispatched: circuit open"),
                Err(e) => tracing::info!(error = ?e, "start raised"),
            }
            self.metrics.stage("start", began.elapsed());
            started
        }
        .instrument(span)
        .await
    }

    pub(crate) async fn provision_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
    ) -> Result<StageResult, ActivityError> {
        // A bundle the worker may not write fails the attempt as config, not the activity.
        if let Err(BundleError::Write { path, source }) =
            with_space(ctx, || make_dir(&env.dir)).await?
        {
            return match refused_write(Stage::Provision, &env.dir, &source) {
                Some(f) => Ok(StageResult::Failed(f)),
                None => Err(BundleError::Write { path, source }.into()),
            };
        }
        let spec = [Entry::Spec(SpecRecord {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            key: env.key.clone(),
            case: serde_json::to_value(&env.case).expect("planned cases always serialize"),
            simulated: env.case.runtime == RuntimeKind::Fake,
        })];
        bundle_write(ctx, Stage::Provision, || {
            env.record(&spec).map_err(BundleError::from)
        })
        .await?;
        let result = self.runtimes.executor(env).provision(env).await;
        Ok(match result {
            Ok(()) => StageResult::Ok,
            Err(f) => StageResult::Failed(f),
        })
    }

    pub(crate) async fn submit_stage(&self, env: &AttemptEnv) -> Result<JobRef, NotStarted> {
        self.runtimes.executor(env).submit(env).await
    }

    pub(crate) async fn settle_short(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        job: JobRef,
        short: &SettleShort,
    ) -> Result<StartResult, ActivityError> {
        let mut timings = ctx.timings();
        let live = Watching {
            ctx,
            until: Instant::now() + Duration::from_millis(short.within_ms),
        };
        let awaiting = self.metrics.awaiting(env.case.runtime.as_str());
        let executor = self.runtimes.executor(env);
        let watched = timings.time(Stage::Await, executor.await_job(env, &job, &live));
        let actor = watched.await;
        drop(awaiting);
        if actor.status == ActorStatus::Cancelled {
            // The watch is part of the attempt's wait, whatever comes next: settle's await
            // continues it.
            timings.append_to(env);
            if ctx.is_cancelled() {
                return Err(ActivityError::cancelled());
            }
            let heartbeats = ctx.sent();
            return Ok(StartResult::Watched { job, heartbeats });
        }
        let ended = Ended {
            job: job.clone(),
            actor,
            close_from: Some(short.close_from.clone()),
        };
        let settled = self.settle_ended(ctx, env, ended, timings).await?;
        Ok(StartResult::Settled {
            job,
            settled: Box::new(settled),
        })
    }

    /// Provision, then submit. A full runtime is waited out here, so a busy agent does not
    /// spend the case's attempts: the batch holds back what a runtime's declared envelope
    /// says, and this covers the rest (other batches, an agent's own limits).
    async fn dispatch_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        timings: &mut StageTimings,
    ) -> Result<StartResult, ActivityError> {
        let failed = |n: NotStarted| StartResult::Failed {
            failure: n.failure,
            host_queue: self.runtimes.executor(env).host_queue(),
            circuit: None,
            job_may_exist: n.job_may_exist,
        };
        // Provisioned ahead (`prepare`, which kept its own timing): ready as it is.
        if journal_of(env).await.prepared.is_none() {
            let provisioned = timings
                .time(Stage::Provision, self.provision_stage(ctx, env))
                .await?;
            if let StageResult::Failed(f) = provisioned {
                return Ok(failed(f.into()));
            }
        }
        let submitted = timings.time(Stage::Submit, self.submit_until_taken(ctx, env));
        Ok(match submitted.await? {
            Ok(job) => StartResult::Started(job),
            Err(n) => failed(n),
        })
    }

    /// Submits, waiting out a full runtime (the wait counts as the submit stage's time).
    async fn submit_until_taken(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
    ) -> Result<Result<JobRef, NotStarted>, ActivityError> {
        let mut pause = FULL_FIRST_PAUSE;
        let mut waiting = false;
        loop {
            match self.submit_stage(env).await {
                Err(n) if n.failure.code == FailureCode::RuntimeFull => {
                    if !waiting {
                        waiting = true;
                        let message = format!("waiting: {}", n.failure.message);
                        env.event("runtime_full", message);
                    }
                    tokio::select! {
                        _ = ctx.cancelled() => return Err(ActivityError::cancelled()),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(FULL_MAX_PAUSE);
                }
                taken_or_failed => return Ok(taken_or_failed),
            }
        }
    }
}
