//! `settle`: an attempt's wait for its job (re-attached after a crash by the heartbeat's job
//! reference or the attempt's key), then its evaluation and trace collection, and, for an
//! attempt that is final the moment it settles, its close.

use std::sync::Arc;
use std::time::Instant;

use casebatch_bundle::{BundleError, Entry, EvaluationRecord, attempt_files};
use casebatch_proto::{
    ActorReport, ActorStatus, AttemptSummary, Evaluation, Failure, FailureCode, JobRef,
    SettleInput, Settled, Stage,
};
use casebatch_runtime::AttemptEnv;
use casebatch_workflows::decide;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tracing::Instrument;

use super::cleanup::Closing;
use super::context::{ActivityLiveness, CaseActivities, attempt_span, heartbeating, journal_of};
use super::space::bundle_write;
use crate::beats::StageContext;
use crate::timings::StageTimings;

/// Waiting is `settle`'s only stage before the job ends: the await lines up with the attempt.
/// ('\n')
/// A job that ended, as the stages after its wait see it.
pub(crate) struct Ended {
    pub(crate) job: JobRef,
    pub(crate) actor: ActorReport,
    pub(crate) close_from: Option<AttemptSummary>,
}

impl CaseActivities {
    pub(crate) async fn settle_attempt(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: SettleInput,
    ) -> Result<Settled, ActivityError> {
        let first_try = ctx.info().attempt <= 1;
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(&input.key)?;
        if first_try && let Some(slot) = &input.slot {
            self.record_slot_wait(slot);
        }
        let span = attempt_span(&env);
        async move {
            let mut timings = ctx.timings();
            let awaiting = self.metrics.awaiting(env.case.runtime.as_str());
            let awaited = timings.time(Stage::Await, self.await_stage(&ctx, &env, input.job));
            let (job, actor) = awaited.await?;
            drop(awaiting);
            // Given back at once, while the job is evaluated; `settle` says whether it arrived.
            let given_back = input.slot.map(|slot| self.give_slot_back(slot));
            let ended = Ended {
                job,
                actor,
                close_from: input.close_from,
            };
            let mut settled = self.settle_ended(&ctx, &env, ended, timings).await?;
            if let Some(given_back) = given_back {
                settled.slot_returned = given_back.await.unwrap_or(false);
            }
            self.metrics.stage("settle", began.elapsed());
            Ok(settled)
        }
        .instrument(span)
        .await
    }

