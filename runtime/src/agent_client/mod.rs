//! The worker's client of a `casebatch agent` (gRPC,
//! `proto/casebatch/runtime/v1/runtime.proto`). Jobs run on the agent's host and outlive the
//! workers; any worker replica can drive any job, because every call names the job by its
//! attempt key (`<batch_id>/<case_index>/<attempt>`), never by a connection or a pid.
//!
//! - `provision` writes only the worker's side (the attempt directory, `input.json` for the
//!   bundle); the agent prepares its own.
//! - `submit` sends the attempt's job (`JobSpec`, built from the planned case by
//!   `job_spec::from_planned`) with this worker's contract version; a repeated submit returns
//!   the existing job. A full agent is `RUNTIME_FULL` (retryable infra); the caller decides
//!   whether to wait. An agent of another contract version is the config failure
//!   `RUNTIME_CONTRACT`, naming both versions and the side to upgrade.
//! - `await_job` watches the job, heartbeating its reference every second; a broken stream
//!   (the agent restarting) is watched again with backoff, until the agent has been
//!   unreachable for [`Timing::unreachable_grace`] (then `RUNTIME_UNREACHABLE`). When the job
//!   ends, its files are fetched into the bundle ([`artifacts`]) and the agent's classified
//!   report is returned. A cancelled wait leaves the job running (see [`OnCancel`]).
//! - `evaluate` asks the agent to run the job's evaluator where the actor ran, inside the
//!   job's cgroup (so the agent's cleanup receipt covers it); idempotent by key, retried while
//!   the agent is unreachable; then the evaluator's result and logs are fetched
//!   (`evaluate.rs`). An agent without the call is a config failure saying to upgrade it.
//! - `adopt` needs nothing but the key: the agent knows the rest.
//! - `cleanup` returns the agent's receipt; an agent that never heard of the key had
//!   nothing submitted, which is confirmed.

pub mod artifacts;
mod calls;
mod client;
mod error;
mod evaluate;
mod status;
mod target;
#[cfg(test)]
mod tests;
mod waits;

use std::sync::Mutex;

use async_trait::async_trait;
use casebatch_attempt::{
    Attempt, CleanupReceipt, EvaluationRecord, Executor, Liveness, NotStarted, OnCancel,
    RECORD_SCHEMA_VERSION, attempt_files, files,
};
use casebatch_manifest::model::RuntimeSpec;
use casebatch_proto::runtime_v1 as wire;
use casebatch_proto::{ActorReport, ActorStatus, Failure, FailureCode, JobRef, Stage};

pub use client::{AgentClient, Timing};
pub use error::AgentError;
pub use target::{AgentTarget, TABLE_KEYS, is_loopback};

use waits::beating;

fn failed(failure: Failure) -> ActorReport {
    ActorReport::failed(failure, None)
}

fn job_ref(t: &AgentTarget, key: String, job: Option<&wire::Job>) -> JobRef {
    JobRef {
        marker: key,
        pid: job.and_then(|j| j.pid),
        start_ticks: job.and_then(|j| j.start_ticks),
        // Any worker can reach the agent: settle and cleanup run on the shared queue.
        host_queue: None,
        runtime: Some(t.name.clone()),
        queued: false,
    }
}

impl AgentClient {
    /// Waits for the job to end; `Err` is the attempt's failure.
    async fn watch_to_end(
        &self,
        t: &AgentTarget,
        key: &str,
        job: &Mutex<JobRef>,
    ) -> Result<wire::Job, Failure> {
        let mut outage = self.outage(t.grace_or(self.timing.unreachable_grace));
        loop {
            let err = match self.watch_once(t, key, job, &mut outage).await {
                Ok(ended) => return Ok(ended),
                Err(e) => e,
            };
            if let Err(e) = outage.next(err).await {
                return Err(e.failure(Stage::Await));
            }
        }
    }

