//! Batches on runtime agents: jobs run on `casebatch agent` processes and outlive the worker
//! replicas that drive them. Real agents on loopback gRPC, real worker replicas, a real dev
//! server; every crash is a SIGKILL, and side effects are counted by the harness itself.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::*;

/// A harness that records `<case> <agent>` when it starts, waits for `$SANDBOX/go`, and
/// records `<case>` again when it ends: each line of `started.log` is one job start.
const GATED: &str = r#"echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/started.log"; while [ ! -e "$SANDBOX/go" ]; do sleep 0.1; done; echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ended.log"; echo '{}' > "$CASEBATCH_RESULT""#;

fn manifest(batch: &str, agents: &[&Agent], cases: usize, harness: &str, extra: &str) -> String {
    let mut m = format!("batch_id: {batch}\nruntimes:\n");
    for a in agents {
        m.push_str(&format!(
            "  {}: {{kind: agent, endpoint: '{}'}}\n",
            a.name,
            a.endpoint()
        ));
    }
    // Several agents: the cases are dealt to them in turn (`runtime: [a, b]`).
    let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
    let runtime = match names.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    };
    m.push_str(&format!(
        "defaults:\n  concurrency: {cases}\n  runtime: {runtime}\n  pass_env: [SANDBOX, AGENT_NAME]\n  harness: '{}'\n{extra}tasks:\n",
        harness.replace('\'', "''")
    ));
    for i in 0..cases {
        m.push_str(&format!("  - {{task_id: c{i}}}\n"));
    }
    m
}

/// Lines of a sandbox file.
fn lines(sb: &Sandbox, rel: &str) -> Vec<String> {
    sb.read(rel).lines().map(str::to_string).collect()
}

/// The identities of the workers that ran the batch's activities, from its history.
fn activity_workers(sb: &Sandbox, batch: &str, address: &str) -> BTreeSet<String> {
    let file = sb.path(&format!("{batch}-history.json"));
    let out = sb.out();
    let o = sb.run(&[
        "batch",
        "history",
        "--batch-id",
        batch,
        "--output-dir",
        out.to_str().unwrap(),
        "--out",
        file.to_str().unwrap(),
        "--address",
        address,
    ]);
    assert_exit(&o, 0);
    let history = sb.json(&file);
    history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["attributes"]["ActivityTaskStartedEventAttributes"]["identity"].as_str())
        .map(str::to_string)
        .collect()
}

#[test]
fn a_batch_spreads_over_two_agents_and_two_worker_replicas() {
    let sb = Sandbox::engine();
    let (cluster, mut w1, mut w2) = replicas_on_a_cluster(&sb);
    let a = Agent::start(&sb, "box-a", &[]);
    let b = Agent::start(&sb, "box-b", &[]);
    sb.write("go", "");
    // Twice the 32 eager starts a workflow task hands to its own worker, so half the batch
    // has to go through matching, where both replicas poll. The evaluator runs on the agent
    // that ran the job (not on a worker), and judges the result the job wrote.
    let extra = concat!(
        r#"  evaluator: 'test -s "$CASEBATCH_ACTOR_RESULT" && [ "${AGENT_NAME#box-}" != "$AGENT_NAME" ] && printf ''{"verdict": "pass"}'' > "$CASEBATCH_RESULT"'"#,
        "\nsummary:\n  write_csv: true\n"
    );
    let m = sb.write(
        "spread.yaml",
        &manifest("spread", &[&a, &b], 64, GATED, extra),
    );
    let mut runner = sb.spawn_batch_on_cluster(&m, &cluster, "run.log");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(180)),
        0,
        "{}\nc0: {:#}",
        sb.read("run.log"),
        sb.case_result("spread", "c0")
    );
    for w in [&mut w1, &mut w2] {
        assert_eq!(stop(w), 0);
    }
    let started = lines(&sb, "started.log");
    assert_eq!(started.len(), 64, "each case started once: {started:?}");
    // `runtime: [box-a, box-b]` dealt the cases in turn, and every case's records name the
    // agent that really ran it.
    for line in &started {
        let (case, agent) = line.split_once(' ').unwrap();
        let i: usize = case.trim_start_matches('c').parse().unwrap();
        assert_eq!(agent, ["box-a", "box-b"][i % 2], "{started:?}");
        assert_eq!(sb.case_result("spread", case)["runtime"], agent);
    }
    let summary = sb.json(&sb.bundle("spread").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 64, "{summary:#}");
    assert_eq!(
        sb.case_result("spread", "c1")["verdict"],
        "pass",
        "judged by its evaluator"
    );
    assert_eq!(summary["cases_by_runtime"]["box-a"], 32, "{summary:#}");
    assert_eq!(summary["cases_by_runtime"]["box-b"], 32, "{summary:#}");
    let csv = std::fs::read_to_string(sb.bundle("spread").join("batch_summary.csv")).unwrap();
    assert!(csv.lines().next().unwrap().ends_with(",runtime"), "{csv}");
    assert!(
        csv.lines()
            .any(|l| l.starts_with("c1,") && l.ends_with(",box-b")),
        "{csv}"
    );
    // The artifacts came back from the agents into the bundle.
    assert!(sb.attempt_file("spread", "c0", 1, "result.json").exists());
    let workers = activity_workers(&sb, "spread", &cluster.address);
    assert!(
        workers.len() >= 2,
        "both replicas ran the batch's activities: {workers:?}"
    );
}