    /// Waits for the job to end. A retry of the activity (the previous worker died)
    /// re-attaches to the job named by the last heartbeat, or finds it by its case key.
    /// Returns the job it awaited with the report.
    pub(crate) async fn await_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        submitted: JobRef,
    ) -> Result<(JobRef, ActorReport), ActivityError> {
        let executor = self.runtimes.executor(env);
        let job = ctx
            .heartbeat_details()
            .deserialize::<JobRef>()
            .ok()
            .flatten()
            .or_else(|| executor.adopt(env))
            .unwrap_or(submitted);
        let retried = ctx.info().attempt > 1;
        let live = ActivityLiveness { ctx };
        let mut report = executor.await_job(env, &job, &live).await;
        // A local process knows whether it re-attached (see its module doc); for a simulation
        // (no process) and an agent (the job lives there, another worker's await died), a
        // retried await stands for re-attaching.
        report.adopted |= retried
            && !executor.tells_adoption()
            && report
                .failure
                .as_ref()
                .is_none_or(|f| f.code != FailureCode::JobLost);
        if report.adopted {
            env.event("adopted", format!("re-attached to job {}", job.marker));
        }
        if report.status == ActorStatus::Cancelled {
            if self.stopping.get() {
                tracing::info!(job = %job.marker, "worker stopping: the job is handed back to the engine's retry");
            } else {
                tracing::warn!(
                    job = %job.marker,
                    "the engine cancelled the wait (a batch cancel, or heartbeats it did not \
                     answer in time): the job runs on, for the attempt's cleanup or the \
                     engine's retry of the wait, which re-attaches"
                );
            }
            return Err(ActivityError::cancelled());
        }
        Ok((job, report))
    }

    /// The runtime evaluates the attempt where its actor ran (the fake one simulates it).
    pub(crate) async fn evaluate_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        job: &JobRef,
    ) -> Result<Evaluation, ActivityError> {
        // Run again after a crash: the verdict already written stands.
        if let Some(done) = &journal_of(env).await.evaluation {
            return Ok(done.to_evaluation());
        }
        // Without an evaluator, every executor records it as not configured (a simulation
        // gives its scripted verdict); then the case's `pass_when`, if any, gives the verdict
        // from the harness's score.
        let live = ActivityLiveness { ctx };
        let record = match self.runtimes.executor(env).evaluate(env, job, &live).await {
            r if r.configured => r,
            r => match &env.case.pass_when {
                Some(rule) => {
                    let scores = env.harness_result().await.scores;
                    EvaluationRecord::by_score(&rule.score, rule.at_least, &scores)
                }
                None => r,
            },
        };
        let evaluation = record.to_evaluation();
        let entry = [Entry::Evaluation(record)];
        bundle_write(ctx, Stage::Evaluate, || {
            env.record(&entry).map_err(BundleError::from)
        })
        .await?;
        Ok(evaluation)
    }

    /// Artifacts written to CASEBATCH_OUTPUT_DIR are already in the bundle; a trace the
    /// harness names is pulled here. A failure keeps the work (verdict, scores).
    pub(crate) async fn collect_stage(&self, env: &AttemptEnv) -> Option<Failure> {
        let trace = env.harness_trace().await?;
        crate::trace::collect(&trace, &env.file(attempt_files::TRACE))
            .await
            .err()
    }

    /// What `settle` does once the job ended: evaluate and collect for a finished actor, and
    /// close a final attempt as `cleanup` would (one round trip less). Shared by `settle` and
    /// by a `start` that saw its job end ([`Self::settle_short`]).
    pub(crate) async fn settle_ended(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        ended: Ended,
        mut timings: StageTimings,
    ) -> Result<Settled, ActivityError> {
        let Ended {
            job,
            actor,
            close_from,
        } = ended;
        tracing::info!(status = ?actor.status, exit_code = ?actor.exit_code, "job ended");
        let finished = actor.status == ActorStatus::Finished && actor.failure.is_none();
        let (evaluation, collect_failure) = if finished && !ctx.is_cancelled() {
            // Heartbeating the job: a retry after a crash here re-attaches to it.
            let judged = self.judge(ctx, env, &job, &mut timings);
            let (evaluation, collect_failure) = heartbeating(ctx, job.clone(), judged).await;
            (Some(evaluation), collect_failure)
        } else {
            (None, None)
        };
        let mut settled = Settled {
            key: env.key.clone(),
            actor,
            evaluation,
            collect_failure,
            closed: None,
            heartbeats: 0,
            slot_returned: false,
        };
        if let Some(mut summary) = close_from {
            summary.apply_settled(&settled);
            if decide::is_final_when_settled(&summary) {
                summary.ended_at_ms = Some(ctx.engine_now_ms());
                let timings = std::mem::replace(&mut timings, ctx.timings());
                let closing = Closing::of_final();
                let report = self.close(ctx, env, &summary, closing, timings).await?;
                summary.cleanup_confirmed = Some(report.cleanup_confirmed);
                settled.closed = Some(summary);
            }
        }
        timings.append_to(env);
        settled.heartbeats = ctx.sent();
        Ok(settled)
    }

    /// `start`'s watch of a job it started: up to `short.within_ms`, then either the job
    /// ended (settled here, no `settle` follows) or it runs on (`Started`, as ever). The
    /// wait only ends, never kills: a job still running is awaited by `settle` next, and a
    async fn judge(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        job: &JobRef,
        timings: &mut StageTimings,
    ) -> (Evaluation, Option<Failure>) {
        let evaluated = timings.time(Stage::Evaluate, self.evaluate_stage(ctx, env, job));
        let evaluation = evaluated.await.unwrap_or_else(|e| Evaluation {
            configured: true,
            verdict: None,
            failure: Some(Failure::infra(
                Stage::Evaluate,
                FailureCode::ActivityError,
                format!("failed to record the evaluation: {e:?}"),
            )),
        });
        let collect_failure = timings.time(Stage::Collect, self.collect_stage(env)).await;
        (evaluation, collect_failure)
    }
}
