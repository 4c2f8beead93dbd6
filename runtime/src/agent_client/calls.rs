//! The calls to an agent, one function each.

use std::sync::Mutex;
use std::time::Duration;

use casebatch_proto::JobRef;
use casebatch_proto::runtime_v1::{
    self as wire, ArtifactSet, CONTRACT_VERSION, FetchRequest, HealthRequest, JobRequest, JobState,
    KillRequest, SubmitRequest, contract_of, kill_request, runtime_client::RuntimeClient,
};
use tonic::transport::Channel;

use super::artifacts::{Fetched, Sink};
use super::client::AgentClient;
use super::error::AgentError;
use super::target::AgentTarget;
use super::waits::Outage;
use casebatch_attempt::{Attempt, files};

/// Deadline of a unary call (submit, kill); cleanup gets longer, it scans for processes.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(40);

fn status(t: &AgentTarget, what: &str) -> impl Fn(tonic::Status) -> AgentError {
    move |s| AgentError::from_status(t, what, &s)
}

fn job_request(key: &str) -> JobRequest {
    JobRequest {
        job_key: key.to_string(),
    }
}

/// Stops the job `key` on the agent.
pub(crate) async fn kill(
    mut client: RuntimeClient<Channel>,
    t: &AgentTarget,
    key: &str,
) -> Result<(), AgentError> {
    let what = format!("kill of job {key}");
    let request = KillRequest {
        target: Some(kill_request::Target::JobKey(key.to_string())),
    };
    let request = t.request(request, Some(CALL_TIMEOUT))?;
    client.kill(request).await.map_err(status(t, &what))?;
    Ok(())
}

impl AgentClient {
    /// Submits the attempt's job (idempotent by its key); returns the agent's job. An agent
    /// of another contract version is [`AgentError::Contract`]: a v2 one says so itself; a v1
    /// one refuses the request for its empty `planned_case_json`, which its Health confirms.
    pub(crate) async fn submit_once(
        &self,
        t: &AgentTarget,
        env: &Attempt,
    ) -> Result<wire::Job, AgentError> {
        let what = format!("submit of job {}", env.marker());
        let request = SubmitRequest {
            key: Some((&env.key).into()),
            planned_case_json: Vec::new(),
            contract_version: CONTRACT_VERSION,
            job: Some(env.job.clone()),
        };
        let request = t.request(request, Some(CALL_TIMEOUT))?;
        let refusal = match self.client(t)?.submit(request).await {
            Ok(job) => return Ok(job.into_inner()),
            Err(s) => s,
        };
        let err = AgentError::from_status(t, &what, &refusal);
        if !matches!(err, AgentError::Refused(_))
            || !refusal.message().contains("planned_case_json")
        {
            return Err(err);
        }
        match self.contract_version(t).await {
            Some(theirs) if theirs < CONTRACT_VERSION => Err(AgentError::Contract(format!(
                "{}: agent speaks contract v{theirs}, this worker needs v{CONTRACT_VERSION}: \
                 upgrade the agent (`casebatch agent` there) to this worker's casebatch ({})",
                t.named(),
                env!("CARGO_PKG_VERSION")
            ))),
            _ => Err(err),
        }
    }

    /// The contract version the agent's Health reports (`None` when it does not answer).
    async fn contract_version(&self, t: &AgentTarget) -> Option<u32> {
        let request = t.request(HealthRequest {}, Some(CALL_TIMEOUT)).ok()?;
        let reply = self.client(t).ok()?.health(request).await.ok()?;
        Some(contract_of(reply.into_inner().contract_version))
    }

    /// Watches the job until it ends (`Ok`, the last state) or the stream fails. Every state
    /// received marks the agent reached and updates `job` with the process it names.
    pub(crate) async fn watch_once(
        &self,
        t: &AgentTarget,
        key: &str,
        job: &Mutex<JobRef>,
        outage: &mut Outage,
    ) -> Result<wire::Job, AgentError> {
        let what = format!("watch of job {key}");
        let request = t.request(job_request(key), None)?;
        let mut stream = self
            .client(t)?
            .watch(request)
            .await
            .map_err(status(t, &what))?
            .into_inner();
        loop {
            let Some(state) = stream.message().await.map_err(status(t, &what))? else {
                return Err(AgentError::Unreachable(format!(
                    "{}: the {what} ended before the job did",
                    t.named()
                )));
            };
            outage.reached();
            {
                let mut j = job.lock().expect("lock");
                j.pid = state.pid.or(j.pid);
                j.start_ticks = state.start_ticks.or(j.start_ticks);
            }
            if state.state == JobState::Ended as i32 {
                return Ok(state);
            }
        }
    }

