//! The client over real gRPC on loopback: against a closed port (the agent down), and against
//! a small stand-in agent that answers the protocol's way (`runtime.proto`) with scripted jobs.
//! End-to-end runs against the real `casebatch agent` live in the integration tests.

use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use casebatch_manifest::model::{PlannedCase, RuntimeKind, RuntimeSpec};
use casebatch_proto::runtime_v1::{self as wire, runtime_server};
use casebatch_proto::{ActorStatus, AttemptKey, FailureClass, FailureCode, JobRef};
use tonic::codegen::tokio_stream::{self, Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::*;

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A stand-in agent: jobs it knows end (finished, or cancelled once killed); `breaks` Watch
/// streams end early first, as when an agent restarts.
#[derive(Default)]
struct Stub {
    token: Option<String>,
    full: bool,
    known: bool,
    breaks: AtomicU32,
    killed: AtomicBool,
    chunks: Vec<(&'static str, &'static [u8])>,
}

impl Stub {
    fn check<T>(&self, r: &Request<T>) -> Result<(), Status> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        match r
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
        {
            Some(v) if v == format!("Bearer {token}") => Ok(()),
            Some(_) => Err(Status::unauthenticated("wrong bearer token")),
            None => Err(Status::unauthenticated("missing bearer token")),
        }
    }

    fn job(key: &str, state: wire::JobState, report: Option<wire::ActorReport>) -> wire::Job {
        wire::Job {
            job_key: key.into(),
            state: state as i32,
            pid: Some(4242),
            start_ticks: Some(77),
            starts: 1,
            report,
            ..Default::default()
        }
    }
}

fn report(status: wire::ActorStatus, exit: i32) -> wire::ActorReport {
    wire::ActorReport {
        status: status as i32,
        exit_code: Some(exit),
        ..Default::default()
    }
}

#[tonic::codegen::async_trait]
impl runtime_server::Runtime for Stub {
    async fn submit(&self, r: Request<wire::SubmitRequest>) -> Result<Response<wire::Job>, Status> {
        self.check(&r)?;
        if self.full {
            return Err(Status::resource_exhausted("2 of 2 jobs in flight"));
        }
        let k = r.into_inner().key.unwrap();
        let key = format!("{}/{}/{}", k.batch_id, k.case_index, k.attempt);
        Ok(Response::new(Self::job(
            &key,
            wire::JobState::Running,
            None,
        )))
    }

    type WatchStream = Stream_<wire::Job>;
    async fn watch(
        &self,
        r: Request<wire::JobRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.check(&r)?;
        let key = r.into_inner().job_key;
        if !self.known {
            return Err(Status::not_found(format!("no job {key}")));
        }
        let running = Self::job(&key, wire::JobState::Running, None);
        let s: Self::WatchStream = if self.killed.load(Ordering::SeqCst) {
            let ended = report(wire::ActorStatus::Cancelled, 137);
            let ended = Self::job(&key, wire::JobState::Ended, Some(ended));
            Box::pin(tokio_stream::iter([Ok(ended)]))
        } else if self.chunks.is_empty() {
            // Runs until killed.
            Box::pin(tokio_stream::iter([Ok(running)]).chain(tokio_stream::pending()))
        } else if self.breaks.load(Ordering::SeqCst) > 0 {
            self.breaks.fetch_sub(1, Ordering::SeqCst);
            Box::pin(tokio_stream::iter([Ok(running)]))
        } else {
            let ended = report(wire::ActorStatus::Finished, 0);
            let ended = Self::job(&key, wire::JobState::Ended, Some(ended));
            Box::pin(tokio_stream::iter([Ok(running), Ok(ended)]))
        };
        Ok(Response::new(s))
    }

    async fn get(&self, _: Request<wire::JobRequest>) -> Result<Response<wire::Job>, Status> {
        Err(Status::unimplemented("not in the stand-in"))
    }

    async fn kill(
        &self,
        r: Request<wire::KillRequest>,
    ) -> Result<Response<wire::KillReply>, Status> {
        self.check(&r)?;
        self.killed.store(true, Ordering::SeqCst);
        Ok(Response::new(wire::KillReply::default()))
    }

