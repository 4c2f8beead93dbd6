//! The single-stage activities of the local-activity pipeline (`workflows/src/case/legacy.rs`):
//! batches whose history began on it call them until their run ends. Each runs one stage of
//! the current activities.

use std::sync::Arc;

use casebatch_proto::{
    ActorReport, AttemptKey, AwaitInput, Evaluation, Failure, JobRef, StageResult, SubmitResult,
};
use temporalio_sdk::activities::{ActivityContext, ActivityError};

use super::context::CaseActivities;
use crate::beats::StageContext;

impl CaseActivities {
    pub(crate) async fn provision_alone(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<StageResult, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&key)?;
        self.provision_stage(&ctx, &env).await
    }

    pub(crate) async fn submit_alone(
        self: Arc<Self>,
        _ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<SubmitResult, ActivityError> {
        let env = self.env(&key)?;
        Ok(match self.submit_stage(&env).await {
            Ok(job) => SubmitResult::Started(job),
            Err(n) => SubmitResult::Failed(n.failure),
        })
    }

    pub(crate) async fn await_alone(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: AwaitInput,
    ) -> Result<ActorReport, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&input.key)?;
        Ok(self.await_stage(&ctx, &env, input.job).await?.1)
    }

    pub(crate) async fn evaluate_alone(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Evaluation, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&key)?;
        // The old pipeline passes no job: the runtime finds it by the attempt's key.
        let job = self
            .runtimes
            .executor(&env)
            .adopt(&env)
            .unwrap_or_else(|| JobRef {
                marker: env.marker(),
                pid: None,
                start_ticks: None,
                host_queue: self.runtimes.executor(&env).host_queue(),
                runtime: env.case.runtime_name.clone(),
                queued: false,
            });
        self.evaluate_stage(&ctx, &env, &job).await
    }

    pub(crate) async fn collect_alone(
        self: Arc<Self>,
        _ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Option<Failure>, ActivityError> {
        let env = self.env(&key)?;
        Ok(self.collect_stage(&env).await)
    }
}
