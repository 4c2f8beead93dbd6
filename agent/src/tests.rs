//! The agent in-process on 127.0.0.1:0, called by a real tonic client, running real `sh`
//! harnesses. Every test uses its own batch id: the allocation marker (`<batch>/<case>/<n>`)
//! is how processes are found in `/proc`, and tests run in parallel in one process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use casebatch_proto::runtime_v1 as pb;
use casebatch_proto::runtime_v1::runtime_client::RuntimeClient;
use rusqlite::OpenFlags;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::{Agent, AgentConfig, AgentError, TokenSource};

struct TestAgent {
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<Result<(), AgentError>>,
    dir: tempfile::TempDir,
}

impl TestAgent {
    async fn start(configure: impl FnOnce(&mut AgentConfig)) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), configure).await
    }

    /// Starts on `dir/data`, which may hold an earlier agent's data dir.
    async fn start_in(dir: tempfile::TempDir, configure: impl FnOnce(&mut AgentConfig)) -> Self {
        let mut config =
            AgentConfig::local("127.0.0.1:0".parse().unwrap(), dir.path().join("data"));
        configure(&mut config);
        let agent = Agent::start(config).await.expect("agent starts");
        let addr = agent.addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(agent.serve(async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            served,
            dir,
        }
    }

    async fn client(&self) -> RuntimeClient<Channel> {
        RuntimeClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A file the harnesses use for side effects and gates.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Cleans up the jobs a test left uncleaned, as a worker closes its attempts, then stops.
    /// Their scratch space is on the host (`/tmp/casebatch-<uid>`), not in the test's own
    /// directory, and would otherwise pile up there run after run.
    async fn stop(mut self) {
        self.clean_up_jobs().await;
        let _ = self.stop.take().unwrap().send(());
        self.served.await.unwrap().expect("serves until stopped");
    }

    /// Best effort: an agent behind a token or TLS refuses this plain client, and a test that
    /// replaced the table leaves nothing to read.
    async fn clean_up_jobs(&self) {
        let table = self.data().join("jobs.sqlite");
        let uncleaned =
            rusqlite::Connection::open_with_flags(table, OpenFlags::SQLITE_OPEN_READ_ONLY)
                .and_then(|db| {
                    db.prepare("SELECT job_key FROM jobs WHERE cleaned_at_ms IS NULL")?
                        .query_map([], |row| row.get::<_, String>(0))?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .unwrap_or_default();
        if uncleaned.is_empty() {
            return;
        }
        let Ok(mut c) = RuntimeClient::connect(format!("http://{}", self.addr)).await else {
            return;
        };
        for job_key in uncleaned {
            let _ = c.cleanup(pb::JobRequest { job_key }).await;
        }
    }
}

/// A job as a worker sends it (`casebatch_runtime::job_spec::from_planned` on the worker of a case with
/// this harness string, environment and memory).
fn planned(
    index: u32,
    harness: &str,
    env: &[(&str, &Path)],
    memory_mb: Option<u64>,
) -> pb::JobSpec {
    pb::JobSpec {
        case_index: index,
        case_id: format!("case-{index}"),
        case_dir: format!("case-{index}"),
        harness: Some(pb::Command::shell(harness)),
        evaluator: None,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.display().to_string()))
            .collect(),
        pass_env: Vec::new(),
        input_json: r#"{"query":"q"}"#.into(),
        timeout_seconds: 120,
        resources: Some(pb::Resources {
            memory_mb,
            cpu: None,
            gpus: None,
            log_mb: None,
        }),
        sandbox: None,
    }
}

fn key(batch: &str, index: u32) -> pb::AttemptKey {
    pb::AttemptKey {
        batch_id: format!("{batch}-{}", std::process::id()),
        case_index: index,
        attempt: 1,
        bundle_dir: "/workers/out/batch".into(),
        memory_boost_mb: None,
    }
}

fn marker(k: &pb::AttemptKey) -> String {
    format!("{}/{}/{}", k.batch_id, k.case_index, k.attempt)
}

/// The marker the attempt's processes carry on `agent` (`Attempt::process_marker`): its key
/// with a hash of the agent's directory for the attempt.
fn carried_marker(agent: &TestAgent, k: &pb::AttemptKey) -> String {
    let batches = agent.data().join("batches");
    let local = crate::jobs::local_bundle(&batches, &k.batch_id, &k.bundle_dir);
    let dir = local.join(format!(
        "cases/case-{}/attempts/{}",
        k.case_index, k.attempt
    ));
    casebatch_attempt::host_name(&marker(k), &dir)
}

fn job_req(k: &pb::AttemptKey) -> pb::JobRequest {
    pb::JobRequest { job_key: marker(k) }
}

/// FetchArtifacts of the actor's files, as every worker before evaluators asked for them.
fn fetch_req(k: &pb::AttemptKey) -> pb::FetchRequest {
    pb::FetchRequest {
        job_key: marker(k),
        set: pb::ArtifactSet::Actor as i32,
    }
}

/// A submit as a contract v2 worker sends it.
fn submit_request(k: &pb::AttemptKey, job: &pb::JobSpec) -> pb::SubmitRequest {
    pb::SubmitRequest {
        key: Some(k.clone()),
        planned_case_json: Vec::new(),
        contract_version: pb::CONTRACT_VERSION,
        job: Some(job.clone()),
    }
}

async fn submit(
    c: &mut RuntimeClient<Channel>,
    k: &pb::AttemptKey,
    job: &pb::JobSpec,
) -> Result<pb::Job, tonic::Status> {
    c.submit(submit_request(k, job))
        .await
        .map(|r| r.into_inner())
}

/// Every message of a Watch; the last must be ENDED and no other one.
async fn watch_to_end(c: &mut RuntimeClient<Channel>, k: &pb::AttemptKey) -> Vec<pb::Job> {
    let mut stream = c.watch(job_req(k)).await.unwrap().into_inner();
    let mut seen = Vec::new();
    while let Some(job) = tokio::time::timeout(Duration::from_secs(60), stream.message())
        .await
        .expect("the job ends within a minute")
        .unwrap()
    {
        seen.push(job);
    }
    let (last, before) = seen.split_last().expect("at least one message");
    assert_eq!(last.state(), pb::JobState::Ended, "{seen:?}");
    assert!(
        before.iter().all(|j| j.state() != pb::JobState::Ended),
        "{seen:?}"
    );
    seen
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// Waits for a file to appear (a harness's sign of life).
async fn appears(path: &Path) {
    for _ in 0..600 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never appeared", path.display());
}

/// Appends a line to `$COUNTER`, then waits for `$GATE`.
const GATED: &str = r#"echo run >> "$COUNTER"; while [ ! -e "$GATE" ]; do sleep 0.05; done"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_submit_returns_the_same_job_and_runs_it_once() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let (counter, gate) = (agent.path("counter"), agent.path("gate"));
    let case = planned(0, GATED, &[("COUNTER", &counter), ("GATE", &gate)], None);
    let k = key("idem", 0);

    let first = submit(&mut c, &k, &case).await.unwrap();
    assert_eq!(first.state(), pb::JobState::Running);
    assert_eq!(first.job_key, marker(&k));
    assert!(
        first.pid.is_some() && first.start_ticks.is_some(),
        "{first:?}"
    );
    let again = submit(&mut c, &k, &case).await.unwrap();
    assert_eq!(
        (again.pid, again.start_ticks),
        (first.pid, first.start_ticks)
    );

    std::fs::write(&gate, "").unwrap();
    let end = watch_to_end(&mut c, &k).await.pop().unwrap();
    let report = end.report.clone().unwrap();
    assert_eq!(
        (report.status(), report.exit_code),
        (pb::ActorStatus::Finished, Some(0))
    );
    assert!(!report.adopted, "the agent that started it harvested it");
    // After the end too, a submit returns the job, never a second run.
    let after = submit(&mut c, &k, &case).await.unwrap();
    assert_eq!(after.state(), pb::JobState::Ended);
    assert_eq!(after.starts, 1);
    assert_eq!(lines(&counter), 1, "one process for three submits");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sends_the_state_then_ends_with_the_exit_code() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let k = key("exit", 0);
    let job = submit(&mut c, &k, &planned(0, "exit 3", &[], None))
        .await
        .unwrap();
    assert_ne!(job.state(), pb::JobState::Starting);
    let seen = watch_to_end(&mut c, &k).await;
    let end = seen.last().unwrap();
    let report = end.report.clone().unwrap();
    assert_eq!(report.exit_code, Some(3));
    assert_eq!(report.status(), pb::ActorStatus::Failed);
    assert!(end.ended_at_ms.unwrap() >= end.submitted_at_ms);
    // Get agrees, and the job no longer counts against the envelope.
    let got = c.get(job_req(&k)).await.unwrap().into_inner();
    assert_eq!(&got, end);
    let cap = c
        .capacity(pb::CapacityRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap.in_flight, 0);
    // A second Watch of an ended job: exactly the ENDED message.
    assert_eq!(watch_to_end(&mut c, &k).await.len(), 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_artifacts_streams_the_result_and_output_files_once_ended() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let gate = agent.path("gate");
    let harness = r#"
        while [ ! -e "$GATE" ]; do sleep 0.05; done
        mkdir -p "$CASEBATCH_OUTPUT_DIR/a"
        echo hello > "$CASEBATCH_OUTPUT_DIR/a/b.txt"
        : > "$CASEBATCH_OUTPUT_DIR/empty"
        head -c 2621440 /dev/zero > "$CASEBATCH_OUTPUT_DIR/big.bin"
        ln -s /etc/hostname "$CASEBATCH_OUTPUT_DIR/link"
        mkfifo "$CASEBATCH_OUTPUT_DIR/fifo"
        echo '{"outputs": {"answer": 42}}' > "$CASEBATCH_RESULT"
        echo to-stdout
    "#;
    let k = key("artifacts", 0);
    submit(&mut c, &k, &planned(0, harness, &[("GATE", &gate)], None))
        .await
        .unwrap();
    let early = c.fetch_artifacts(fetch_req(&k)).await.unwrap_err();
    assert_eq!(early.code(), Code::FailedPrecondition, "{early:?}");

    std::fs::write(&gate, "").unwrap();
    watch_to_end(&mut c, &k).await;
    let mut stream = c.fetch_artifacts(fetch_req(&k)).await.unwrap().into_inner();
    let mut files: BTreeMap<String, (usize, Vec<u8>)> = BTreeMap::new();
    let mut order = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        assert!(chunk.data.len() <= crate::artifacts::CHUNK);
        if order.last() != Some(&chunk.path) {
            assert!(!order.contains(&chunk.path), "{} sent twice", chunk.path);
            order.push(chunk.path.clone());
        }
        let entry = files.entry(chunk.path).or_default();
        entry.0 += 1;
        entry.1.extend(chunk.data);
    }
    let result: serde_json::Value = serde_json::from_slice(&files["result.json"].1).unwrap();
    assert_eq!(result["outputs"]["answer"], 42);
    assert_eq!(files["stdout.log"].1, b"to-stdout\n");
    assert_eq!(files["output/a/b.txt"].1, b"hello\n");
    assert_eq!(
        files["output/empty"],
        (1, Vec::new()),
        "an empty file is one empty chunk"
    );
    assert_eq!(
        files["output/big.bin"].0, 3,
        "2.5 MiB in chunks of at most 1 MiB"
    );
    assert_eq!(files["output/big.bin"].1.len(), 2_621_440);
    assert!(files.contains_key("job.json"));
    assert!(
        !files.contains_key("output/link"),
        "a symlink is never followed"
    );
    assert!(!files.contains_key("output/fifo"));
    assert_eq!(&order[..2], ["result.json", "stdout.log"]);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_beyond_max_concurrent_is_refused_not_queued() {
    let agent = TestAgent::start(|c| c.max_concurrent = 1).await;
    let mut c = agent.client().await;
    let (counter, gate) = (agent.path("counter"), agent.path("gate"));
    let env = [("COUNTER", counter.as_path()), ("GATE", gate.as_path())];
    let (a, b) = (key("full", 0), key("full", 1));
    submit(&mut c, &a, &planned(0, GATED, &env, None))
        .await
        .unwrap();
    let refused = submit(&mut c, &b, &planned(1, GATED, &env, None))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(refused.message(), "runtime full: 1 of 1 jobs in flight");
    let gone = c.get(job_req(&b)).await.unwrap_err();
    assert_eq!(
        gone.code(),
        Code::NotFound,
        "a refused submit leaves nothing behind"
    );
    let cap = c
        .capacity(pb::CapacityRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (cap.max_concurrent, cap.in_flight, cap.memory_budget_mb),
        (1, 1, 0)
    );

    std::fs::write(&gate, "").unwrap();
    watch_to_end(&mut c, &a).await;
    submit(&mut c, &b, &planned(1, GATED, &env, None))
        .await
        .unwrap();
    watch_to_end(&mut c, &b).await;
    assert_eq!(lines(&counter), 2);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_memory_over_the_budget_is_refused() {
    let agent = TestAgent::start(|c| c.memory_budget_mb = Some(600)).await;
    let mut c = agent.client().await;
    let gate = agent.path("gate");
    let wait = r#"while [ ! -e "$GATE" ]; do sleep 0.05; done"#;
    let (a, b, big) = (key("mem", 0), key("mem", 1), key("mem", 2));
    let first = submit(&mut c, &a, &planned(0, wait, &[("GATE", &gate)], Some(512)))
        .await
        .unwrap();
    assert_eq!(first.memory_mb, Some(512));
    let refused = submit(&mut c, &b, &planned(1, wait, &[("GATE", &gate)], Some(512)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "runtime full: 512 MB declared in flight + 512 MB > budget 600 MB"
    );
    // A job declaring no memory counts 0 and fits.
    let none = key("mem", 3);
    submit(&mut c, &none, &planned(3, "true", &[], None))
        .await
        .unwrap();
    // One that could never fit is not worth retrying: another code.
    let never = submit(&mut c, &big, &planned(2, "true", &[], Some(700)))
        .await
        .unwrap_err();
    assert_eq!(never.code(), Code::FailedPrecondition, "{never:?}");
    assert!(never.message().contains("--memory-budget-mb"), "{never:?}");
    let cap = c
        .capacity(pb::CapacityRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((cap.memory_budget_mb, cap.memory_in_use_mb), (600, 512));

    std::fs::write(&gate, "").unwrap();
    watch_to_end(&mut c, &a).await;
    submit(&mut c, &b, &planned(1, wait, &[("GATE", &gate)], Some(512)))
        .await
        .unwrap();
    watch_to_end(&mut c, &b).await;
    watch_to_end(&mut c, &none).await;
    agent.stop().await;
}

/// A client's side of the bearer token.
#[derive(Clone)]
struct Bearer(&'static str);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, tonic::Status> {
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", self.0).parse().unwrap(),
        );
        Ok(req)
    }
}

fn with_token(
    channel: Channel,
    token: &'static str,
) -> RuntimeClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>> {
    RuntimeClient::with_interceptor(channel, Bearer(token))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_agent_refuses_calls_without_the_right_token() {
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "s3cret-token\n").unwrap();
    let path = token_file.path().to_path_buf();
    let agent = TestAgent::start(|c| c.token = Some(TokenSource::File(path))).await;
    let channel = Channel::from_shared(format!("http://{}", agent.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();

    let mut bare = RuntimeClient::new(channel.clone());
    let missing = bare.health(pb::HealthRequest {}).await.unwrap_err();
    assert_eq!(
        (missing.code(), missing.message()),
        (Code::Unauthenticated, "missing bearer token")
    );
    let k = key("auth", 0);
    let refused = submit(&mut bare, &k, &planned(0, "true", &[], None))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);

    let mut wrong = with_token(channel.clone(), "s3cret-tokem");
    let bad = wrong.health(pb::HealthRequest {}).await.unwrap_err();
    assert_eq!(
        (bad.code(), bad.message()),
        (Code::Unauthenticated, "wrong bearer token")
    );

    let mut right = with_token(channel, "s3cret-token");
    let health = right
        .health(pb::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(health.contract_version, pb::CONTRACT_VERSION);
    assert_eq!(health.reattached, 0);
    // Nothing was started by the refused submit.
    let gone = right.get(job_req(&k)).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_a_job_cancelled_and_cleanup_confirms_nothing_is_left() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let ready = agent.path("ready");
    // A detached grandchild as well: cleanup finds it by the attempt's marker.
    let harness = r#"(setsid sleep 300 &); sleep 300 & touch "$READY"; wait"#;
    let (k, other) = (key("kill", 0), key("kill", 1));
    submit(&mut c, &k, &planned(0, harness, &[("READY", &ready)], None))
        .await
        .unwrap();
    appears(&ready).await;
    submit(&mut c, &other, &planned(1, "sleep 300", &[], None))
        .await
        .unwrap();
    let m = marker(&k);
    let carried = carried_marker(&agent, &k);
    assert!(
        !casebatch_attempt::local::procfs::scan_marker(&carried)
            .marked
            .is_empty()
    );

    let killed = c
        .kill(pb::KillRequest {
            target: Some(pb::kill_request::Target::JobKey(m.clone())),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(killed.killed_job_keys, vec![m.clone()]);
    let end = watch_to_end(&mut c, &k).await.pop().unwrap();
    assert_eq!(end.report.unwrap().status(), pb::ActorStatus::Cancelled);

    let receipt = c.cleanup(job_req(&k)).await.unwrap().into_inner();
    assert!(receipt.cleanup_confirmed, "{receipt:?}");
    assert_eq!(receipt.job_key, m);
    assert!(
        casebatch_attempt::local::procfs::scan_marker(&carried)
            .marked
            .is_empty(),
        "no survivor"
    );
    let again = c.cleanup(job_req(&k)).await.unwrap().into_inner();
    assert_eq!(
        again, receipt,
        "a repeated cleanup returns the stored receipt"
    );

    // Cleanup of a running job kills it first; Kill by batch reaches what is left.
    let by_batch = c
        .kill(pb::KillRequest {
            target: Some(pb::kill_request::Target::BatchId(k.batch_id.clone())),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_batch.killed_job_keys, vec![marker(&other)]);
    let receipt = c.cleanup(job_req(&other)).await.unwrap().into_inner();
    assert!(receipt.cleanup_confirmed, "{receipt:?}");
    let end = c.get(job_req(&other)).await.unwrap().into_inner();
    assert_eq!(end.report.unwrap().status(), pb::ActorStatus::Cancelled);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_other_bundles_and_bad_requests_are_refused() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let nobody = pb::JobRequest {
        job_key: "nobody/0/1".into(),
    };
    assert_eq!(
        c.get(nobody.clone()).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        c.watch(nobody.clone()).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        c.cleanup(nobody.clone()).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        c.fetch_artifacts(pb::FetchRequest {
            job_key: nobody.job_key.clone(),
            set: pb::ArtifactSet::Actor as i32,
        })
        .await
        .unwrap_err()
        .code(),
        Code::NotFound
    );
    let kill = c
        .kill(pb::KillRequest {
            target: Some(pb::kill_request::Target::JobKey(nobody.job_key)),
        })
        .await
        .unwrap_err();
    assert_eq!(kill.code(), Code::NotFound);

    let k = key("bundles", 0);
    submit(&mut c, &k, &planned(0, "true", &[], None))
        .await
        .unwrap();
    let mut elsewhere = k.clone();
    elsewhere.bundle_dir = "/another/out/batch".into();
    let refused = submit(&mut c, &elsewhere, &planned(0, "true", &[], None))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("belongs to another bundle"),
        "{refused:?}"
    );

    let mut traversal = planned(1, "true", &[], None);
    traversal.case_dir = "../../escape".into();
    let bad = submit(&mut c, &key("bundles", 1), &traversal)
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().contains("job.case_dir"), "{bad:?}");
    let mut garbage = planned(2, "true", &[], None);
    garbage.input_json = "{not json".into();
    let garbage = submit(&mut c, &key("bundles", 2), &garbage)
        .await
        .unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument);
    assert!(garbage.message().contains("job.input_json"), "{garbage:?}");
    let wrong_index = submit(&mut c, &key("bundles", 3), &planned(4, "true", &[], None))
        .await
        .unwrap_err();
    assert_eq!(wrong_index.code(), Code::InvalidArgument);
    let mut empty = planned(3, "true", &[], None);
    empty.harness = Some(pb::Command { argv: Vec::new() });
    let empty = submit(&mut c, &key("bundles", 3), &empty)
        .await
        .unwrap_err();
    assert!(
        empty.message().contains("job.harness.argv is empty"),
        "{empty:?}"
    );
    // A sandbox this agent cannot provide is refused, never run on the host instead.
    let mut sandboxed = planned(3, "true", &[], None);
    sandboxed.sandbox = Some(pb::Sandbox {
        image: "busybox".into(),
        ..pb::Sandbox::default()
    });
    let sandboxed = submit(&mut c, &key("bundles", 3), &sandboxed)
        .await
        .unwrap_err();
    assert_eq!(sandboxed.code(), Code::InvalidArgument);
    assert!(sandboxed.message().contains("job.sandbox"), "{sandboxed:?}");
    watch_to_end(&mut c, &k).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_variable_never_reaches_a_harness_even_by_pass_env() {
    // Any variable of this process that could be a token stands in for the token's variable
    // (the test cannot set one: no unsafe code).
    let (name, value) = std::env::vars()
        .find(|(_, v)| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()))
        .expect("some variable with a token-like value");
    let token: &'static str = Box::leak(value.into_boxed_str());
    let var = name.clone();
    let agent = TestAgent::start(|c| c.token = Some(TokenSource::Env(var))).await;
    let channel = Channel::from_shared(format!("http://{}", agent.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = with_token(channel, token);
    let mut case = planned(0, "true", &[], None);
    case.pass_env = vec![name];
    let k = key("token-env", 0);
    let job = c
        .submit(submit_request(&k, &case))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(job.state(), pb::JobState::Ended, "{job:?}");
    let failure = job.report.unwrap().failure.unwrap();
    assert_eq!(failure.class, "config");
    assert!(failure.message.contains("bearer token"), "{failure:?}");
    // Through the token: `stop`'s own clean-up is a plain client.
    c.cleanup(job_req(&k)).await.unwrap();
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_serves_one_agent_at_a_time() {
    let agent = TestAgent::start(|_| {}).await;
    let addr = std::fs::read_to_string(agent.data().join("agent.addr")).unwrap();
    assert_eq!(
        addr.trim(),
        agent.addr.to_string(),
        "agent.addr names the bound address"
    );
    let second = Agent::start(AgentConfig::local(
        "127.0.0.1:0".parse().unwrap(),
        agent.data(),
    ))
    .await
    .err()
    .expect("refused");
    assert!(matches!(second, AgentError::InUse { .. }), "{second:?}");
    let message = second.to_string();
    assert!(
        message.contains(&format!(
            "is in use by another casebatch agent (pid {})",
            std::process::id()
        )),
        "{message}"
    );
    let data = agent.data();
    agent.stop().await;
    assert!(
        !data.join("agent.addr").exists(),
        "a stopped agent is not announced"
    );
    // Released with its holder.
    let next = Agent::start(AgentConfig::local("127.0.0.1:0".parse().unwrap(), data)).await;
    assert!(next.is_ok());
}

/// A data dir whose job table a newer agent wrote (a later schema version) is refused at
/// start, naming the file and both versions, and its table keeps its version.
#[tokio::test]
async fn a_data_dir_from_a_newer_agent_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().canonicalize().unwrap().join("data");
    let table = data.join("jobs.sqlite");
    std::fs::create_dir(&data).unwrap();
    drop(crate::table::Table::open(&table).unwrap());
    let newer = i64::from(crate::table::LATEST) + 1;
    rusqlite::Connection::open(&table)
        .unwrap()
        .pragma_update(None, "user_version", newer)
        .unwrap();

    let err = Agent::start(AgentConfig::local("127.0.0.1:0".parse().unwrap(), &data))
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, AgentError::TableTooNew { .. }), "{err:?}");
    let m = err.to_string();
    assert!(
        m.contains(&format!(
            "the job table {} has schema version {newer}, but this agent knows versions up to {}",
            table.display(),
            crate::table::LATEST
        )) && m.contains("another --data-dir"),
        "{m}"
    );
    assert!(!data.join("agent.addr").exists(), "not announced");
    let version: i64 = rusqlite::Connection::open(&table)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, newer);
}

#[tokio::test]
async fn off_loopback_needs_tls_and_a_token_and_nothing_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let err = Agent::start(AgentConfig::local("0.0.0.0:0".parse().unwrap(), &data))
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, AgentError::Config(_)), "{err:?}");
    let m = err.to_string();
    assert!(m.contains("--tls-cert") && m.contains("--token-env"), "{m}");
    assert!(
        !data.exists(),
        "nothing written for a refused configuration"
    );

    let mut config = AgentConfig::local("0.0.0.0:0".parse().unwrap(), &data);
    config.token = Some(TokenSource::Env(
        "CASEBATCH_TEST_UNSET_TOKEN_VARIABLE".into(),
    ));
    let m = Agent::start(config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        m.contains("TLS") && !m.contains("--token-env"),
        "only TLS is missing: {m}"
    );

    let mut config = AgentConfig::local("127.0.0.1:0".parse().unwrap(), &data);
    config.token = Some(TokenSource::Env(
        "CASEBATCH_TEST_UNSET_TOKEN_VARIABLE".into(),
    ));
    let m = Agent::start(config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        m.contains("CASEBATCH_TEST_UNSET_TOKEN_VARIABLE") && m.contains("not set"),
        "{m}"
    );
    assert!(!data.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_token_serves_tls_clients_only() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key_pem) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    // A CA and a certificate for localhost signed by it.
    let ca = dir.path().join("ca.pem");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca_cert, &ca_key)
        .unwrap();
    std::fs::write(&ca, ca_cert.pem()).unwrap();
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key_pem, leaf_key.serialize_pem()).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "tls-token").unwrap();
    let (c2, k2, t2) = (cert.clone(), key_pem.clone(), token_file.clone());
    let agent = TestAgent::start(move |c| {
        c.tls = Some(crate::TlsFiles { cert: c2, key: k2 });
        c.token = Some(TokenSource::File(t2));
    })
    .await;

    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(&ca).unwrap(),
        ))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{}", agent.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("a TLS client connects");
    let health = with_token(channel, "tls-token")
        .health(pb::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.reattached, 0);
    // Plaintext is not spoken.
    let plain = match RuntimeClient::connect(format!("http://{}", agent.addr)).await {
        Ok(mut c) => c.health(pb::HealthRequest {}).await.is_err(),
        Err(_) => true,
    };
    assert!(plain, "a plaintext call must fail");
    agent.stop().await;

    // A key that is not PEM is refused before anything starts.
    std::fs::write(&key_pem, "not a key").unwrap();
    let mut config = AgentConfig::local("127.0.0.1:0".parse().unwrap(), dir.path().join("d2"));
    config.tls = Some(crate::TlsFiles { cert, key: key_pem });
    let err = Agent::start(config).await.err().expect("refused");
    assert!(
        matches!(err, AgentError::Config(_)) && err.to_string().contains("--tls-key"),
        "{err}"
    );
    assert!(!dir.path().join("d2").exists());
}