    /// The ended job's files into the bundle, retried while the agent is unreachable.
    async fn fetch(&self, t: &AgentTarget, env: &Attempt) -> Result<(), Failure> {
        let mut outage = self.outage(t.grace_or(self.timing.unreachable_grace));
        let fetched = loop {
            match self.fetch_once(t, env, wire::ArtifactSet::Actor).await {
                Ok(Ok(f)) => break f,
                Ok(Err(write)) => {
                    return Err(Failure::infra(
                        Stage::Await,
                        FailureCode::ActivityError,
                        format!(
                            "failed to write the artifacts of job {}: {write}",
                            env.marker()
                        ),
                    ));
                }
                Err(e) => outage.next(e).await.map_err(|e| e.failure(Stage::Await))?,
            }
        };
        if !fetched.refused.is_empty() {
            let list: Vec<String> = fetched
                .refused
                .iter()
                .map(|(path, why)| format!("{path:?} {why}"))
                .collect();
            tracing::warn!(job = %env.marker(), files = ?list, "artifacts not taken whole");
            env.event(
                "artifacts_refused",
                format!("from {}: {}", t.named(), list.join("; ")),
            );
        }
        if fetched.result_too_large {
            return Err(Failure::harness(
                Stage::Await,
                FailureCode::ResultTooLarge,
                format!(
                    "the harness's result was not fetched: it is larger than the worker's limit \
                     of {} bytes (worker setting {})",
                    files::max_result_bytes(),
                    files::MAX_RESULT_BYTES_ENV
                ),
            ));
        }
        Ok(())
    }