#[test]
fn a_worker_replica_killed_mid_batch_leaves_its_jobs_to_the_other() {
    let sb = Sandbox::engine();
    let (cluster, mut w1, mut w2) = replicas_on_a_cluster(&sb);
    let a = Agent::start(&sb, "box-a", &[]);
    let m = sb.write("adopt.yaml", &manifest("adopt", &[&a], 8, GATED, ""));
    let mut runner = sb.spawn_batch_on_cluster(&m, &cluster, "run.log");
    wait_until(Duration::from_secs(90), "all 8 jobs are running", || {
        lines(&sb, "started.log").len() == 8
    });
    // Kill the replica that is awaiting jobs (both may be): its settles die with it.
    let holders = settle_holders(&cluster, "adopt", 8);
    let (victim, survivor) = if holders.contains(&w1.id()) {
        (&mut w1, &mut w2)
    } else {
        (&mut w2, &mut w1)
    };
    assert!(holders.contains(&victim.id()), "{holders:?}");
    victim.kill().unwrap();
    victim.wait().unwrap();
    sb.write("go", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(180)),
        0,
        "{}",
        sb.read("run.log")
    );
    assert_eq!(stop(survivor), 0);
    assert_eq!(
        lines(&sb, "started.log").len(),
        8,
        "no in-flight case started twice"
    );
    assert_eq!(lines(&sb, "ended.log").len(), 8);
    let summary = sb.json(&sb.bundle("adopt").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 8, "{summary:#}");
    for i in 0..8 {
        let r = sb.case_result("adopt", &format!("c{i}"));
        assert_eq!(r["attempts"], 1, "c{i}: {r:#}");
        assert_eq!(r["job_starts"], 1, "c{i}: {r:#}");
    }
}

/// The pids of the workers running the batch's `settle` activities, once `n` of them run
/// (pending activities name their worker: `<pid>@<host>`).
fn settle_holders(cluster: &Cluster, batch: &str, n: usize) -> BTreeSet<u32> {
    let mut holders = BTreeSet::new();
    wait_until(Duration::from_secs(60), "the settles run", || {
        let settles: Vec<u32> = pending_activities(&cluster.address, batch, "settle")
            .iter()
            .filter_map(|a| {
                a["lastWorkerIdentity"]
                    .as_str()?
                    .split('@')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        holders = settles.iter().copied().collect();
        settles.len() == n
    });
    holders
}

#[test]
fn an_agent_killed_mid_batch_and_restarted_reattaches_every_job() {
    let sb = Sandbox::engine();
    let mut a = Agent::start(&sb, "box-a", &[]);
    let m = sb.write("restart.yaml", &manifest("restart", &[&a], 6, GATED, ""));
    let mut runner = sb.spawn_batch(&m, "run.log");
    wait_until(Duration::from_secs(90), "all 6 jobs are running", || {
        lines(&sb, "started.log").len() == 6
    });
    a.kill();
    a.restart(&sb);
    sb.write("go", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(180)),
        0,
        "{}",
        sb.read("run.log")
    );
    assert_eq!(lines(&sb, "started.log").len(), 6, "no job ran twice");
    assert_eq!(lines(&sb, "ended.log").len(), 6);
    let summary = sb.json(&sb.bundle("restart").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 6, "{summary:#}");
    assert!(
        sb.read("agent-box-a.log").contains("6 jobs re-attached"),
        "{}",
        sb.read("agent-box-a.log")
    );
}

#[test]
fn an_agent_memory_budget_never_lets_declared_memory_overlap() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &["--memory-budget-mb", "600"]);
    let m = sb.write("budget.yaml", &heavy_manifest("budget", &a));
    assert_exit(&sb.run_batch(&m), 0);
    assert_one_job_at_a_time(&sb);
    // Nothing told the batch about the budget: the agent refused the extra jobs and `start`
    // waited them out.
    let events = std::fs::read_to_string(sb.bundle("budget").join("events.jsonl")).unwrap();
    assert!(events.contains("runtime_full"), "{events}");
}

#[test]
fn a_declared_envelope_queues_cases_in_the_batch_instead_of_the_runtime_refusing_them() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &["--memory-budget-mb", "600"]);
    let declared = heavy_manifest("envelope", &a)
        .replace("kind: agent,", "kind: agent, memory_budget_mb: 600,");
    let m = sb.write("envelope.yaml", &declared);
    assert_exit(&sb.run_batch(&m), 0);
    assert_one_job_at_a_time(&sb);
    // The workflow admitted one 512 MB case at a time: the agent never had to refuse one.
    let events = std::fs::read_to_string(sb.bundle("envelope").join("events.jsonl")).unwrap();
    assert!(!events.contains("runtime_full"), "{events}");

    // Without the agent's own limit, the same four cases overlap: the envelope is what held
    // them back, not the harness.
    let b = Agent::start(&sb, "box-b", &[]);
    let unbounded = sb.write("unbounded.yaml", &heavy_manifest("unbounded", &b));
    std::fs::remove_file(sb.path("spans.log")).unwrap();
    assert_exit(&sb.run_batch(&unbounded), 0);
    assert!(most_jobs_at_once(&sb) > 1, "{:?}", lines(&sb, "spans.log"));
}

/// Four cases declaring 512 MB each, all allowed in flight by the batch, on one agent. Each
/// job records its start and end on a shared clock.
fn heavy_manifest(batch: &str, agent: &Agent) -> String {
    let harness = r#"echo "start $(date +%s%N)" >> "$SANDBOX/spans.log"; sleep 0.5; echo "end $(date +%s%N)" >> "$SANDBOX/spans.log"; echo '{}' > "$CASEBATCH_RESULT""#;
    manifest(
        batch,
        &[agent],
        4,
        harness,
        "  resources: {memory_mb: 512}\n",
    )
}

/// The most jobs that ran at once, from `spans.log`.
fn most_jobs_at_once(sb: &Sandbox) -> i32 {
    let mut events: Vec<(u128, bool)> = lines(sb, "spans.log")
        .iter()
        .map(|l| {
            let (kind, t) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), kind == "start")
        })
        .collect();
    assert_eq!(events.len(), 8, "4 jobs, each started and ended once");
    events.sort();
    let mut running = 0;
    let mut most = 0;
    for (_, start) in events {
        running += if start { 1 } else { -1 };
        most = most.max(running);
    }
    most
}

fn assert_one_job_at_a_time(sb: &Sandbox) {
    assert_eq!(
        most_jobs_at_once(sb),
        1,
        "two 512 MB jobs overlapped under a 600 MB budget"
    );
}

