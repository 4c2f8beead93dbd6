//! The client against a closed port (an agent that is down). Everything it does against a real
//! `casebatch agent` (watching through an agent restart, files streamed back, tokens, a full
//! envelope, cancel) is proven end to end in `tests/integration/agent_batches.rs`.

use std::sync::Mutex;
use std::time::Duration;

use casebatch_manifest::model::{PlannedCase, RuntimeKind, RuntimeSpec};
use casebatch_proto::{ActorStatus, AttemptKey, FailureClass, FailureCode, JobRef};

use casebatch_proto::runtime_v1 as wire;

use super::*;
use crate::AttemptEnv;

/// An endpoint where nothing listens.
fn closed_endpoint() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

fn env(root: &std::path::Path, endpoint: &str, token_file: Option<String>) -> AttemptEnv {
    let case: PlannedCase = serde_json::from_value(serde_json::json!({
        "index": 0,
        "case_id": "c",
        "case_dir": "c",
        "runtime": "agent",
        "runtime_name": "gpu",
        "harness": "true",
        "resources": {},
        "timeout_seconds": 60,
        "input": {"query": "q"},
        "source": {"line": null, "runspec": null},
    }))
    .unwrap();
    let key = AttemptKey {
        batch_id: "b".into(),
        bundle_dir: root.display().to_string(),
        case_index: 0,
        attempt: 1,
        memory_boost_mb: None,
        runtime: None,
    };
    AttemptEnv::new(key, case).with_runtime_spec(RuntimeSpec {
        kind: RuntimeKind::Agent,
        endpoint: Some(endpoint.into()),
        token_env: None,
        token_file,
        tls_ca: None,
        max_concurrent: None,
        memory_budget_mb: None,
        breaker_failures: None,
        breaker_cooldown_s: None,
        unreachable_grace_s: None,
        queue_limit: None,
        partition: None,
        account: None,
        qos: None,
        constraint: None,
        extra_args: Vec::new(),
    })
}

fn fast() -> AgentClient {
    AgentClient::new(Timing {
        unreachable_grace: Duration::from_millis(600),
        submit_grace: Duration::from_millis(300),
        cleanup_grace: Duration::from_millis(300),
        cancel_wait: Duration::from_secs(5),
        spill_grace: Duration::from_millis(300),
        max_backoff: Duration::from_millis(50),
        heartbeat_every: Duration::from_millis(50),
    })
}

/// The executor of `env`'s attempt on the agent its case names.
fn on<'a>(client: &'a AgentClient, env: &AttemptEnv) -> OnAgent<'a> {
    client.on(
        &env.case.case_id,
        env.case.runtime_name.as_deref(),
        env.runtime_spec.as_ref(),
    )
}

#[derive(Default)]
struct Live {
    cancelled: bool,
    beats: Mutex<Vec<JobRef>>,
}

#[async_trait]
impl Liveness for Live {
    async fn heartbeat(&self, job: &JobRef) {
        self.beats.lock().unwrap().push(job.clone());
    }
    fn is_cancelled(&self) -> bool {
        self.cancelled
    }
}

#[tokio::test]
async fn an_agent_that_is_down_is_unreachable_infra_naming_its_endpoint() {
    let root = tempfile::tempdir().unwrap();
    let endpoint = closed_endpoint();
    let env = env(root.path(), &endpoint, None);
    let client = fast();
    let rt = on(&client, &env);

    let f = rt.submit(&env).await.unwrap_err();
    assert!(!f.job_may_exist, "a refused connection reached nothing");
    let f = f.failure;
    assert_eq!(
        (f.class, f.code.clone(), f.retryable),
        (FailureClass::Infra, FailureCode::RuntimeUnreachable, true)
    );
    assert!(
        f.message.contains(&format!("runtime `gpu` at {endpoint}")),
        "{}",
        f.message
    );

    let live = Live::default();
    let job = rt.adopt(&env).unwrap();
    let r = rt.await_job(&env, &job, &live).await;
    assert_eq!(r.status, ActorStatus::Failed);
    let f = r.failure.unwrap();
    assert_eq!(f.code, FailureCode::RuntimeUnreachable);
    assert!(
        f.message.contains(&endpoint) && f.message.contains("no answer for"),
        "{}",
        f.message
    );
    // It heartbeat the job while it waited: another worker could adopt it by the key alone.
    let beats = live.beats.lock().unwrap().clone();
    assert!(beats.len() >= 3, "{} heartbeats", beats.len());
    assert_eq!(beats[0].marker, "b/0/1");
    assert_eq!(
        (beats[0].host_queue.as_deref(), beats[0].runtime.as_deref()),
        (None, Some("gpu"))
    );

    let receipt = rt.cleanup(&env).await;
    assert!(!receipt.cleanup_confirmed);
    assert!(receipt.message.contains(&endpoint), "{}", receipt.message);
}