/// Polls Get until the agent no longer knows the job.
async fn forgotten(c: &mut RuntimeClient<Channel>, k: &pb::AttemptKey) {
    for _ in 0..400 {
        match c.get(job_req(k)).await {
            Err(status) if status.code() == Code::NotFound => return,
            Err(status) => panic!("{status:?}"),
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("{} was still known after 20 s", marker(k));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_jobs_go_after_keep_ended_cleaned_up_first_and_running_ones_stay() {
    let agent = TestAgent::start(|c| c.keep_ended = Some(Duration::from_secs(3))).await;
    let mut c = agent.client().await;
    let (counter, gate, ready) = (
        agent.path("counter"),
        agent.path("gate"),
        agent.path("ready"),
    );
    // One batch, three jobs: one its worker cleaned up, one that left a detached grandchild
    // and was never cleaned up, one still running.
    let (cleaned, left, running) = (key("keep", 0), key("keep", 1), key("keep", 2));
    submit(&mut c, &cleaned, &planned(0, "true", &[], None))
        .await
        .unwrap();
    watch_to_end(&mut c, &cleaned).await;
    let receipt = c.cleanup(job_req(&cleaned)).await.unwrap().into_inner();
    assert!(receipt.cleanup_confirmed, "{receipt:?}");
    let leaker = r#"(setsid sleep 373 &); touch "$READY""#;
    submit(
        &mut c,
        &left,
        &planned(1, leaker, &[("READY", &ready)], None),
    )
    .await
    .unwrap();
    watch_to_end(&mut c, &left).await;
    let gated = [("COUNTER", counter.as_path()), ("GATE", gate.as_path())];
    submit(&mut c, &running, &planned(2, GATED, &gated, None))
        .await
        .unwrap();
    let leftover = carried_marker(&agent, &left);
    assert!(
        !casebatch_attempt::local::procfs::scan_marker(&leftover)
            .marked
            .is_empty()
    );

    let batches = agent.data().join("batches");
    let local: Vec<PathBuf> = std::fs::read_dir(&batches)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let [local] = local.as_slice() else {
        panic!("one directory for the batch: {local:?}")
    };
    let attempt = |i: u32| local.join(format!("cases/case-{i}/attempts/1"));
    assert!((0..3).all(|i| attempt(i).is_dir()));

    forgotten(&mut c, &cleaned).await;
    forgotten(&mut c, &left).await;
    assert!(
        casebatch_attempt::local::procfs::scan_marker(&leftover)
            .marked
            .is_empty(),
        "the job nobody cleaned up was cleaned up before it went"
    );
    assert!(!attempt(0).exists() && !attempt(1).exists());
    // Older than --keep-ended but not ended: untouched.
    let job = c.get(job_req(&running)).await.unwrap().into_inner();
    assert_eq!(job.state(), pb::JobState::Running);
    assert!(attempt(2).is_dir());

    std::fs::write(&gate, "").unwrap();
    watch_to_end(&mut c, &running).await;
    forgotten(&mut c, &running).await;
    // Its batch directory goes with the last job of the batch.
    assert!(!local.exists(), "{} is left", local.display());
    assert!(batches.is_dir());
    assert_eq!(lines(&counter), 1);
    agent.stop().await;
}

/// [`planned`] with an evaluator command.
fn with_evaluator(mut job: pb::JobSpec, evaluator: &str) -> pb::JobSpec {
    job.evaluator = Some(pb::Command::shell(evaluator));
    job
}

async fn evaluate(
    c: &mut RuntimeClient<Channel>,
    k: &pb::AttemptKey,
) -> Result<pb::Evaluation, tonic::Status> {
    c.evaluate(job_req(k)).await.map(|r| r.into_inner())
}

/// Live processes whose command line contains `needle`.
fn running(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            }) && casebatch_attempt::local::procfs::is_alive(*pid)
        })
        .collect()
}

