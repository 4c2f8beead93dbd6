//! The client against a closed port (an agent that is down). Everything it does against a real
//! `casebatch agent` (watching through an agent restart, files streamed back, tokens, a full
//! envelope, cancel) is proven end to end in `tests/integration/agent_batches.rs`.

use std::sync::Mutex;
use std::time::Duration;

use casebatch_manifest::model::{PlannedCase, RuntimeKind, RuntimeSpec};
use casebatch_proto::{ActorStatus, AttemptKey, FailureClass, FailureCode, JobRef};

use super::*;

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
    })
}

fn fast() -> AgentRuntime {
    AgentRuntime::new(Timing {
        unreachable_grace: Duration::from_millis(600),
        submit_grace: Duration::from_millis(300),
        cleanup_grace: Duration::from_millis(300),
        cancel_wait: Duration::from_secs(5),
        spill_grace: Duration::from_millis(300),
        max_backoff: Duration::from_millis(50),
        heartbeat_every: Duration::from_millis(50),
    })
}

#[derive(Default)]
struct Live {
    cancelled: bool,
    beats: Mutex<Vec<JobRef>>,
}

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
    let rt = fast();

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
    env.case.evaluator = Some(casebatch_manifest::model::CommandSpec::Shell("true".into()));
    let rt = fast();
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
    env.case.evaluator = None;
    assert!(!rt.evaluate(&env, &job, &live).await.configured);
}