#[test]
fn cancelling_a_batch_on_an_agent_kills_its_jobs_and_confirms_their_cleanup() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &[]);
    let m = sb.write(
        "cancel.yaml",
        &manifest("cancel-agent", &[&a], 3, GATED, ""),
    );
    let mut runner = sb.spawn_batch(&m, "run.log");
    wait_until(Duration::from_secs(90), "all 3 jobs are running", || {
        lines(&sb, "started.log").len() == 3
    });
    assert_exit(&sb.op("cancel", "cancel-agent"), 0);
    assert_eq!(wait_child(&mut runner, Duration::from_secs(120)), 4);
    let summary = sb.json(&sb.bundle("cancel-agent").join("batch_summary.json"));
    assert_eq!(summary["counts"]["cancelled"], 3, "{summary:#}");
    for i in 0..3 {
        let receipt = sb.recorded("cancel-agent", &format!("c{i}"), 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    }
    assert!(
        no_process_matches("ended.log"),
        "no harness survives the cancel on the agent"
    );
    assert!(lines(&sb, "ended.log").is_empty());
}

#[test]
fn an_evaluator_runs_on_the_agent_in_the_jobs_cgroup_and_its_detached_process_dies_at_cleanup() {
    let sb = Sandbox::engine_alone();
    let _reaper = KillOnDrop("sleep 3023");
    let a = Agent::start(&sb, "box-a", &[]);
    // The evaluator must run where the actor ran (it looks for the actor's working file and
    // reads the agent's AGENT_NAME), and leaves a process out of its session and without the
    // allocation marker: only the job's cgroup holds it.
    let harness = r#"echo acted > work.txt; echo '{}' > "$CASEBATCH_RESULT""#;
    let evaluator = concat!(
        r#"  evaluator: 'test -s work.txt && [ "$AGENT_NAME" = box-a ] && "#,
        r#"{ setsid env -i sleep 3023 > /dev/null 2>&1 & echo "judged on $AGENT_NAME"; "#,
        r#"printf ''{"verdict": "pass", "scores": {"n": 1}}'' > "$CASEBATCH_RESULT"; }'"#,
        "\n"
    );
    let m = sb.write(
        "eval-agent.yaml",
        &manifest("eval-agent", &[&a], 1, harness, evaluator),
    );
    // The runner's worker has an AGENT_NAME of its own: an evaluator run there says so.
    let o = sb.run_env(&batch_run_args(&m, &sb.out()), &[("AGENT_NAME", "worker")]);
    assert_exit(&o, 0);
    let result = sb.case_result("eval-agent", "c0");
    assert_eq!(
        (&result["state"], &result["verdict"]),
        (&"succeeded".into(), &"pass".into()),
        "{result:#}"
    );
    let evaluation = sb.recorded("eval-agent", "c0", 1, "evaluation");
    assert_eq!(evaluation["scores"]["n"], 1, "{evaluation:#}");
    assert_eq!(evaluation["exit_code"], 0, "{evaluation:#}");
    // The evaluator's files came back into the bundle.
    let log = sb.attempt_file("eval-agent", "c0", 1, "evaluator.stdout.log");
    assert_eq!(std::fs::read_to_string(log).unwrap(), "judged on box-a\n");
    assert!(
        sb.attempt_file("eval-agent", "c0", 1, "evaluator_result.json")
            .exists()
    );
    let receipt = sb.recorded("eval-agent", "c0", 1, "cleanup");
    assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    assert!(
        !receipt["killed"].as_array().unwrap().is_empty(),
        "the evaluator's sleep was killed with the job's cgroup: {receipt:#}"
    );
    assert!(
        no_process_matches("sleep 3023"),
        "survivors of the agent's cleanup:\n{}\nreceipt: {receipt:#}",
        describe_processes(&processes_matching("sleep 3023"))
    );
}

#[test]
fn a_wrong_token_fails_the_case_as_config_naming_where_the_worker_read_it() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &["--token-env", "AGENT_TOKEN"]);
    let text = format!(
        "batch_id: BATCH\nruntimes:\n  box-a: {{kind: agent, endpoint: '{}', token_env: WORKER_TOKEN}}\n\
         defaults: {{runtime: box-a, harness: 'echo {{}} > \"$CASEBATCH_RESULT\"'}}\ntasks: [{{task_id: t}}]\n",
        a.endpoint()
    );
    let run = |batch: &str, token: &str| {
        let m = sb.write(&format!("{batch}.yaml"), &text.replace("BATCH", batch));
        sb.run_env(&batch_run_args(&m, &sb.out()), &[("WORKER_TOKEN", token)])
    };
    assert_exit(&run("wrong-token", "not-the-token"), 4);
    let r = sb.case_result("wrong-token", "t");
    assert_eq!(r["failure"]["code"], "RUNTIME_AUTH", "{r:#}");
    assert_eq!(r["failure"]["class"], "config", "{r:#}");
    assert_eq!(r["attempts"], 1, "config failures are not retried: {r:#}");
    let message = r["failure"]["message"].as_str().unwrap();
    assert!(message.contains("$WORKER_TOKEN"), "{message}");
    assert!(!message.contains("not-the-token"), "{message}");
    assert_exit(&run("right-token", AGENT_TOKEN), 0);
}

/// A runtimes table for `runtime: [box-a, box-b]` with a quick failover: a worker gives an
/// unreachable agent 2 s, 3 failures open a circuit for 15 s.
fn failover_manifest(batch: &str, agents: &[&Agent], cases: usize, harness: &str) -> String {
    manifest(batch, agents, cases, harness, "").replace(
        "kind: agent,",
        "kind: agent, unreachable_grace_s: 2, breaker_failures: 3, breaker_cooldown_s: 15,",
    )
}

/// Every attempt record of a case, in order.
fn attempts(sb: &Sandbox, batch: &str, case: &str) -> Vec<serde_json::Value> {
    (1..)
        .map(|n| sb.recorded(batch, case, n, "record"))
        .take_while(|r| !r.is_null())
        .collect()
}

fn timeline(status: &serde_json::Value) -> Vec<String> {
    status["status"]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["message"].as_str().unwrap().to_string())
        .collect()
}

