//! Stalls, not crashes: the Temporal server frozen (SIGSTOP) while jobs run, then resumed.
//! A stall is ordinary on a cluster (a database failover, a frontend restart, a long GC
//! pause), and the engine's silence must never cost a job: each case settles from the job its
//! first attempt started, whether the job ran through the stall or ended during it. Job
//! starts are counted by the harness itself.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use crate::support::*;

/// Records its start, works for `secs` (the workload, as in the drill: `sleep 20`), records
/// its end.
fn sleeper(secs: u64) -> String {
    format!(
        r#"echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/started.log"; sleep {secs}; echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ended.log"; echo '{{}}' > "$CASEBATCH_RESULT""#
    )
}

fn manifest(sb: &Sandbox, batch: &str, cases: usize, harness: &str) -> std::path::PathBuf {
    let mut m = format!(
        "batch_id: {batch}\ndefaults:\n  concurrency: {cases}\n  max_retries: 2\n  runtime: local-process\n  pass_env: [SANDBOX]\n  harness: '{}'\ntasks:\n",
        harness.replace('\'', "''")
    );
    for i in 0..cases {
        m.push_str(&format!("  - {{task_id: c{i}}}\n"));
    }
    sb.write(&format!("{batch}.yaml"), &m)
}

/// Every case ran once and was settled by its first attempt, from the job that attempt
/// started: one job start per case, one attempt per case, none adopted from a crash.
fn assert_each_case_settled_by_its_first_job(sb: &Sandbox, batch: &str, cases: usize) {
    let started = sb.read("started.log");
    assert_eq!(
        started.lines().count(),
        cases,
        "one job start per case:\n{started}"
    );
    for i in 0..cases {
        let case = format!("c{i}");
        let r = sb.case_result(batch, &case);
        assert_eq!(r["state"], "succeeded", "{case}: {r:#}");
        assert_eq!(
            r["attempts"], 1,
            "{case} was settled by its first attempt: {r:#}"
        );
        assert_eq!(r["job_starts"], 1, "{case}: {r:#}");
        let record = sb.recorded(batch, &case, 1, "record");
        assert!(
            record["summary"]["failure"].is_null(),
            "{case}'s first attempt failed: {record:#}"
        );
    }
    assert!(
        sb.recorded(batch, "c0", 2, "record").is_null(),
        "no second attempt"
    );
}

/// The embedded engine's pid and address.
fn embedded_engine(out: &Path) -> (u32, String) {
    let record = engine_record(out).expect("the embedded engine's record");
    let pid = record["pid"].as_u64().expect("engine pid") as u32;
    let address = record["address"].as_str().expect("engine address");
    (pid, address.trim_start_matches("http://").to_string())
}

/// Waits until `n` `settle` activities of the batch are running: the waits a stall must not
/// cost (a job whose settle has not started yet has nothing to lose).
fn wait_for_settles(address: &str, batch: &str, n: usize) {
    wait_until(Duration::from_secs(60), "the settles run", || {
        activities_running(address, batch, "settle") == n
    });
}

/// The embedded default: the runner hosts the worker, and its dev server freezes for 10 s
/// while eight 20-second jobs run; they go on running through it and end after it. (A stall
/// is felt once no heartbeat has been answered for the heartbeat timeout plus the SDK's
/// local buffer, 5 s + 5 s: the SDK then cancels each wait without saying why.)
#[test]
fn a_ten_second_engine_stall_costs_no_job() {
    let sb = Sandbox::engine();
    let m = manifest(&sb, "stall", 8, &sleeper(20));
    let mut runner = sb.spawn_batch(&m, "run.log");
    wait_until(Duration::from_secs(90), "8 jobs run", || {
        sb.lines("started.log") == 8
    });
    let (pid, address) = embedded_engine(&sb.out());
    wait_for_settles(&address, "stall", 8);
    freeze(pid, 10, || {});
    let code = wait_child(&mut runner, Duration::from_secs(180));
    assert_eq!(code, 0, "{}", sb.read("run.log"));
    assert_each_case_settled_by_its_first_job(&sb, "stall", 8);
    assert_eq!(sb.lines("ended.log"), 8);
}

/// A worker replica against a separately started server that freezes for 90 s; the 30-second
/// jobs end during the stall, and each case settles from its job's files once the server
/// answers.
#[test]
fn a_ninety_second_stall_of_a_cluster_costs_no_job_on_a_worker_replica() {
    let sb = Sandbox::engine();
    let cluster = Cluster::start(&sb);
    let out = sb.out().display().to_string();
    let mut worker = sb.spawn(
        &[
            "worker",
            "--output-dir",
            &out,
            "--address",
            &cluster.address,
        ],
        "worker.log",
    );
    wait_until(Duration::from_secs(60), "the replica polls", || {
        sb.read("worker.log").contains("worker polling")
    });
    let m = manifest(&sb, "stall90", 8, &sleeper(30));
    let mut runner: Child = sb.spawn_batch_on_cluster(&m, &cluster, "run.log");
    wait_until(Duration::from_secs(90), "8 jobs run", || {
        sb.lines("started.log") == 8
    });
    wait_for_settles(&cluster.address, "stall90", 8);
    freeze(cluster.pid(), 90, || {
        wait_until(
            Duration::from_secs(60),
            "the jobs end during the stall",
            || sb.lines("ended.log") == 8,
        );
    });
    let code = wait_child(&mut runner, Duration::from_secs(240));
    assert_eq!(
        code,
        0,
        "{}\n--- worker\n{}",
        sb.read("run.log"),
        tail(&sb.path("worker.log"), 40)
    );
    assert_each_case_settled_by_its_first_job(&sb, "stall90", 8);
    assert_eq!(stop(&mut worker), 0, "the worker stops on SIGTERM");
}