    /// Streams the ended job's files (the actor's or the evaluator's: `set`) into the attempt
    /// directory. `Err` from the agent is worth retrying when transient (files already
    /// written are rewritten whole).
    pub(crate) async fn fetch_once(
        &self,
        t: &AgentTarget,
        env: &Attempt,
        set: ArtifactSet,
    ) -> Result<Result<Fetched, String>, AgentError> {
        let key = env.marker();
        let what = match set {
            ArtifactSet::Actor => format!("fetch of the artifacts of job {key}"),
            ArtifactSet::Evaluator => format!("fetch of the evaluator's files of job {key}"),
        };
        let fetch = FetchRequest {
            job_key: key.clone(),
            set: set as i32,
        };
        let request = t.request(fetch, None)?;
        let mut stream = self
            .client(t)?
            .fetch_artifacts(request)
            .await
            .map_err(status(t, &what))?
            .into_inner();
        let mut sink = match Sink::new(&env.dir, files::max_result_bytes()) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e.to_string())),
        };
        while let Some(chunk) = stream.message().await.map_err(status(t, &what))? {
            if let Err(e) = sink.chunk(&chunk.path, &chunk.data) {
                return Ok(Err(e.to_string()));
            }
        }
        Ok(sink.finish().map_err(|e| e.to_string()))
    }

    /// Asks the agent for the attempt's evaluation (it runs the evaluator once, and returns
    /// the recorded evaluation to a repeated call). The deadline leaves the evaluator its
    /// whole timeout.
    pub(crate) async fn evaluate_once(
        &self,
        t: &AgentTarget,
        env: &Attempt,
    ) -> Result<wire::Evaluation, AgentError> {
        let key = env.marker();
        let what = format!("evaluation of job {key}");
        let deadline = Duration::from_secs(env.job.timeout_seconds.max(1)) + CALL_TIMEOUT;
        let request = t.request(job_request(&key), Some(deadline))?;
        let evaluation = self
            .client(t)?
            .evaluate(request)
            .await
            .map_err(|s| evaluate_error(t, &what, &s))?;
        Ok(evaluation.into_inner())
    }

    pub(crate) async fn kill_once(&self, t: &AgentTarget, key: &str) -> Result<(), AgentError> {
        kill(self.client(t)?, t, key).await
    }

    /// Stops every job of the batch on the agent; returns the keys of the jobs it stopped.
    pub(crate) async fn kill_batch_once(
        &self,
        t: &AgentTarget,
        batch_id: &str,
    ) -> Result<Vec<String>, AgentError> {
        let what = format!("kill of the jobs of batch {batch_id}");
        let request = KillRequest {
            target: Some(kill_request::Target::BatchId(batch_id.to_string())),
        };
        let request = t.request(request, Some(CALL_TIMEOUT))?;
        let reply = self
            .client(t)?
            .kill(request)
            .await
            .map_err(status(t, &what))?;
        Ok(reply.into_inner().killed_job_keys)
    }

    pub(crate) async fn cleanup_once(
        &self,
        t: &AgentTarget,
        key: &str,
    ) -> Result<wire::CleanupReceipt, AgentError> {
        let what = format!("cleanup of job {key}");
        let request = t.request(job_request(key), Some(CLEANUP_TIMEOUT))?;
        let receipt = self
            .client(t)?
            .cleanup(request)
            .await
            .map_err(status(t, &what))?;
        Ok(receipt.into_inner())
    }
}

/// What an Evaluate's status means; UNIMPLEMENTED is an agent from before evaluators ran
/// where the actor ran.
fn evaluate_error(t: &AgentTarget, what: &str, s: &tonic::Status) -> AgentError {
    if s.code() != tonic::Code::Unimplemented {
        return AgentError::from_status(t, what, s);
    }
    AgentError::Refused(format!(
        "{} cannot run the case's evaluator: it is older than this worker (its runtime service \
         has no Evaluate), and evaluators run where the actor ran; upgrade it to this worker's \
         casebatch ({})",
        t.named(),
        env!("CARGO_PKG_VERSION")
    ))
}

impl AgentClient {
    /// How many jobs the agent of the runtimes-table entry `name` runs at once
    /// (`--max-concurrent`), asked once: a shared runtime's slots.
    pub async fn capacity(
        &self,
        name: &str,
        spec: &casebatch_manifest::model::RuntimeSpec,
    ) -> Result<u32, AgentError> {
        let t = AgentTarget::from_spec(name, spec)?;
        let request = t.request(wire::CapacityRequest {}, Some(Duration::from_secs(5)))?;
        let reply = self.client(&t)?.capacity(request).await;
        Ok(reply
            .map_err(status(&t, "capacity"))?
            .into_inner()
            .max_concurrent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_without_evaluate_is_refused_naming_it_and_saying_to_upgrade() {
        let t = AgentTarget {
            name: "gpu".into(),
            endpoint: "https://agent.example:7070".into(),
            token: None,
            tls_ca: None,
            unreachable_grace: None,
        };
        let old = tonic::Status::unimplemented("unknown method Evaluate");
        let e = evaluate_error(&t, "evaluation of job b/0/1", &old);
        assert!(matches!(e, AgentError::Refused(_)), "{e:?}");
        for part in ["runtime `gpu` at https://agent.example:7070", "upgrade it"] {
            assert!(e.message().contains(part), "{part} missing from {e}");
        }
        // Any other status means what it means for every call.
        let down = tonic::Status::unavailable("restarting");
        assert!(evaluate_error(&t, "evaluation of job b/0/1", &down).is_transient());
    }
}