    async fn cleanup(
        &self,
        r: Request<wire::JobRequest>,
    ) -> Result<Response<wire::CleanupReceipt>, Status> {
        self.check(&r)?;
        let key = r.into_inner().job_key;
        if !self.known {
            return Err(Status::not_found(format!("no job {key}")));
        }
        Ok(Response::new(wire::CleanupReceipt {
            job_key: key,
            cleanup_confirmed: true,
            killed: vec![4242],
            scans: 2,
            message: "no process carrying the allocation marker is left".into(),
            ..Default::default()
        }))
    }

    type FetchArtifactsStream = Stream_<wire::ArtifactChunk>;
    async fn fetch_artifacts(
        &self,
        r: Request<wire::JobRequest>,
    ) -> Result<Response<Self::FetchArtifactsStream>, Status> {
        self.check(&r)?;
        let chunks: Vec<_> = self
            .chunks
            .iter()
            .map(|(path, data)| {
                Ok(wire::ArtifactChunk {
                    path: (*path).into(),
                    data: data.to_vec(),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn capacity(
        &self,
        _: Request<wire::CapacityRequest>,
    ) -> Result<Response<wire::CapacityReply>, Status> {
        Err(Status::unimplemented("not in the stand-in"))
    }

    async fn health(
        &self,
        _: Request<wire::HealthRequest>,
    ) -> Result<Response<wire::HealthReply>, Status> {
        Err(Status::unimplemented("not in the stand-in"))
    }
}

/// Serves `stub` on a loopback port for the test's lifetime; returns `http://127.0.0.1:PORT`.
fn serve(stub: Stub) -> String {
    let incoming =
        tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .serve_with_incoming(runtime_server::RuntimeServer::new(stub), incoming),
    );
    format!("http://{addr}")
}

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
    };
    AttemptEnv::new(key, case).with_runtime_spec(RuntimeSpec {
        kind: RuntimeKind::Agent,
        endpoint: Some(endpoint.into()),
        token_env: None,
        token_file,
        tls_ca: None,
    })
}

fn fast() -> AgentRuntime {
    AgentRuntime::new(Timing {
        unreachable_grace: Duration::from_millis(600),
        submit_grace: Duration::from_millis(300),
        cleanup_grace: Duration::from_millis(300),
        cancel_wait: Duration::from_secs(5),
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
async fn a_job_is_watched_through_broken_streams_and_its_files_fetched() {
    let root = tempfile::tempdir().unwrap();
    let endpoint = serve(Stub {
        known: true,
        breaks: AtomicU32::new(2),
        chunks: vec![
            ("result.json", b"{\"status\":"),
            ("", b"\"finished\"}"),
            ("job.json", b"{\"starts\": 1}"),
            ("../escape", b"x"),
            ("output/a/b.txt", b"out"),
        ],
        ..Default::default()
    });
    let env = env(root.path(), &endpoint, None);
    let rt = fast();
    rt.provision(&env).await.unwrap();
    let job = rt.submit(&env).await.unwrap();
    assert_eq!(
        job,
        JobRef {
            marker: "b/0/1".into(),
            pid: Some(4242),
            start_ticks: Some(77),
            host_queue: None,
            runtime: Some("gpu".into()),
        }
    );
    let live = Live::default();
    let r = rt.await_job(&env, &job, &live).await;
    assert_eq!(
        (r.status, r.exit_code, r.failure),
        (ActorStatus::Finished, Some(0), None)
    );
    let read = |p: &str| std::fs::read_to_string(env.file(p)).unwrap();
    assert_eq!(read("result.json"), "{\"status\":\"finished\"}");
    assert_eq!(read("output/a/b.txt"), "out");
    assert_eq!(read("input.json"), "{\n  \"query\": \"q\"\n}\n");
    assert!(!root.path().join("cases/c/attempts/escape").exists());
    let events = std::fs::read_to_string(env.bundle.events()).unwrap();
    assert!(
        events.contains("artifacts_refused") && events.contains("../escape"),
        "{events}"
    );

    let receipt = rt.cleanup(&env).await;
    assert!(receipt.cleanup_confirmed, "{receipt:?}");
    assert_eq!((receipt.killed, receipt.scans), (vec![4242], 2));
}

#[tokio::test]
async fn tokens_are_checked_by_the_agent_and_refusals_name_their_source() {
    let root = tempfile::tempdir().unwrap();
    let endpoint = serve(Stub {
        token: Some("right-token".into()),
        known: true,
        ..Default::default()
    });
    let rt = fast();
    let f = rt
        .submit(&env(root.path(), &endpoint, None))
        .await
        .unwrap_err();
    assert_eq!(
        (f.class, f.code.clone()),
        (FailureClass::Config, FailureCode::RuntimeAuth)
    );
    assert!(f.message.contains("none is configured"), "{}", f.message);

    let file = root.path().join("token");
    std::fs::write(&file, "wrong-token\n").unwrap();
    let with_file = env(root.path(), &endpoint, Some(file.display().to_string()));
    let f = rt.submit(&with_file).await.unwrap_err();
    assert_eq!(
        (f.class, f.code.clone()),
        (FailureClass::Config, FailureCode::RuntimeAuth)
    );
    for part in [
        endpoint.as_str(),
        "runtime `gpu`",
        &file.display().to_string(),
    ] {
        assert!(
            f.message.contains(part),
            "{part} missing from {}",
            f.message
        );
    }
    assert!(
        !f.message.contains("wrong-token"),
        "the token leaked: {}",
        f.message
    );

    // Read per call: the right token works without a new runtime or channel.
    std::fs::write(&file, "right-token\n").unwrap();
    assert!(rt.submit(&with_file).await.is_ok());
}

#[tokio::test]
async fn an_unknown_job_is_lost_and_its_cleanup_confirmed() {
    let root = tempfile::tempdir().unwrap();
    let endpoint = serve(Stub::default());
    let env = env(root.path(), &endpoint, None);
    let rt = fast();
    let r = rt
        .await_job(&env, &rt.adopt(&env).unwrap(), &Live::default())
        .await;
    let f = r.failure.unwrap();
    assert_eq!(
        (f.class, f.code),
        (FailureClass::Infra, FailureCode::JobLost)
    );
    let receipt = rt.cleanup(&env).await;
    assert!(receipt.cleanup_confirmed);
    assert!(
        receipt.message.contains("nothing was submitted"),
        "{}",
        receipt.message
    );
}

#[tokio::test]
async fn a_full_agent_is_runtime_full_with_its_message() {
    let root = tempfile::tempdir().unwrap();
    let endpoint = serve(Stub {
        full: true,
        ..Default::default()
    });
    let f = fast()
        .submit(&env(root.path(), &endpoint, None))
        .await
        .unwrap_err();
    assert_eq!(
        (f.class, f.code.clone(), f.retryable),
        (FailureClass::Infra, FailureCode::RuntimeFull, true)
    );
    assert!(f.message.contains("2 of 2 jobs in flight"), "{}", f.message);
}

#[tokio::test]
async fn a_cancelled_await_kills_the_job_and_waits_for_its_end() {
    let root = tempfile::tempdir().unwrap();
    let stub = Stub {
        known: true,
        ..Default::default()
    };
    let endpoint = serve(stub);
    let env = env(root.path(), &endpoint, None);
    let rt = fast();
    let live = Live {
        cancelled: true,
        ..Default::default()
    };
    let r = rt.await_job(&env, &rt.adopt(&env).unwrap(), &live).await;
    assert_eq!(r.status, ActorStatus::Cancelled);
    // The stand-in ends a job's watch as cancelled only once it was killed.
    let watch_after = rt
        .watch_once(
            &AgentTarget::of(&env).unwrap(),
            "b/0/1",
            &Mutex::new(rt.adopt(&env).unwrap()),
            &mut calls::Outage::new(Duration::ZERO, Duration::ZERO),
        )
        .await
        .unwrap();
    let ended = watch_after.report.unwrap();
    assert_eq!(ended.status, wire::ActorStatus::Cancelled as i32);
}

#[test]
fn a_case_whose_runtime_entry_is_missing_is_a_config_failure() {
    let root = tempfile::tempdir().unwrap();
    let mut env = env(root.path(), "http://127.0.0.1:1", None);
    env.runtime_spec = None;
    let e = AgentTarget::of(&env).unwrap_err();
    assert!(
        matches!(&e, AgentError::Config(m) if m.contains("`gpu`") && m.contains("does not have"))
    );
    let f = e.failure(casebatch_proto::Stage::Submit);
    assert_eq!((f.class, f.retryable), (FailureClass::Config, false));
}