/// The failover drill: a runtime of the list dies mid-batch and stays down a while. Cases
/// spill to the other runtime, its circuit opens after 3 failures and later cases skip it
/// without failing, the batch runs at half width, and a batch started during the outage
/// skips it from its first case; once it is back, one probe closes the circuit and the
/// width is restored.
#[test]
fn a_dead_runtime_spills_its_cases_and_its_shared_circuit_opens_then_closes() {
    let sb = Sandbox::engine();
    let mut a = Agent::start(&sb, "box-a", &[]);
    let b = Agent::start(&sb, "box-b", &[]);
    // Every case waits for `go`; c18 and later also for `go2`, so the batch outlasts the
    // circuit's cooldown.
    let harness = r#"echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/started.log"; while [ ! -e "$SANDBOX/go" ]; do sleep 0.1; done; n=${CASEBATCH_CASE_ID#c}; if [ "$n" -ge 18 ]; then while [ ! -e "$SANDBOX/go2" ]; do sleep 0.1; done; fi; echo '{}' > "$CASEBATCH_RESULT""#;
    let text = failover_manifest("failover", &[&a, &b], 24, harness)
        .replace("concurrency: 24", "concurrency: 4");
    let m = sb.write("failover.yaml", &text);
    let mut runner = sb.spawn_batch(&m, "run.log");
    wait_until(Duration::from_secs(90), "the first 4 jobs run", || {
        lines(&sb, "started.log").len() == 4
    });
    a.kill();
    sb.write("go", "");
    let mut status = serde_json::Value::Null;
    wait_until(Duration::from_secs(90), "box-a's circuit opens", || {
        status = sb.status("failover");
        status["status"]["open_circuits"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    });
    assert_eq!(status["status"]["width"], 2, "{status:#}");
    let retry_at_ms = status["status"]["open_circuits"][0]["retry_at_ms"]
        .as_u64()
        .unwrap();

    // A second batch during the outage skips box-a from its first case, failing nothing.
    let quick = r#"echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/second.log"; echo '{}' > "$CASEBATCH_RESULT""#;
    let second = sb.write(
        "second.yaml",
        &failover_manifest("second", &[&a, &b], 4, quick),
    );
    assert_exit(&sb.run_batch(&second), 0);
    assert!(
        lines(&sb, "second.log")
            .iter()
            .all(|l| l.ends_with(" box-b")),
        "{:?}",
        lines(&sb, "second.log")
    );
    for i in 0..4 {
        let tries = attempts(&sb, "second", &format!("c{i}"));
        assert_eq!(tries.len(), 1, "c{i}: {tries:#?}");
        assert_eq!(tries[0]["runtime_name"], "box-b");
    }

    // box-a comes back; once its cooldown is over, the next dispatch probes it.
    a.restart(&sb);
    wait_until(Duration::from_secs(60), "the cooldown is over", || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            > retry_at_ms
    });
    sb.write("go2", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(180)),
        0,
        "{}",
        sb.read("run.log")
    );

    let summary = sb.json(&sb.bundle("failover").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 24, "{summary:#}");
    let status = sb.status("failover");
    let steps = timeline(&status);
    let has = |text: &str| steps.iter().any(|s| s.contains(text));
    assert!(has("runtime spillover box-a → box-b ("), "{steps:#?}");
    assert!(has("runtime box-a: circuit open"), "{steps:#?}");
    assert!(
        has("concurrency 4 → 2: circuit open on box-a"),
        "{steps:#?}"
    );
    assert!(has("runtime box-a: circuit closed"), "{steps:#?}");
    assert!(has("concurrency 2 → 4: circuits closed"), "{steps:#?}");
    let counters = &status["status"]["counters"];
    assert!(counters["spillovers"].as_u64().unwrap() >= 1, "{counters}");
    let ran: Vec<String> = (0..24)
        .map(|i| {
            let tries: Vec<String> = attempts(&sb, "failover", &format!("c{i}"))
                .iter()
                .map(|t| format!("{} {}", t["runtime_name"], t["summary"]["failure"]["code"]))
                .collect();
            format!("c{i}: {}", tries.join(", "))
        })
        .collect();
    assert!(
        counters["circuit_skips"].as_u64().unwrap() >= 1,
        "{counters}\n{ran:#?}\n{steps:#?}"
    );

    // Dispatches that found box-a dead: the 3 that opened the circuit, plus at most those
    // already on their way (4 wide); the rest of its share never tried it.
    let mut dead_dispatches = 0;
    let mut skipped_clean = 0;
    for i in 0..24 {
        let case = format!("c{i}");
        let tries = attempts(&sb, "failover", &case);
        dead_dispatches += tries
            .iter()
            .filter(|t| {
                t["runtime_name"] == "box-a"
                    && t["summary"]["failure"]["code"] == "RUNTIME_UNREACHABLE"
                    && t["summary"]["failure"]["stage"] == "submit"
            })
            .count();
        // A share of box-a that ran once, on box-b, never failed there.
        if i % 2 == 0 && tries.len() == 1 && tries[0]["runtime_name"] == "box-b" {
            skipped_clean += 1;
        }
        assert_eq!(sb.case_result("failover", &case)["state"], "succeeded");
    }
    assert!(
        (3..=6).contains(&dead_dispatches),
        "{dead_dispatches} dispatches reached the dead box-a"
    );
    assert!(skipped_clean >= 1, "no case of box-a's share skipped it");
}