/// Waits (a killed process can linger in /proc a moment) until nothing matches `needle`.
async fn none_running(needle: &str) -> bool {
    for _ in 0..100 {
        if running(needle).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluate_runs_the_evaluator_once_where_the_job_ran_and_cleanup_kills_what_it_left() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let (counter, gate) = (agent.path("counter"), agent.path("gate"));
    // Not `sleep 3…`: tests elsewhere wait for no `sleep 31…` to be left.
    let needle = format!("sleep 7{}", std::process::id() % 1000 + 1000);
    // The actor leaves a file in its working directory; the evaluator judges it there, leaves
    // a detached, environment-less process, and scores.
    let actor = r#"while [ ! -e "$GATE" ]; do sleep 0.05; done; echo acted > work.txt; echo '{}' > "$CASEBATCH_RESULT""#;
    let evaluator = format!(
        r#"echo run >> "$COUNTER"; test -s work.txt || exit 7; setsid env -i {needle} > /dev/null 2>&1 & echo judged; printf '{{"verdict": "pass", "scores": {{"n": 1, "f": 0.5}}}}' > "$CASEBATCH_RESULT""#
    );
    let env = [("COUNTER", counter.as_path()), ("GATE", gate.as_path())];
    let case = with_evaluator(planned(0, actor, &env, None), &evaluator);
    let k = key("evaluate", 0);
    submit(&mut c, &k, &case).await.unwrap();
    let early = evaluate(&mut c, &k).await.unwrap_err();
    assert_eq!(early.code(), Code::FailedPrecondition, "{early:?}");

    std::fs::write(&gate, "").unwrap();
    watch_to_end(&mut c, &k).await;
    // Two callers at once (a worker and its retry): one run, one record.
    let mut c2 = agent.client().await;
    let (first, second) = tokio::join!(evaluate(&mut c, &k), evaluate(&mut c2, &k));
    let first = first.unwrap();
    assert_eq!(first, second.unwrap());
    assert_eq!(first.verdict(), pb::Verdict::Pass, "{first:?}");
    assert_eq!(
        (first.scores_json["n"].as_str(), first.exit_code),
        ("1", Some(0))
    );
    assert!(first.failure.is_none(), "{first:?}");
    assert_eq!(evaluate(&mut c, &k).await.unwrap(), first);
    assert_eq!(lines(&counter), 1, "one evaluator run for three calls");
    // The evaluator returns as soon as it forks: wait for its child to exec. What the wait
    // saw is what counts: a process between two execs (setsid → env → sleep) reads as no
    // command line for a moment, so a second look can miss it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut seen = running(&needle);
    while seen.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = running(&needle);
    }
    assert!(!seen.is_empty(), "the evaluator's process outlived it");

    // The evaluator's files, and only those.
    let mut stream = c
        .fetch_artifacts(pb::FetchRequest {
            job_key: marker(&k),
            set: pb::ArtifactSet::Evaluator as i32,
        })
        .await
        .unwrap()
        .into_inner();
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        files.entry(chunk.path).or_default().extend(chunk.data);
    }
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [
            "evaluator.stderr.log",
            "evaluator.stdout.log",
            "evaluator_result.json"
        ]
    );
    assert_eq!(files["evaluator.stdout.log"], b"judged\n");

    // The job's cgroup holds the evaluator's process: cleanup kills it and says so.
    let receipt = c.cleanup(job_req(&k)).await.unwrap().into_inner();
    assert!(receipt.cleanup_confirmed, "{receipt:?}");
    assert!(!receipt.killed.is_empty(), "{receipt:?}");
    assert!(none_running(&needle).await, "a survivor: {needle}");
    // Recorded, so still answered after cleanup.
    assert_eq!(evaluate(&mut c, &k).await.unwrap(), first);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_stops_a_running_evaluator_and_no_evaluator_starts_after_it() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let ready = agent.path("ready");
    let needle = format!("sleep 4{}", std::process::id() % 1000 + 1000);
    let evaluator = format!(r#"touch "$READY"; exec {needle}"#);
    let case = with_evaluator(planned(0, "true", &[("READY", &ready)], None), &evaluator);
    let k = key("evaluate-stop", 0);
    submit(&mut c, &k, &case).await.unwrap();
    watch_to_end(&mut c, &k).await;
    let mut c2 = agent.client().await;
    let k2 = k.clone();
    let evaluating = tokio::spawn(async move { evaluate(&mut c2, &k2).await });
    appears(&ready).await;

    let receipt = c.cleanup(job_req(&k)).await.unwrap().into_inner();
    assert!(receipt.cleanup_confirmed, "{receipt:?}");
    assert!(
        none_running(&needle).await,
        "the evaluator survived cleanup"
    );
    let stopped = evaluating.await.unwrap().unwrap();
    assert_eq!(stopped.verdict(), pb::Verdict::Unspecified);
    let failure = stopped.failure.unwrap();
    assert_eq!(
        (failure.stage.as_str(), failure.code.as_str()),
        ("evaluate", "CANCELLED")
    );

    // A job cleaned up before anyone asked: its evaluator never runs.
    let other = key("evaluate-stop", 1);
    let case = with_evaluator(planned(1, "true", &[("READY", &ready)], None), "exit 0");
    submit(&mut c, &other, &case).await.unwrap();
    watch_to_end(&mut c, &other).await;
    c.cleanup(job_req(&other)).await.unwrap();
    let refused = evaluate(&mut c, &other).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("cleaned up"), "{refused:?}");
    agent.stop().await;
}