    /// Kills the job and waits (bounded) for it to end; the report of a cancelled attempt.
    async fn cancel(
        &self,
        t: &AgentTarget,
        key: &str,
        job: &Mutex<JobRef>,
        live: &dyn Liveness,
    ) -> ActorReport {
        let stop = async {
            let mut outage = self.outage(self.timing.cancel_wait);
            loop {
                match self.kill_once(t, key).await {
                    Ok(()) | Err(AgentError::NotFound(_)) => break,
                    Err(e) => {
                        if outage.next(e).await.is_err() {
                            return;
                        }
                    }
                }
            }
            loop {
                match self.watch_once(t, key, job, &mut outage).await {
                    Ok(_) | Err(AgentError::NotFound(_)) => return,
                    Err(e) => {
                        if outage.next(e).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        let every = self.timing.heartbeat_every;
        let bounded = tokio::time::timeout(self.timing.cancel_wait, stop);
        if beating(live, job, every, false, bounded)
            .await
            .and_then(Result::ok)
            .is_none()
        {
            tracing::warn!(job = key, agent = %t.named(), "the cancelled job did not end in time");
        }
        ActorReport::cancelled()
    }
}

impl AgentClient {
    /// Kills every job of a batch on the agent of a runtimes-table entry (`supersede`), retried
    /// while the agent is unreachable, within its grace. Returns the killed jobs' keys, or why
    /// the agent could not be asked.
    pub async fn kill_batch(
        &self,
        name: &str,
        spec: &RuntimeSpec,
        batch_id: &str,
    ) -> Result<Vec<String>, String> {
        let t = AgentTarget::from_spec(name, spec).map_err(|e| e.to_string())?;
        let mut outage = self.outage(t.grace_or(self.timing.submit_grace));
        loop {
            match self.kill_batch_once(&t, batch_id).await {
                Ok(killed) => return Ok(killed),
                Err(e) => {
                    if let Err(e) = outage.next(e).await {
                        return Err(e.to_string());
                    }
                }
            }
        }
    }
}

/// An attempt's executor on the agent its case names: the client, and the agent's entry
/// resolved (or why it could not be).
pub struct OnAgent<'a> {
    client: &'a AgentClient,
    target: Result<AgentTarget, AgentError>,
}

impl AgentClient {
    /// The executor of attempts of `case_id` on the runtimes-table entry `name` (`spec`).
    pub fn on(&self, case_id: &str, name: Option<&str>, spec: Option<&RuntimeSpec>) -> OnAgent<'_> {
        OnAgent {
            client: self,
            target: AgentTarget::of(case_id, name, spec),
        }
    }
}

#[async_trait]
impl Executor for OnAgent<'_> {
    async fn provision(&self, env: &Attempt) -> Result<(), Failure> {
        // The worker's half of the attempt directory, which the agent's files are fetched
        // into; the agent prepares its own, where the harness and the evaluator run.
        let fail = |e: String| Failure::infra(Stage::Provision, FailureCode::ProvisionIo, e);
        self.target
            .clone()
            .map_err(|e| e.failure(Stage::Provision))?;
        std::fs::create_dir_all(env.file(attempt_files::OUTPUT))
            .map_err(|e| fail(format!("{}: {e}", env.dir.display())))
    }

    async fn submit(&self, env: &Attempt) -> Result<JobRef, NotStarted> {
        let t = self.target.clone().map_err(|e| e.failure(Stage::Submit))?;
        let mut grace = t.grace_or(self.client.timing.submit_grace);
        // A routed attempt's case has other runtimes in its list: moving on costs nothing,
        // while waiting out an unreachable agent holds the case.
        if env.key.runtime.is_some() {
            grace = grace.min(self.client.timing.spill_grace);
        }
        // Idempotent by key, so a submit whose answer was lost is simply sent again.
        let mut outage = self.client.outage(grace);
        let mut may_have_reached = false;
        loop {
            match self.client.submit_once(&t, env).await {
                Ok(job) => return Ok(job_ref(&t, env.marker(), Some(&job))),
                Err(e) => {
                    may_have_reached |= e.may_have_reached();
                    // Nothing listens there: a routed attempt moves on at once.
                    let moves_on =
                        env.key.runtime.is_some() && matches!(e, AgentError::NoConnection(_));
                    let next = if moves_on {
                        Err(e)
                    } else {
                        outage.next(e).await
                    };
                    if let Err(e) = next {
                        return Err(NotStarted {
                            failure: e.failure(Stage::Submit),
                            job_may_exist: may_have_reached,
                        });
                    }
                }
            }
        }
    }

    async fn await_job(&self, env: &Attempt, job: &JobRef, live: &dyn Liveness) -> ActorReport {
        let t = match self.target.clone() {
            Ok(t) => t,
            Err(e) => return failed(e.failure(Stage::Await)),
        };
        let key = env.marker();
        let job = Mutex::new(JobRef {
            runtime: Some(t.name.clone()),
            host_queue: None,
            ..job.clone()
        });
        let every = self.client.timing.heartbeat_every;
        let ended = match beating(
            live,
            &job,
            every,
            true,
            self.client.watch_to_end(&t, &key, &job),
        )
        .await
        {
            // The job runs on: the attempt's cleanup stops it, or a retried wait re-attaches.
            None => match live.on_cancel() {
                OnCancel::EndWait => return ActorReport::cancelled(),
                OnCancel::Kill => return self.client.cancel(&t, &key, &job, live).await,
            },
            Some(Err(f)) => return failed(f),
            Some(Ok(ended)) => ended,
        };
        let report = ended
            .report
            .ok_or_else(|| "no report".to_string())
            .and_then(ActorReport::try_from);
        let report = match report {
            Ok(r) => r,
            Err(why) => {
                return failed(Failure::infra(
                    Stage::Await,
                    FailureCode::ActivityError,
                    format!(
                        "{} ended job {key} with an unusable report: {why}",
                        t.named()
                    ),
                ));
            }
        };
        // The job has ended: its files are fetched even if a cancel arrives meanwhile.
        match beating(live, &job, every, false, self.client.fetch(&t, env)).await {
            Some(Ok(())) => report,
            Some(Err(f)) => ActorReport {
                failure: Some(f),
                status: ActorStatus::Failed,
                ..report
            },
            None => unreachable!("beating without stop_on_cancel always finishes its work"),
        }
    }

    async fn evaluate(&self, env: &Attempt, job: &JobRef, live: &dyn Liveness) -> EvaluationRecord {
        match &self.target {
            Ok(t) => self.client.evaluate_remote(t, env, job, live).await,
            Err(e) => EvaluationRecord::failed(e.failure(Stage::Evaluate)),
        }
    }

    fn adopt(&self, env: &Attempt) -> Option<JobRef> {
        // The key is the job's name on the agent: await resolves the rest.
        let t = self.target.clone().ok()?;
        Some(job_ref(&t, env.marker(), None))
    }

    fn kill(&self, env: &Attempt) {
        // Best effort, from sync code: the channel and the call need the async runtime.
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(t) = self.target.clone() else {
            return;
        };
        let Ok(client) = self.client.client(&t) else {
            return;
        };
        let key = env.marker();
        handle.spawn(async move {
            if let Err(e) = calls::kill(client, &t, &key).await {
                tracing::warn!(job = key, "kill not delivered: {e}");
            }
        });
    }

    async fn cleanup(&self, env: &Attempt) -> CleanupReceipt {
        let key = env.marker();
        let receipt = |confirmed: bool, message: String, held_job: Option<bool>| CleanupReceipt {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker: key.clone(),
            cleanup_confirmed: confirmed,
            killed: Vec::new(),
            remaining: Vec::new(),
            scans: 0,
            message,
            method: None,
            checks: Vec::new(),
            escaped: Vec::new(),
            held_job,
            containers: Vec::new(),
            scheduler_job: None,
        };
        let t = match self.target.clone() {
            Ok(t) => t,
            Err(e) => return receipt(false, format!("the agent could not be asked: {e}"), None),
        };
        let mut outage = self
            .client
            .outage(t.grace_or(self.client.timing.cleanup_grace));
        loop {
            let err = match self.client.cleanup_once(&t, &key).await {
                Ok(r) => {
                    return CleanupReceipt {
                        schema_version: RECORD_SCHEMA_VERSION.into(),
                        marker: key,
                        cleanup_confirmed: r.cleanup_confirmed,
                        killed: r.killed,
                        remaining: r.remaining,
                        scans: r.scans,
                        message: format!("{}: {}", t.named(), r.message),
                        method: Some(r.method).filter(|m| !m.is_empty()),
                        checks: r.checks,
                        escaped: r.escaped,
                        held_job: Some(true),
                        containers: Vec::new(),
                        scheduler_job: None,
                    };
                }
                // The agent's table is durable: no entry means nothing was ever submitted, or
                // the job ended long ago and the agent's retention removed it, cleaned up.
                Err(AgentError::NotFound(_)) => {
                    return receipt(
                        true,
                        format!(
                            "{} holds nothing of this attempt (never submitted, or removed after --keep-ended)",
                            t.named()
                        ),
                        Some(false),
                    );
                }
                Err(e) => e,
            };
            if let Err(e) = outage.next(err).await {
                return receipt(
                    false,
                    format!("cleanup of job {key} not confirmed: {e}"),
                    None,
                );
            }
        }
    }

    /// Any worker reaches the agent: the stages run on the shared queue.
    fn settles_at_start(&self, _: &Attempt) -> bool {
        false
    }

    fn host_queue(&self) -> Option<String> {
        None
    }

    /// The agent's job record, fetched with the attempt's files, counts them.
    fn job_starts(&self, env: &Attempt) -> Option<u32> {
        casebatch_attempt::local::job::recorded_starts(env)
    }

    fn start_attempted(&self, env: &Attempt) -> bool {
        env.journal().map_or(true, |j| j.job.is_some())
    }

    fn is_remote(&self) -> bool {
        true
    }

    /// The agent reports what it ran; a retried wait stands for re-attaching.
    fn tells_adoption(&self) -> bool {
        false
    }
}