/// A re-fire supersedes a stale batch: `batch run --supersede` stops its admissions and kills
/// its running jobs on the agent at once (kill by batch), the stale run ends as superseded
/// with its finished result intact, and the new run re-runs only the killed cases.
#[test]
fn supersede_kills_a_stale_batch_s_running_jobs_and_a_new_run_replaces_it() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &[]);
    // c0 ends at once; the others sleep until the re-fire (`fast`) makes them quick.
    let harness = r#"echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/started.log"; if [ "$CASEBATCH_CASE_ID" != c0 ] && [ ! -e "$SANDBOX/fast" ]; then sleep 31; fi; echo '{}' > "$CASEBATCH_RESULT""#;
    let m = sb.write("stale.yaml", &manifest("stale", &[&a], 4, harness, ""));
    let mut stale = sb.spawn_batch(&m, "stale.log");
    wait_until(
        Duration::from_secs(90),
        "3 sleeping jobs and c0 done",
        || {
            lines(&sb, "started.log").len() == 4
                && sb.bundle("stale").join("cases/c0/result.json").exists()
        },
    );
    assert!(!processes_matching("sleep 31").is_empty());
    sb.write("fast", "");
    let out = sb.out();
    let mut refire = sb.spawn(
        &[
            "batch",
            "run",
            "--manifest",
            m.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
            "--supersede",
        ],
        "refire.log",
    );
    wait_until(
        Duration::from_secs(10),
        "the superseded jobs are killed",
        || no_process_matches("sleep 31"),
    );
    assert_eq!(
        wait_child(&mut stale, Duration::from_secs(60)),
        1,
        "the superseded runner ends incomplete: {}",
        sb.read("stale.log")
    );
    assert_eq!(
        wait_child(&mut refire, Duration::from_secs(120)),
        0,
        "{}",
        sb.read("refire.log")
    );
    assert!(
        sb.read("stale.log").contains("superseded"),
        "{}",
        sb.read("stale.log")
    );
    // c0's result stood; only the killed cases ran again.
    let started = lines(&sb, "started.log");
    assert_eq!(
        started.iter().filter(|c| *c == "c0").count(),
        1,
        "{started:?}"
    );
    for c in ["c1", "c2", "c3"] {
        assert_eq!(started.iter().filter(|l| *l == c).count(), 2, "{started:?}");
        let receipt = sb.recorded("stale", c, 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    }
    let summary = sb.json(&sb.bundle("stale").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 4, "{summary:#}");
    let events = std::fs::read_to_string(sb.bundle("stale").join("events.jsonl")).unwrap();
    assert!(
        events.contains("superseded: 3 job(s) killed on the agents"),
        "{events}"
    );
}

/// A harness for a fast and a 3×-slower agent: `sleep $1` on `fast`, `sleep $2` elsewhere;
/// each start and end is a line of `started.log` / `ended.log`.
fn paced(fast_s: &str, slow_s: &str) -> String {
    format!(
        r#"echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/started.log"; if [ "$AGENT_NAME" = fast ]; then sleep {fast_s}; else sleep {slow_s}; fi; echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/ended.log"; echo '{{}}' > "$CASEBATCH_RESULT""#
    )
}