/// A contract v1 worker's request, built by hand as it built it: the planned case as JSON in
/// field 2, no version, no job. Refused with both versions named and the side to upgrade,
/// and nothing is admitted or run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_workers_request_is_refused_naming_both_versions() {
    let agent = TestAgent::start(|_| {}).await;
    let mut c = agent.client().await;
    let ran = agent.path("ran");
    let planned_case = serde_json::json!({
        "index": 0,
        "case_id": "case-0",
        "case_dir": "case-0",
        "runtime": "agent",
        "runtime_name": "box",
        "harness": format!("touch {}", ran.display()),
        "resources": {},
        "timeout_seconds": 60,
        "input": {"query": "q"},
        "source": {"line": null, "runspec": null},
    });
    let k = key("v1-worker", 0);
    let old = pb::SubmitRequest {
        key: Some(k.clone()),
        planned_case_json: serde_json::to_vec(&planned_case).unwrap(),
        ..Default::default()
    };
    let refused = c.submit(old).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let m = refused.message();
    assert!(
        m.contains("this worker speaks contract v1, this agent speaks contract v2")
            && m.contains("upgrade the worker"),
        "{m}"
    );
    let missing = c.get(job_req(&k)).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "nothing was admitted");
    assert!(!ran.exists(), "nothing ran");

    // A worker newer than the agent is told to upgrade the agent.
    let newer = pb::SubmitRequest {
        key: Some(k.clone()),
        contract_version: pb::CONTRACT_VERSION + 1,
        job: Some(planned(0, "true", &[], None)),
        ..Default::default()
    };
    let refused = c.submit(newer).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains(&format!("speaks contract v{}", pb::CONTRACT_VERSION + 1))
            && refused.message().contains("upgrade the agent"),
        "{refused:?}"
    );
    agent.stop().await;
}

