//! `casebatch agent`, the real binary: a job survives the agent's SIGKILL and is harvested by
//! the next agent on the same data dir without running twice; a data dir serves one agent;
//! an address off loopback needs TLS and a token.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use casebatch_proto::runtime_v1 as pb;
use casebatch_proto::runtime_v1::runtime_client::RuntimeClient;
use tonic::transport::Channel;

use crate::support::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn start_agent(sb: &Sandbox, data: &Path, log: &str) -> (Child, String) {
    start_agent_with(sb, data, log, &[])
}

fn start_agent_with(sb: &Sandbox, data: &Path, log: &str, extra: &[&str]) -> (Child, String) {
    let _ = std::fs::remove_file(data.join("agent.addr"));
    let mut args = vec![
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let agent = sb.spawn(&args, log);
    let addr_file = data.join("agent.addr");
    wait_until(
        Duration::from_secs(30),
        "the agent writes agent.addr",
        || addr_file.exists(),
    );
    let addr = std::fs::read_to_string(&addr_file)
        .unwrap()
        .trim()
        .to_string();
    (agent, addr)
}

async fn client(addr: &str) -> RuntimeClient<Channel> {
    RuntimeClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

#[test]
fn a_sigkilled_agent_restarted_on_its_data_dir_harvests_its_job_without_running_it_again() {
    let sb = Sandbox::new();
    let data = sb.path("agent-data");
    let (counter, gate) = (sb.path("counter"), sb.path("gate"));
    let spec = pb::JobSpec {
        case_index: 0,
        case_id: "gated".into(),
        case_dir: "gated".into(),
        harness: Some(pb::Command::shell(
            r#"echo run >> "$COUNTER"; while [ ! -e "$GATE" ]; do sleep 0.05; done"#,
        )),
        env: [("COUNTER", &counter), ("GATE", &gate)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.display().to_string()))
            .collect(),
        input_json: "{}".into(),
        timeout_seconds: 120,
        ..Default::default()
    };
    let key = pb::AttemptKey {
        batch_id: "agent-restart".into(),
        case_index: 0,
        attempt: 1,
        bundle_dir: sb.out().join("agent-restart").display().to_string(),
        memory_boost_mb: None,
    };
    let submit = || pb::SubmitRequest {
        key: Some(key.clone()),
        contract_version: pb::CONTRACT_VERSION,
        job: Some(spec.clone()),
        ..Default::default()
    };
    let job_key = "agent-restart/0/1".to_string();
    let rt = rt();

    let (mut first, addr) = start_agent(&sb, &data, "agent-1.log");
    let job = rt.block_on(async {
        client(&addr)
            .await
            .submit(submit())
            .await
            .unwrap()
            .into_inner()
    });
    assert_eq!(job.state(), pb::JobState::Running, "{job:?}");
    wait_until(Duration::from_secs(30), "the harness runs", || {
        sb.lines("counter") == 1
    });

    // A second agent on the same data dir is refused while the first lives.
    let second = sb.run(&[
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_exit(&second, 2);
    assert!(
        stderr(&second).contains(&format!(
            "is in use by another casebatch agent (pid {})",
            first.id()
        )),
        "{}",
        stderr(&second)
    );

    first.kill().unwrap();
    first.wait().unwrap();
    let pid = job.pid.unwrap();
    assert!(alive(pid), "the job outlives its agent");

    // The second agent serves metrics: its table and envelope as they are.
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let metrics_flags = ["--metrics-bind", bind.as_str(), "--max-concurrent", "3"];
    let (mut again, addr) = start_agent_with(&sb, &data, "agent-2.log", &metrics_flags);
    wait_until(Duration::from_secs(10), "the ready line", || {
        sb.read("agent-2.log").contains("1 jobs re-attached")
    });
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));
    let text = http_get(port, "/metrics").unwrap().1;
    let jobs = "casebatch_agent_jobs";
    assert_eq!(metric(&text, jobs, &[("state", "running")]), 1.0, "{text}");
    assert_eq!(metric(&text, jobs, &[("state", "ended")]), 0.0, "{text}");
    assert_eq!(
        metric(&text, "casebatch_agent_envelope_jobs", &[]),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "casebatch_agent_envelope_max_jobs", &[]),
        3.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "casebatch_agent_jobs_reattached", &[]),
        1.0,
        "{text}"
    );
    assert!(
        sb.read("agent-2.log").contains(&format!(
            "casebatch agent listening on {addr} (data dir {}",
            std::fs::canonicalize(&data).unwrap().display()
        )),
        "{}",
        sb.read("agent-2.log")
    );
    let (health, end) = rt.block_on(async {
        let mut c = client(&addr).await;
        let health = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
        // The re-attached job is the same process, still running.
        let now = c
            .get(pb::JobRequest {
                job_key: job_key.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((now.pid, now.start_ticks), (job.pid, job.start_ticks));
        std::fs::write(&gate, "").unwrap();
        let mut stream = c
            .watch(pb::JobRequest {
                job_key: job_key.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut last = None;
        while let Some(j) = tokio::time::timeout(Duration::from_secs(60), stream.message())
            .await
            .expect("the job ends")
            .unwrap()
        {
            last = Some(j);
        }
        // A resubmit after the restart is the same job, not a new one.
        let resubmitted = c.submit(submit()).await.unwrap().into_inner();
        assert_eq!(resubmitted.state(), pb::JobState::Ended);
        (health, last.unwrap())
    });
    assert_eq!(health.reattached, 1);
    assert_eq!(end.state(), pb::JobState::Ended);
    let report = end.report.unwrap();
    assert_eq!(
        (report.status(), report.exit_code),
        (pb::ActorStatus::Finished, Some(0))
    );
    assert!(report.adopted, "harvested from the killed agent's process");
    assert_eq!(end.starts, 1);
    assert_eq!(sb.lines("counter"), 1, "the job ran exactly once");
    let text = http_get(port, "/metrics").unwrap().1;
    assert_eq!(metric(&text, jobs, &[("state", "running")]), 0.0, "{text}");
    assert_eq!(metric(&text, jobs, &[("state", "ended")]), 1.0, "{text}");
    assert_eq!(
        metric(&text, "casebatch_agent_envelope_jobs", &[]),
        0.0,
        "{text}"
    );

    assert_eq!(stop(&mut again), 0, "SIGTERM stops the agent cleanly");
    assert!(!data.join("agent.addr").exists());
}

#[test]
fn an_agent_off_loopback_without_tls_and_a_token_is_refused() {
    let sb = Sandbox::new();
    let data = sb.path("agent-data");
    let o = sb.run(&[
        "agent",
        "--listen",
        "0.0.0.0:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_exit(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains("0.0.0.0:0 is not a loopback address")
            && err.contains("--tls-cert")
            && err.contains("--token-env"),
        "{err}"
    );
    assert!(
        !data.exists(),
        "nothing is created for a refused configuration"
    );

    let on_loopback = |extra: &[&str]| {
        let mut args = vec!["agent", "--listen", "127.0.0.1:0"];
        args.extend(["--data-dir", data.to_str().unwrap()]);
        args.extend(extra);
        sb.run(&args)
    };
    // The token is never a command-line value.
    assert_exit(&on_loopback(&["--token", "x"]), 2);

    // A retention that is not a duration says what one looks like, and touches nothing.
    let o = on_loopback(&["--keep-ended", "1 week"]);
    assert_exit(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains("--keep-ended \"1 week\"") && err.contains("7d"),
        "{err}"
    );
    assert!(!data.exists());
}