/// Cases of a plan by the runtime they were dealt to.
fn dealt(plan: &serde_json::Value) -> std::collections::BTreeMap<String, usize> {
    let mut by = std::collections::BTreeMap::new();
    for case in plan["cases"].as_array().unwrap() {
        *by.entry(case["runtime_name"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    by
}

/// The run history weighs a runtime list: after one batch on a fast and a 3×-slower agent,
/// a new 8-case batch is dealt about 6:2 toward the fast one (evenly it was 4:4), the plan
/// says why, and `casebatch history` shows the medians it came from.
#[test]
fn the_run_history_deals_a_list_toward_its_faster_runtime() {
    let sb = Sandbox::engine();
    let slow = Agent::start(&sb, "slow", &[]);
    let fast = Agent::start(&sb, "fast", &[]);
    let learn = sb.write(
        "learn.yaml",
        &manifest("learn", &[&slow, &fast], 4, &paced("1", "3"), ""),
    );
    assert_exit(&sb.run_batch(&learn), 0);
    let even = sb.json(&sb.bundle("learn").join("batch_plan.json"));
    assert_eq!(dealt(&even)["fast"], 2, "no history yet: dealt evenly");
    assert!(even.get("spread").is_none(), "{even:#}");

    let out = sb.out();
    let o = sb.run(&["history", "--output-dir", out.to_str().unwrap(), "--json"]);
    assert_exit(&o, 0);
    let view: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let median = |runtime: &str| {
        view["medians"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["runtime"] == runtime)
            .unwrap_or_else(|| panic!("no median for {runtime}: {view:#}"))["median_ms"]
            .as_u64()
            .unwrap()
    };
    assert!(
        median("slow") > 2 * median("fast"),
        "slow {} ms, fast {} ms",
        median("slow"),
        median("fast")
    );

    let weighted = sb.write(
        "weighted.yaml",
        &manifest("weighted", &[&slow, &fast], 8, &paced("1", "3"), ""),
    );
    let o = sb.run(&[
        "batch",
        "plan",
        "--manifest",
        weighted.to_str().unwrap(),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_exit(&o, 0);
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("dealt by weight"), "{said}");
    let plan = sb.json(&sb.bundle("weighted").join("batch_plan.json"));
    let by = dealt(&plan);
    assert!(
        (6..=7).contains(&by["fast"]),
        "fast should take about 6 of 8: {by:?}\n{said}"
    );
    assert!(
        plan["spread"]["source"]
            .as_str()
            .unwrap()
            .contains("1 earlier batch"),
        "{:#}",
        plan["spread"]
    );
    // Running it keeps the deal the plan recorded.
    assert_exit(&sb.run_batch(&weighted), 0);
    let ran = sb.json(&sb.bundle("weighted").join("batch_plan.json"));
    assert_eq!(dealt(&ran), by);
    let o = sb.run(&[
        "history",
        "rebuild",
        "--output-dir",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_exit(&o, 0);
    let rebuilt: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rebuilt["refreshed"]["indexed"], 2, "{rebuilt:#}");
}

/// Tail speculation: once every case is dispatched, the stragglers on the slow agent get a
/// duplicate on the fast one; the duplicate wins, the original's job is killed and its
/// attempt kept as evidence, and each case has exactly one result.
#[test]
fn a_straggler_on_a_slow_runtime_is_duplicated_on_a_fast_one_and_the_first_result_wins() {
    let sb = Sandbox::engine();
    let slow = Agent::start(&sb, "slow", &[]);
    let fast = Agent::start(&sb, "fast", &[]);
    let m = sb.write(
        "tail.yaml",
        &manifest("tail", &[&slow, &fast], 4, &paced("1", "47"), ""),
    );
    let o = sb.run_batch(&m);
    assert_exit(&o, 0);
    let status = sb.status("tail");
    let counters = &status["status"]["counters"];
    assert_eq!(counters["speculations"], 2, "{counters}");
    assert_eq!(counters["speculation_wins"], 2, "{counters}");
    assert_eq!(counters["retries"], 0, "{counters}");
    let steps = timeline(&status);
    assert!(
        steps.iter().any(|s| s == "tail speculation slow ⇢ fast"),
        "{steps:#?}"
    );
    // The slow share (c0, c2) started twice, ended once, on the fast agent.
    let ended = lines(&sb, "ended.log");
    for case in ["c0", "c2"] {
        let tries = attempts(&sb, "tail", case);
        assert_eq!(tries.len(), 2, "{case}: {tries:#?}");
        assert_eq!(tries[0]["runtime_name"], "slow");
        assert_eq!(tries[0]["summary"]["speculative_loser"], true);
        assert_eq!(tries[0]["summary"]["actor"], "cancelled");
        assert_eq!(tries[0]["cleanup_confirmed"], true);
        assert_eq!(tries[1]["runtime_name"], "fast");
        assert!(tries[1]["summary"].get("speculative_loser").is_none());
        let result = sb.case_result("tail", case);
        assert_eq!(result["state"], "succeeded", "{result:#}");
        assert_eq!(result["attempts"], 2);
        assert_eq!(
            ended
                .iter()
                .filter(|l| l.starts_with(&format!("{case} ")))
                .collect::<Vec<_>>(),
            [&format!("{case} fast")],
            "one result per case: {ended:?}"
        );
    }
    for case in ["c1", "c3"] {
        assert_eq!(
            attempts(&sb, "tail", case).len(),
            1,
            "{case}: no speculation"
        );
    }
    assert!(no_process_matches("sleep 47"), "the losers' jobs are gone");
    let summary = sb.json(&sb.bundle("tail").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 4, "{summary:#}");
    assert_eq!(summary["speculative_losers"], 2, "{summary:#}");
    assert_eq!(summary["attempts_total"], 6, "{summary:#}");
}

/// The runner is SIGKILLed mid-race, after both duplicates started and before they end; the
/// agents' jobs outlive it. `resume` replays the race: the duplicates are adopted, win, and
/// the originals are stopped. No copy starts a third time and each case has one result.
#[test]
fn a_runner_killed_mid_race_resumes_it_and_each_case_keeps_one_result() {
    let sb = Sandbox::engine();
    let slow = Agent::start(&sb, "slow", &[]);
    let fast = Agent::start(&sb, "fast", &[]);
    // The duplicates wait for `go`, so the kill lands while both copies of each run.
    let harness = r#"echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/started.log"; if [ "$AGENT_NAME" = slow ]; then sleep 53; elif [ "$CASEBATCH_ATTEMPT" = 2 ]; then while [ ! -e "$SANDBOX/go" ]; do sleep 0.1; done; else sleep 1; fi; echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/ended.log"; echo '{}' > "$CASEBATCH_RESULT""#;
    let m = sb.write(
        "race.yaml",
        &manifest("race", &[&slow, &fast], 4, harness, ""),
    );
    let mut runner = sb.spawn_batch(&m, "run.log");
    wait_until(Duration::from_secs(90), "both duplicates start", || {
        lines(&sb, "started.log")
            .iter()
            .filter(|l| l.starts_with("c0 fast") || l.starts_with("c2 fast"))
            .count()
            == 2
    });
    runner.kill().unwrap(); // SIGKILL
    runner.wait().unwrap();
    sb.write("go", "");
    let o = sb.op("resume", "race");
    assert_exit(&o, 0);

    let started = lines(&sb, "started.log");
    assert_eq!(
        started.len(),
        6,
        "4 cases + 2 duplicates, none again: {started:?}"
    );
    let ended = lines(&sb, "ended.log");
    for case in ["c0", "c2"] {
        let tries = attempts(&sb, "race", case);
        assert_eq!(tries.len(), 2, "{case}: {tries:#?}");
        assert_eq!(tries[0]["summary"]["speculative_loser"], true);
        assert_eq!(tries[0]["cleanup_confirmed"], true);
        assert_eq!(tries[1]["runtime_name"], "fast");
        assert_eq!(sb.case_result("race", case)["state"], "succeeded");
        assert_eq!(
            ended
                .iter()
                .filter(|l| l.starts_with(&format!("{case} ")))
                .count(),
            1,
            "{ended:?}"
        );
    }
    assert!(no_process_matches("sleep 53"), "the losers' jobs are gone");
    let status = sb.status("race");
    assert_eq!(
        status["status"]["counters"]["speculation_wins"], 2,
        "{status:#}"
    );
}

/// The seeds' drill: a runtime of the list dead before the batch and left down, a healthy one
/// beside it, eight cases (max_retries 2, 4 wide, a 1 s harness): eight pass, no retry is
/// spent on the dead runtime, dispatches that found it refused move on at once (nothing
/// reached it, so nothing waits for its cleanup), and the batch takes well under three times
/// as long as with both agents up. Then the same pair under a 1 s cooldown, so probes go
/// through mid-batch: once its circuit is open only probes try the dead runtime, and each
/// probe that fails moves its case on without spending its retries.
#[test]
fn a_runtime_left_dead_fails_no_case_and_only_probes_try_it_once_its_circuit_opened() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &[]);
    let mut b = Agent::start(&sb, "box-b", &[]);
    let harness = r#"echo "$CASEBATCH_CASE_ID $AGENT_NAME" >> "$SANDBOX/started-$CASEBATCH_BATCH_ID.log"; sleep 1; echo '{}' > "$CASEBATCH_RESULT""#;
    let text = |batch: &str, cases: usize, a: &Agent, b: &Agent| {
        manifest(batch, &[a, b], cases, harness, "  max_retries: 2\n")
            .replace(&format!("concurrency: {cases}"), "concurrency: 4")
    };
    let up = text("up", 8, &a, &b);
    let down = text("down", 8, &a, &b);
    // Other names are other breakers: a cooldown of 1 s from the first dispatch on.
    let probed = text("probed", 16, &a, &b)
        .replace("box-a:", "probe-a:")
        .replace("box-b:", "probe-b:")
        .replace("[box-a, box-b]", "[probe-a, probe-b]")
        .replace("kind: agent,", "kind: agent, breaker_cooldown_s: 1,");
    let began = std::time::Instant::now();
    assert_exit(&sb.run_batch(&sb.write("up.yaml", &up)), 0);
    let both_up = began.elapsed();

    // Left dead: its endpoint now a port that refuses every connection.
    b.kill();
    let dead = DeadPort::new();
    let (down, probed) = (
        down.replace(&b.endpoint(), &dead.endpoint()),
        probed.replace(&b.endpoint(), &dead.endpoint()),
    );
    let began = std::time::Instant::now();
    let o = sb.run_batch(&sb.write("down.yaml", &down));
    let one_down = began.elapsed();
    assert_exit(&o, 0);
    let (on_dead, _) = check_dead_runtime_drill(&sb, "down", 8, "box-a", "box-b");
    eprintln!(
        "dead runtime left down: both up {both_up:?}, one down {one_down:?}, {on_dead} \
         attempts on the dead runtime"
    );
    assert!(
        one_down < both_up * 3,
        "one runtime down took {one_down:?}, both up {both_up:?}"
    );

    assert_exit(&sb.run_batch(&sb.write("probed.yaml", &probed)), 0);
    let (_, probes) = check_dead_runtime_drill(&sb, "probed", 16, "probe-a", "probe-b");
    assert!(probes >= 1, "a probe went through mid-batch");
}

/// Checks a batch of `cases` on `[alive, dead]` with `dead` down throughout; returns the
/// attempts made on `dead` and how many of them were probes.
fn check_dead_runtime_drill(
    sb: &Sandbox,
    batch: &str,
    cases: usize,
    alive: &str,
    dead: &str,
) -> (usize, usize) {
    let summary = sb.json(&sb.bundle(batch).join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], cases, "{summary:#}");
    let status = sb.status(batch);
    let opened = format!("runtime {dead}: circuit open");
    let opened_at = status["status"]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["message"] == opened.as_str())
        .and_then(|s| s["at_ms"].as_u64())
        .unwrap_or_else(|| panic!("{dead}'s circuit opened: {status:#}"));
    let counters = &status["status"]["counters"];
    assert_eq!(
        counters["retries"], 0,
        "no retry was spent on {dead}: {counters}"
    );
    let mut on_dead = 0;
    let mut probes = 0;
    let mut report = Vec::new();
    for i in 0..cases {
        let case = format!("c{i}");
        let tries = attempts(sb, batch, &case);
        report.push(format!(
            "{case}: {}",
            tries
                .iter()
                .map(|t| format!(
                    "{}{} {}",
                    t["runtime_name"],
                    if t["summary"]["probe"] == true {
                        " (probe)"
                    } else {
                        ""
                    },
                    t["summary"]["failure"]["code"]
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for t in tries.iter().filter(|t| t["runtime_name"] == dead) {
            on_dead += 1;
            let probe = t["summary"]["probe"] == true;
            probes += usize::from(probe);
            let started = t["summary"]["started_at_ms"].as_u64().unwrap();
            assert!(
                probe || started <= opened_at,
                "{case} tried {dead} after its circuit opened, not as a probe:\n{report:#?}"
            );
            // Nothing reached the dead agent, so its cleanup asked nothing of it.
            let n = t["summary"]["attempt"].as_u64().unwrap() as u32;
            let receipt = sb.recorded(batch, &case, n, "cleanup");
            assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
            assert_eq!(receipt["method"], "not_submitted", "{receipt:#}");
        }
        // Every case's result is its run on the healthy agent, which failed none.
        let result = sb.case_result(batch, &case);
        assert_eq!(result["runtime"], alive, "{case}: {result:#}\n{report:#?}");
        let failed_alive = tries
            .iter()
            .filter(|t| t["runtime_name"] == alive && !t["summary"]["failure"].is_null())
            .count();
        assert_eq!(failed_alive, 0, "{report:#?}");
    }
    assert!(
        on_dead >= 3,
        "the dispatches that opened the circuit: {report:#?}"
    );
    eprintln!("{batch}: {on_dead} attempts on {dead} ({probes} probes)\n{report:#?}");
    (on_dead, probes)
}

/// An agent frozen for longer than a worker gives it (its HTTP/2 keepalive and a 5 s grace
/// give up on the watch after about 40 s; a 90 s freeze does the same with the defaults): its
/// jobs end during the freeze, and each case settles from its first attempt's job once the
/// agent answers. The attempt asks again instead of starting another job.
#[test]
fn an_agent_frozen_past_the_grace_costs_no_job_and_each_first_attempt_settles() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &["--max-concurrent", "8"]);
    let text = manifest("frozen", &[&a], 8, GATED, "  max_retries: 1\n")
        .replace("kind: agent,", "kind: agent, unreachable_grace_s: 5,");
    let mut runner = sb.spawn_batch(&sb.write("frozen.yaml", &text), "run.log");
    wait_until(Duration::from_secs(90), "8 jobs run", || {
        lines(&sb, "started.log").len() == 8
    });
    freeze(a.child.id(), 50, || {
        sb.write("go", "");
        wait_until(
            Duration::from_secs(30),
            "the jobs end during the freeze",
            || lines(&sb, "ended.log").len() == 8,
        );
    });
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(240)),
        0,
        "{}",
        sb.read("run.log")
    );
    assert_eq!(lines(&sb, "started.log").len(), 8, "one job start per case");
    for i in 0..8 {
        let case = format!("c{i}");
        let r = sb.case_result("frozen", &case);
        assert_eq!(r["state"], "succeeded", "{case}: {r:#}");
        assert_eq!(
            r["attempts"], 1,
            "{case} settled by its first attempt: {r:#}"
        );
        // The waits on both sides of the freeze are in the attempt's record: the one that
        // gave up on the frozen agent, and the one after it answered again.
        let record = sb.recorded("frozen", &case, 1, "record");
        let waits: Vec<u64> = record["stages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["stage"] == "await")
            .map(|s| s["duration_ms"].as_u64().unwrap())
            .collect();
        assert!(
            waits.len() >= 2 && waits.iter().sum::<u64>() >= 30_000,
            "{case}: waits {waits:?} in {record:#}"
        );
    }
    let counters = &sb.status("frozen")["status"]["counters"];
    assert!(
        counters["reattached"].as_u64().unwrap() >= 1,
        "the frozen agent was asked again: {counters}"
    );
    assert_eq!(counters["stranded"], 0, "{counters}");
}

/// The same freeze with a list `[box-a, box-b]`: box-a's cases move to box-b once box-a has
/// not answered past the grace, their jobs on box-a (still running) are left stranded, and
/// stopped once box-a answers again. The summary counts the jobs paid for twice, which is
/// exactly the job starts beyond one per case, and no stranded job is left running.
#[test]
fn an_agent_frozen_in_a_list_strands_its_jobs_and_stops_them_once_it_answers() {
    let sb = Sandbox::engine();
    let a = Agent::start(&sb, "box-a", &[]);
    let b = Agent::start(&sb, "box-b", &[]);
    // Each agent's jobs wait for their own gate: box-a's never opens, so its stranded jobs
    // run until cleanup stops them.
    let harness = r#"echo "$CASEBATCH_CASE_ID $AGENT_NAME $CASEBATCH_ALLOC_MARKER" >> "$SANDBOX/started.log"; while [ ! -e "$SANDBOX/go-$AGENT_NAME" ]; do sleep 0.1; done; echo '{}' > "$CASEBATCH_RESULT""#;
    sb.write("go-box-b", "");
    let text = manifest("strand", &[&a, &b], 8, harness, "")
        .replace("kind: agent,", "kind: agent, unreachable_grace_s: 5,");
    let m = sb.write("strand.yaml", &text);
    let out = sb.out().display().to_string();
    let mut runner = sb.spawn(
        &[
            "batch",
            "run",
            "--manifest",
            m.to_str().unwrap(),
            "--output-dir",
            &out,
            "--no-speculation",
        ],
        "run.log",
    );
    wait_until(Duration::from_secs(90), "box-a's 4 jobs run", || {
        lines(&sb, "started.log")
            .iter()
            .filter(|l| l.contains(" box-a "))
            .count()
            == 4
    });
    freeze(a.child.id(), 50, || {});
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(300)),
        0,
        "{}",
        sb.read("run.log")
    );
    let started = lines(&sb, "started.log");
    let summary = sb.json(&sb.bundle("strand").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 8, "{summary:#}");
    assert_eq!(summary["stranded_attempts"], 4, "{summary:#}");
    assert_eq!(
        started.len(),
        8 + summary["jobs_paid_twice"].as_u64().unwrap() as usize,
        "job starts = cases + jobs paid for twice: {started:#?}\n{summary:#}"
    );
    for i in (0..8).step_by(2) {
        let case = format!("c{i}");
        assert_eq!(
            sb.case_result("strand", &case)["runtime"],
            "box-b",
            "{case}"
        );
        let first = sb.recorded("strand", &case, 1, "record");
        assert_eq!(first["summary"]["stranded"], true, "{first:#}");
        assert_eq!(first["runtime_name"], "box-a", "{first:#}");
        let receipt = sb.recorded("strand", &case, 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
        assert_eq!(receipt["held_job"], true, "{receipt:#}");
    }
    // No job of box-a is left running: each carried its attempt's marker.
    for line in started.iter().filter(|l| l.contains(" box-a ")) {
        let marker = line.rsplit(' ').next().unwrap();
        let alive = casebatch_attempt::local::procfs::scan_marker(marker).marked;
        assert!(
            alive.is_empty(),
            "a stranded job still runs: {line}
{}",
            describe_processes(&alive)
        );
    }
}

/// `casebatch agent --sandbox container` runs a job that asks for a container as one on its
/// host's engine. SIGKILLed while the containers run, the agent comes back on its data dir
/// and re-attaches to them from its job table: each harness ran once, its output and logs
/// reach the bundle, and cleanup leaves nothing on the engine. An agent without the flag
/// refuses such a job rather than run it on its host.
#[test]
fn an_agent_with_container_sandboxes_outlives_a_sigkill_and_re_attaches_to_its_containers() {
    use crate::containers::{IMAGE, containers_of, engine_or_skip, running_of};
    let sb = Sandbox::engine();
    let Some(host) = engine_or_skip("agent_batches::an_agent_with_container_sandboxes") else {
        return;
    };
    let mut a = Agent::start(&sb, "boxer", &["--sandbox", "container"]);
    let harness = r#"echo run >> "$CASEBATCH_OUTPUT_DIR/runs"; hostname; sleep 3; echo '{}' > "$CASEBATCH_RESULT""#;
    let sandbox = format!("  sandbox: {{provider: container, template: \"{IMAGE}\"}}\n");
    let m = sb.write(
        "boxed.yaml",
        &manifest("aboxed", &[&a], 2, harness, &sandbox),
    );
    let mut runner = sb.spawn_batch(&m, "run.log");
    wait_until(
        Duration::from_secs(90),
        "both jobs run in containers",
        || running_of(&host, "aboxed").len() == 2,
    );
    a.kill();
    assert_eq!(
        running_of(&host, "aboxed").len(),
        2,
        "the containers outlive their agent"
    );
    a.restart(&sb);
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        0,
        "{}",
        sb.read("run.log")
    );
    assert!(
        sb.read("agent-boxer.log").contains("2 jobs re-attached"),
        "{}",
        sb.read("agent-boxer.log")
    );
    for case in ["c0", "c1"] {
        let r = sb.case_result("aboxed", case);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["attempts"], 1, "{r:#}");
        let runs = sb.attempt_file("aboxed", case, 1, "output/runs");
        assert_eq!(
            std::fs::read_to_string(runs).unwrap(),
            "run\n",
            "{case} ran once"
        );
        let stdout =
            std::fs::read_to_string(sb.attempt_file("aboxed", case, 1, "stdout.log")).unwrap();
        let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert!(
            !stdout.trim().is_empty() && stdout.trim() != host_name.trim(),
            "ran in a container, not on the agent's host: {stdout}"
        );
        let receipt = sb.recorded("aboxed", case, 1, "cleanup");
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
        assert_eq!(receipt["method"], "container", "{receipt:#}");
    }
    assert!(containers_of(&host, "aboxed").is_empty());

    // Without the flag, the job is refused: a config failure naming the flag.
    let plain = Agent::start(&sb, "plain", &[]);
    let m = sb.write(
        "refused.yaml",
        &manifest("arefused", &[&plain], 1, harness, &sandbox),
    );
    let o = sb.run_batch(&m);
    assert_exit(&o, 4);
    let r = sb.case_result("arefused", "c0");
    assert_eq!(r["state"], "failed", "{r:#}");
    assert!(
        r["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("--sandbox container"),
        "{r:#}"
    );
    assert!(containers_of(&host, "arefused").is_empty());
}