/// A data dir as an agent of contract v1 left it (job table at schema version 1, each row's
/// planned case as JSON): after the upgrade, its job that had not started yet is re-attached
/// and runs, and its ended job is harvested (files fetched), evaluated with the evaluator its
/// planned case named, and cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_v1_data_dir_re_attaches_and_harvests_its_jobs_after_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let local = data.join("batches").join("v1-batch");
    let counter = dir.path().join("counter");
    let (waiting, ended) = (key("upgrade", 0), key("upgrade", 1));
    let planned_case = |index: u32, harness: String, evaluator: Option<&str>| {
        serde_json::json!({
            "index": index,
            "case_id": format!("case-{index}"),
            "case_dir": format!("case-{index}"),
            "runtime": "agent",
            "runtime_name": "box",
            "harness": harness,
            "evaluator": evaluator,
            "sandbox": null,
            "resources": {"cpu": null, "memory_mb": null},
            "timeout_seconds": 60,
            "fake": null,
            "env": {"COUNTER": counter.display().to_string()},
            "input": {"query": "q"},
            "source": {"line": null, "runspec": null},
        })
        .to_string()
    };
    let attempt_dir = |index: u32| local.join(format!("cases/case-{index}/attempts/1"));
    // The ended job's files, as its run left them.
    let done = attempt_dir(1);
    std::fs::create_dir_all(done.join("work")).unwrap();
    std::fs::create_dir_all(done.join("output")).unwrap();
    std::fs::write(done.join("result.json"), r#"{"outputs": {"answer": 42}}"#).unwrap();
    std::fs::write(done.join("stdout.log"), "acted\n").unwrap();
    {
        std::fs::create_dir_all(&data).unwrap();
        let conn = rusqlite::Connection::open(data.join("jobs.sqlite")).unwrap();
        conn.execute_batch(crate::table::V1).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        let insert = "INSERT INTO jobs (job_key, batch_id, bundle_dir, case_index, attempt,
                planned_case_json, local_bundle, attempt_dir, state, starts, report,
                submitted_at_ms, ended_at_ms)
             VALUES (?1, ?2, '/workers/out/batch', ?3, 1, ?4, ?5, ?6, ?7, ?8, ?9, 1000, ?10)";
        conn.execute(
            insert,
            rusqlite::params![
                marker(&waiting),
                waiting.batch_id,
                0,
                planned_case(
                    0,
                    r#"echo ran >> "$COUNTER"; echo '{}' > "$CASEBATCH_RESULT""#.into(),
                    None
                ),
                local.display().to_string(),
                attempt_dir(0).display().to_string(),
                "starting",
                0,
                None::<String>,
                None::<i64>,
            ],
        )
        .unwrap();
        conn.execute(
            insert,
            rusqlite::params![
                marker(&ended),
                ended.batch_id,
                1,
                planned_case(
                    1,
                    "exit 9".into(),
                    Some(r#"test -s "$CASEBATCH_ACTOR_RESULT" && printf '{"verdict": "pass", "scores": {"n": 1}}' > "$CASEBATCH_RESULT""#)
                ),
                local.display().to_string(),
                done.display().to_string(),
                "ended",
                1,
                r#"{"status":"finished","exit_code":0,"failure":null,"adopted":false,"memory_limit_mb":null}"#,
                // Just now: retention keeps it (`--keep-ended`).
                crate::jobs::now_ms() as i64,
            ],
        )
        .unwrap();
    }

    let agent = TestAgent::start_in(dir, |_| {}).await;
    let mut c = agent.client().await;
    let health = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!(health.reattached, 1, "the job not ended is awaited again");
    let seen = watch_to_end(&mut c, &waiting).await;
    let report = seen.last().unwrap().report.clone().unwrap();
    assert_eq!(
        (report.status(), report.exit_code),
        (pb::ActorStatus::Finished, Some(0)),
        "{report:?}"
    );
    assert_eq!(lines(&counter), 1, "it ran once, from its upgraded job");

    let mut stream = c
        .fetch_artifacts(fetch_req(&ended))
        .await
        .unwrap()
        .into_inner();
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        files.entry(chunk.path).or_default().extend(chunk.data);
    }
    assert_eq!(files["result.json"], br#"{"outputs": {"answer": 42}}"#);
    assert_eq!(files["stdout.log"], b"acted\n");
    let evaluation = evaluate(&mut c, &ended).await.unwrap();
    assert!(evaluation.configured, "{evaluation:?}");
    assert_eq!(evaluation.verdict(), pb::Verdict::Pass, "{evaluation:?}");
    let receipt = c.cleanup(job_req(&ended)).await.unwrap().into_inner();
    assert!(receipt.cleanup_confirmed, "{receipt:?}");
    agent.stop().await;
}
