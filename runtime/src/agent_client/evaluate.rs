//! The evaluation of an agent's job: the agent runs the evaluator where the actor ran, inside
//! the job's cgroup, and its cleanup receipt covers it; the worker asks (Evaluate, retried
//! while the agent is unreachable, heartbeating meanwhile), then fetches the evaluator's
//! result and logs into the bundle.

use std::sync::Mutex;

use casebatch_attempt::{Attempt, EvaluationRecord, Liveness};
use casebatch_proto::runtime_v1 as wire;
use casebatch_proto::{Failure, FailureCode, JobRef, Stage};

use super::client::AgentClient;
use super::error::AgentError;
use super::target::AgentTarget;
use super::waits::beating;

impl AgentClient {
    pub(crate) async fn evaluate_remote(
        &self,
        t: &AgentTarget,
        env: &Attempt,
        job: &JobRef,
        live: &dyn Liveness,
    ) -> EvaluationRecord {
        if env.job.evaluator.is_none() {
            return EvaluationRecord::not_configured();
        }
        let job = Mutex::new(JobRef {
            runtime: Some(t.name.clone()),
            host_queue: None,
            ..job.clone()
        });
        let every = self.timing.heartbeat_every;
        // Not stopped by a cancel: the evaluation ends by itself (or by the attempt's
        // cleanup on the agent), and its record stands for a retried settle.
        let work = async {
            let record = self.evaluation(t, env).await?;
            self.fetch_evaluator_files(t, env).await;
            Ok::<_, Failure>(record)
        };
        match beating(live, &job, every, false, work).await {
            Some(Ok(record)) => record,
            Some(Err(f)) => EvaluationRecord::failed(f),
            None => unreachable!("beating without stop_on_cancel always finishes its work"),
        }
    }

    /// The agent's evaluation, asked again while the agent is unreachable (within the grace):
    /// a repeated Evaluate returns the one the agent ran or is running.
    async fn evaluation(
        &self,
        t: &AgentTarget,
        env: &Attempt,
    ) -> Result<EvaluationRecord, Failure> {
        let mut outage = self.outage(t.grace_or(self.timing.unreachable_grace));
        let answer = loop {
            match self.evaluate_once(t, env).await {
                Ok(e) => break e,
                // Refused (an agent without Evaluate, a job cleaned up unevaluated): the
                // same call fails the same way.
                Err(AgentError::Refused(m)) => {
                    return Err(Failure::config(
                        Stage::Evaluate,
                        FailureCode::EvaluatorFailed,
                        m,
                    ));
                }
                Err(e) => outage
                    .next(e)
                    .await
                    .map_err(|e| e.failure(Stage::Evaluate))?,
            }
        };
        EvaluationRecord::from_wire(answer).map_err(|why| {
            Failure::infra(
                Stage::Evaluate,
                FailureCode::ActivityError,
                format!(
                    "{} sent an unusable evaluation of job {}: {why}",
                    t.named(),
                    env.marker()
                ),
            )
        })
    }

    /// The evaluator's result and logs into the bundle. The verdict is already known: files
    /// that do not arrive are named in the log and the timeline, and the verdict stands.
    async fn fetch_evaluator_files(&self, t: &AgentTarget, env: &Attempt) {
        let mut outage = self.outage(t.grace_or(self.timing.unreachable_grace));
        let fetched = loop {
            match self.fetch_once(t, env, wire::ArtifactSet::Evaluator).await {
                Ok(Ok(f)) => break Ok(f),
                Ok(Err(write)) => break Err(write),
                Err(e) => {
                    if let Err(e) = outage.next(e).await {
                        break Err(e.to_string());
                    }
                }
            }
        };
        let missing = match fetched {
            Ok(f) if f.refused.is_empty() => return,
            Ok(f) => f
                .refused
                .iter()
                .map(|(path, why)| format!("{path:?} {why}"))
                .collect::<Vec<_>>()
                .join("; "),
            Err(why) => why,
        };
        tracing::warn!(job = %env.marker(), "the evaluator's files not fetched whole: {missing}");
        env.event(
            "artifacts_refused",
            format!("evaluator's files from {}: {missing}", t.named()),
        );
    }
}