#[tokio::test]
async fn an_evaluation_on_an_agent_that_is_down_is_unreachable_infra_and_heartbeats() {
    let root = tempfile::tempdir().unwrap();
    let endpoint = closed_endpoint();
    let mut env = env(root.path(), &endpoint, None);
    // What runs is the job (built from the case at the worker's edge): give it an evaluator.
    env.attempt.job.evaluator = Some(wire::Command::shell("true"));
    let client = fast();
    let rt = on(&client, &env);
    let live = Live::default();
    let job = rt.adopt(&env).unwrap();
    let record = rt.evaluate(&env, &job, &live).await;
    assert!(record.configured && record.verdict.is_none());
    let f = record.failure.unwrap();
    assert_eq!(
        (f.stage, f.class, f.code.clone(), f.retryable),
        (
            casebatch_proto::Stage::Evaluate,
            FailureClass::Infra,
            FailureCode::RuntimeUnreachable,
            true
        )
    );
    assert!(f.message.contains(&endpoint), "{}", f.message);
    assert!(
        live.beats.lock().unwrap().len() >= 3,
        "it heartbeat while it waited"
    );
    // No evaluator: nothing is asked of the agent.
    env.attempt.job.evaluator = None;
    assert!(!rt.evaluate(&env, &job, &live).await.configured);
}

/// A contract v1 agent, as far as a v2 worker can tell: it reads `planned_case_json` (empty
/// from a v2 worker, so it refuses the submit the way v1 agents did) and its Health carries
/// no contract version. Everything else is never called.
#[derive(Default)]
struct OldAgent {
    submitted: Mutex<Vec<wire::SubmitRequest>>,
}

type Stream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl wire::runtime_server::Runtime for OldAgent {
    async fn submit(
        &self,
        request: tonic::Request<wire::SubmitRequest>,
    ) -> Result<tonic::Response<wire::Job>, tonic::Status> {
        let req = request.into_inner();
        let parsed = serde_json::from_slice::<serde_json::Value>(&req.planned_case_json);
        self.submitted.lock().unwrap().push(req);
        let e = parsed.expect_err("a v2 worker sends no planned case");
        // A v1 agent's exact refusal (agent/src/jobs.rs before contract v2).
        Err(tonic::Status::invalid_argument(format!(
            "planned_case_json is not a planned case: {e}"
        )))
    }
    type WatchStream = Stream<wire::Job>;
    async fn watch(
        &self,
        _: tonic::Request<wire::JobRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn get(
        &self,
        _: tonic::Request<wire::JobRequest>,
    ) -> Result<tonic::Response<wire::Job>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn kill(
        &self,
        _: tonic::Request<wire::KillRequest>,
    ) -> Result<tonic::Response<wire::KillReply>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn cleanup(
        &self,
        _: tonic::Request<wire::JobRequest>,
    ) -> Result<tonic::Response<wire::CleanupReceipt>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    type FetchArtifactsStream = Stream<wire::ArtifactChunk>;
    async fn fetch_artifacts(
        &self,
        _: tonic::Request<wire::FetchRequest>,
    ) -> Result<tonic::Response<Self::FetchArtifactsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn evaluate(
        &self,
        _: tonic::Request<wire::JobRequest>,
    ) -> Result<tonic::Response<wire::Evaluation>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn capacity(
        &self,
        _: tonic::Request<wire::CapacityRequest>,
    ) -> Result<tonic::Response<wire::CapacityReply>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn health(
        &self,
        _: tonic::Request<wire::HealthRequest>,
    ) -> Result<tonic::Response<wire::HealthReply>, tonic::Status> {
        // Built as a v1 agent built it: the version field did not exist (0 on the wire).
        Ok(tonic::Response::new(wire::HealthReply {
            version: "0.1.0".into(),
            hostname: "old-box".into(),
            uptime_ms: 1,
            reattached: 0,
            ..Default::default()
        }))
    }
}

#[tokio::test]
async fn a_v1_agent_is_a_config_failure_saying_to_upgrade_the_agent() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let old = std::sync::Arc::new(OldAgent::default());
    let server = tonic::transport::Server::builder().serve_with_incoming(
        wire::runtime_server::RuntimeServer::from_arc(old.clone()),
        tonic::transport::server::TcpIncoming::from(listener),
    );
    let served = tokio::spawn(server);

    let root = tempfile::tempdir().unwrap();
    let env = env(root.path(), &endpoint, None);
    let client = fast();
    let refused = on(&client, &env).submit(&env).await.unwrap_err();
    assert!(!refused.job_may_exist, "a refusal started nothing");
    let f = refused.failure;
    assert_eq!(
        (f.class, f.code.clone(), f.retryable),
        (FailureClass::Config, FailureCode::RuntimeContract, false),
        "{f:?}"
    );
    assert!(
        f.message
            .contains("agent speaks contract v1, this worker needs v2: upgrade the agent"),
        "{}",
        f.message
    );
    assert!(f.message.contains(&endpoint), "{}", f.message);
    // Asked once: a config failure is not retried within the submit's grace either.
    let sent = old.submitted.lock().unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].contract_version, wire::CONTRACT_VERSION);
    assert_eq!(sent[0].job.as_ref(), Some(&env.job));
    served.abort();
}

/// A v2 agent names both versions itself when a worker of another version asks.
#[test]
fn an_agents_own_version_refusal_is_a_contract_failure() {
    let spec = env(std::path::Path::new("/b"), "http://127.0.0.1:1", None);
    let t = AgentTarget::of(
        &spec.case.case_id,
        spec.case.runtime_name.as_deref(),
        spec.runtime_spec.as_ref(),
    )
    .unwrap();
    let status = tonic::Status::failed_precondition(
        "this worker speaks contract v3, this agent speaks contract v2: upgrade the agent",
    );
    let e = AgentError::from_status(&t, "submit of job b/0/1", &status);
    assert!(matches!(e, AgentError::Contract(_)), "{e:?}");
    let f = e.failure(casebatch_proto::Stage::Submit);
    assert_eq!(
        (f.class, f.code),
        (FailureClass::Config, FailureCode::RuntimeContract)
    );
}
