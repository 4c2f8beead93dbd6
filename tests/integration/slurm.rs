//! `kind: slurm` end to end, against real Slurm: a one-node cluster of each test's own
//! (`scripts/slurm-cluster.sh`: munge, `slurmctld` and `slurmd` from Debian's packages, in the
//! test's directory), so a test may kill its controller or its node. Every job a controller
//! accepted is in its log (`_slurm_rpc_submit_batch_job: JobId=`), which is how "ran as
//! exactly one Slurm job" is counted; harnesses append a line per run, so "ran twice" cannot
//! hide either.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// A Slurm cluster of the test's own, stopped when it goes.
struct Slurm {
    dir: PathBuf,
    conf: String,
}

impl Slurm {
    /// Starts one under the sandbox, or `None` (the test is skipped with a notice) when
    /// Slurm is not installed, unless `CASEBATCH_REQUIRE_SLURM` is set (CI sets it: there a
    /// missing Slurm fails the test rather than passing it unseen).
    fn start(sb: &Sandbox, test: &str) -> Option<Self> {
        let installed = ["slurmctld", "slurmd", "sbatch", "munged"]
            .iter()
            .all(|t| which(t));
        if !installed {
            assert!(
                std::env::var_os("CASEBATCH_REQUIRE_SLURM").is_none(),
                "{test}: Slurm is not installed and CASEBATCH_REQUIRE_SLURM is set"
            );
            eprintln!(
                "SKIPPED {test}: no Slurm (Debian: apt-get install slurmctld slurmd \
                 slurm-client munge)"
            );
            return None;
        }
        let dir = sb.path("slurm");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/slurm-cluster.sh");
        let o = Command::new("bash")
            .arg(script)
            .env("CASEBATCH_SLURM_DIR", &dir)
            .output()
            .expect("bash");
        assert!(
            o.status.success(),
            "the test's Slurm cluster did not start: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let conf = String::from_utf8_lossy(&o.stdout).trim().to_string();
        Some(Self { dir, conf })
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("SLURM_CONF", self.conf.as_str())]
    }

    /// A Slurm command against this cluster.
    fn cmd(&self, program: &str, args: &[&str]) -> String {
        let o = Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            o.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Jobs the controller accepted, from its log (every life of it writes there).
    fn accepted(&self) -> usize {
        std::fs::read_to_string(self.dir.join("slurmctld.log"))
            .unwrap_or_default()
            .matches("_slurm_rpc_submit_batch_job: JobId=")
            .count()
    }

    /// casebatch's jobs Slurm shows in `states` (`squeue --states`), by name.
    fn jobs(&self, states: &str) -> Vec<String> {
        self.cmd("squeue", &["--noheader", "--states", states, "--format=%j"])
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("casebatch-"))
            .map(str::to_string)
            .collect()
    }

    /// The job ids Slurm shows as running.
    fn running(&self) -> usize {
        self.jobs("RUNNING").len()
    }

    fn pid_of(&self, daemon: &str) -> u32 {
        std::fs::read_to_string(self.dir.join(format!("{daemon}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn kill(&self, daemon: &str) {
        let pid = self.pid_of(daemon);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        wait_until(Duration::from_secs(10), &format!("{daemon} gone"), || {
            !alive(pid)
        });
    }

    /// Waits until the controller has written its job state after `event` (a file written
    /// by the event) last changed: what Slurm knew then is on disk. Two modification times
    /// on one file system order two events; no duration is measured.
    fn wait_for_state_saved_after(&self, event: &std::path::Path) {
        let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let since = modified(event).expect("the event's file");
        let state = self.dir.join("state/job_state");
        wait_until(Duration::from_secs(30), "slurmctld saves its state", || {
            modified(&state).is_some_and(|saved| saved > since)
        });
    }

    /// Starts the controller again on the same state directory, as after a crash.
    fn restart_controller(&self) {
        let o = Command::new("slurmctld")
            .env("SLURM_CONF", &self.conf)
            .output()
            .expect("slurmctld");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        wait_until(Duration::from_secs(30), "slurmctld answers", || {
            Command::new("scontrol")
                .arg("ping")
                .env("SLURM_CONF", &self.conf)
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("is UP"))
        });
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/slurm-cluster.sh");
        let _ = Command::new("bash")
            .args([script, "stop"])
            .env("CASEBATCH_SLURM_DIR", &self.dir)
            .output();
    }
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}

/// A manifest of `n` cases on `runtime` (a table with `hpc`, kind slurm, on the test
/// cluster's `debug` partition), each running `harness`, after the lines in `extra`.
fn manifest(batch: &str, n: usize, concurrency: u32, harness: &str, extra: &str) -> String {
    let tasks: String = (0..n).map(|i| format!("  - task_id: c{i}\n")).collect();
    format!(
        "batch_id: {batch}\n\
         runtimes: {{hpc: {{kind: slurm, partition: debug}}}}\n\
         defaults:\n  \
           runtime: hpc\n  \
           concurrency: {concurrency}\n  \
           max_retries: 0\n  \
           timeout_seconds: 120\n  \
           pass_env: [SANDBOX]\n  \
           harness: '{harness}'\n\
         {extra}\
         tasks:\n{tasks}"
    )
}

/// A harness that records each run (one line per start) and writes a result.
const RECORDED: &str =
    r#"echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/runs"; SLEEP; echo "{}" > "$CASEBATCH_RESULT""#;

fn recorded(sleep: &str) -> String {
    RECORDED.replace("SLEEP", sleep)
}

/// How many runs of each case were recorded.
fn runs_per_case(sb: &Sandbox) -> std::collections::BTreeMap<String, usize> {
    let mut runs = std::collections::BTreeMap::new();
    for line in sb.read("runs").lines() {
        *runs.entry(line.to_string()).or_insert(0) += 1;
    }
    runs
}

fn receipt(sb: &Sandbox, batch: &str, case: &str, attempt: u32) -> Value {
    sb.recorded(batch, case, attempt, "cleanup")
}

#[test]
fn sixteen_cases_each_run_as_exactly_one_slurm_job_with_confirmed_receipts() {
    let sb = Sandbox::slurm();
    let Some(slurm) = Slurm::start(&sb, "slurm::sixteen_cases") else {
        return;
    };
    let m = sb.write(
        "sixteen.yaml",
        &manifest(
            "sixteen",
            16,
            8,
            &recorded("sleep 1"),
            "  evaluator: 'echo \"{\\\"verdict\\\": \\\"pass\\\"}\" > \"$CASEBATCH_RESULT\"'\n",
        ),
    );
    let mut runner = sb.spawn_batch_with_env(&m, "runner.log", &slurm.env());
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(200)),
        0,
        "{}",
        tail(&sb.path("runner.log"), 40)
    );
    assert_eq!(slurm.accepted(), 16, "one Slurm job per case");
    let runs = runs_per_case(&sb);
    assert_eq!(runs.len(), 16, "{runs:?}");
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
    for i in 0..16 {
        let case = format!("c{i}");
        let r = sb.case_result("sixteen", &case);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["verdict"], "pass", "the evaluator ran in the job: {r:#}");
        assert_eq!(r["job_starts"], 1);
        let receipt = receipt(&sb, "sixteen", &case, 1);
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
        assert_eq!(receipt["method"], "slurm");
        let job = &receipt["scheduler_job"];
        assert_eq!(job["state"], "COMPLETED", "{receipt:#}");
        assert!(job["job_id"].as_str().is_some_and(|id| !id.is_empty()));
        assert!(job["node"].is_string(), "{receipt:#}");
        // The job was the journal's: its name and id recorded, ended.
        let entry = sb.recorded("sixteen", &case, 1, "job");
        assert_eq!(entry["scheduler"], "slurm", "{entry:#}");
        assert_eq!(entry["state"], "ended", "{entry:#}");
        assert_eq!(entry["job_id"], job["job_id"]);
    }
    assert!(slurm.jobs("PENDING,RUNNING").is_empty());
}

#[test]
fn a_runner_killed_while_eight_jobs_run_resumes_without_one_more_sbatch() {
    let sb = Sandbox::slurm();
    let Some(slurm) = Slurm::start(&sb, "slurm::a_runner_killed") else {
        return;
    };
    let m = sb.write(
        "kill.yaml",
        &manifest("kill", 8, 8, &recorded("sleep 20"), ""),
    );
    let mut runner = sb.spawn_batch_with_env(&m, "runner.log", &slurm.env());
    wait_until(Duration::from_secs(90), "8 Slurm jobs running", || {
        slurm.running() == 8
    });
    let _ = runner.kill();
    let _ = runner.wait();
    kill_engine(&sb.out());
    // Some jobs finish while nothing watches; the resumed run harvests them.
    let out = sb.out().display().to_string();
    let o = sb.run_env(
        &[
            "batch",
            "resume",
            "--batch-id",
            "kill",
            "--output-dir",
            &out,
        ],
        &slurm.env(),
    );
    assert_exit(&o, 0);
    assert_eq!(slurm.accepted(), 8, "no job was submitted twice");
    let runs = runs_per_case(&sb);
    assert!(
        runs.len() == 8 && runs.values().all(|n| *n == 1),
        "{runs:?}"
    );
    for i in 0..8 {
        let r = sb.case_result("kill", &format!("c{i}"));
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["attempts"], 1, "{r:#}");
    }
}

#[test]
fn a_controller_killed_and_restarted_mid_batch_loses_nothing_and_runs_nothing_twice() {
    let sb = Sandbox::slurm();
    let Some(slurm) = Slurm::start(&sb, "slurm::a_controller_killed") else {
        return;
    };
    let m = sb.write(
        "ctld.yaml",
        &manifest("ctld", 6, 6, &recorded("sleep 10"), ""),
    );
    let mut runner = sb.spawn_batch_with_env(&m, "runner.log", &slurm.env());
    wait_until(Duration::from_secs(90), "6 harnesses started", || {
        runs_per_case(&sb).len() == 6
    });
    // Slurm writes its state up to seconds after a change; a controller killed before that
    // forgets the jobs it started (casebatch then re-dispatches them as `JOB_LOST`, and
    // Slurm may run them again). This drill is a crash once the running jobs are saved.
    slurm.wait_for_state_saved_after(&sb.path("runs"));
    slurm.kill("slurmctld");
    // The waits ride out a controller that does not answer.
    wait_until(
        Duration::from_secs(30),
        "the worker sees Slurm down",
        || sb.read("runner.log").contains("Slurm did not answer"),
    );
    slurm.restart_controller();
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(200)),
        0,
        "{}",
        tail(&sb.path("runner.log"), 40)
    );
    assert_eq!(slurm.accepted(), 6, "no job was submitted twice");
    let runs = runs_per_case(&sb);
    assert!(
        runs.len() == 6 && runs.values().all(|n| *n == 1),
        "{runs:?}"
    );
}

#[test]
fn a_node_lost_under_its_jobs_fails_them_as_node_failed_and_the_list_runs_them_locally() {
    let sb = Sandbox::slurm();
    let Some(slurm) = Slurm::start(&sb, "slurm::a_node_lost") else {
        return;
    };
    // Long on Slurm (its node is lost under it), short where the case moves next. A sleep
    // of its own length: other tests running beside this one sleep 600.
    let harness = r#"echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/runs"; if [ -n "$SLURM_JOB_ID" ]; then sleep 613; fi; echo "{}" > "$CASEBATCH_RESULT""#;
    let m = sb.write(
        "node.yaml",
        &manifest("node", 4, 4, harness, "")
            .replace("  runtime: hpc\n", "  runtime: [hpc, local-process]\n")
            .replace("  max_retries: 0\n", "  max_retries: 1\n"),
    );
    // Without tail speculation, which would duplicate a long Slurm case on this host.
    let out = sb.out();
    let mut args = batch_run_args(&m, &out).to_vec();
    args.push("--no-speculation");
    let mut runner = sb.spawn_env(&args, "runner.log", &slurm.env());
    // The list deals the cases over both runtimes.
    let plan_file = sb.bundle("node").join("batch_plan.json");
    wait_until(Duration::from_secs(30), "the plan written", || {
        plan_file.exists()
    });
    let plan = sb.json(&plan_file);
    let on_slurm: Vec<String> = plan["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["runtime_name"] == "hpc")
        .map(|c| c["case_dir"].as_str().unwrap().to_string())
        .collect();
    assert!(!on_slurm.is_empty(), "{plan:#}");
    wait_until(Duration::from_secs(90), "Slurm's share running", || {
        slurm.running() == on_slurm.len()
    });
    slurm.kill("slurmd");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(200)),
        0,
        "{}",
        tail(&sb.path("runner.log"), 40)
    );
    for i in 0..4 {
        let case = format!("c{i}");
        let r = sb.case_result("node", &case);
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["runtime"], "local-process", "{r:#}");
        if !on_slurm.contains(&case) {
            assert_eq!(r["attempts"], 1, "{r:#}");
            continue;
        }
        let first = sb.recorded("node", &case, 1, "record");
        let failure = &first["summary"]["failure"];
        assert_eq!(failure["code"], "NODE_FAILED", "{first:#}");
        assert_eq!(failure["class"], "infra");
        assert_eq!(first["runtime_name"], "hpc");
        // The job's processes, orphaned by the lost slurmd, were found on this host and
        // stopped by the attempt's cleanup.
        let receipt = receipt(&sb, "node", &case, 1);
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
        assert_eq!(
            receipt["scheduler_job"]["state"], "NODE_FAIL",
            "{receipt:#}"
        );
    }
    assert!(
        processes_matching("sleep 613").is_empty(),
        "no process of a lost node's job is left"
    );
}

#[test]
fn a_harness_past_its_memory_is_oom_killed_by_slurm_and_auto_boost_raises_the_mem() {
    let sb = Sandbox::slurm();
    let Some(slurm) = Slurm::start(&sb, "slurm::oom") else {
        return;
    };
    let hog = r#"python3 -c "b = bytearray(400 * 1024 * 1024)"; echo "{}" > "$CASEBATCH_RESULT""#;
    let m = sb.write(
        "oom.yaml",
        &manifest("oom", 1, 1, hog, "  resources: {memory_mb: 64}\n"),
    );
    assert_exit(&sb.run_env(&batch_run_args(&m, &sb.out()), &slurm.env()), 4);
    let r = sb.case_result("oom", "c0");
    assert_eq!(r["failure"]["code"], "OOM_KILLED", "{r:#}");
    assert_eq!(r["failure"]["class"], "infra");
    assert_eq!(
        receipt(&sb, "oom", "c0", 1)["scheduler_job"]["state"],
        "OUT_OF_MEMORY"
    );

    let boosted = sb.write(
        "boost.yaml",
        &manifest(
            "boost",
            1,
            1,
            hog,
            "  resources: {memory_mb: 64}\n  oom_auto_boost: true\n",
        ),
    );
    assert_exit(
        &sb.run_env(&batch_run_args(&boosted, &sb.out()), &slurm.env()),
        0,
    );
    let r = sb.case_result("boost", "c0");
    assert_eq!(r["state"], "succeeded", "{r:#}");
    assert_eq!(r["memory_boost_mb"], 512, "64 → 128 → 256 → 512: {r:#}");
    assert_eq!(slurm.accepted(), 1 + 4, "one job per attempt");
}

#[test]
fn a_cancelled_batch_leaves_no_job_in_squeue_within_15_s() {
    let sb = Sandbox::slurm();
    let Some(slurm) = Slurm::start(&sb, "slurm::cancel") else {
        return;
    };
    let m = sb.write(
        "cancel.yaml",
        &manifest("cancel", 4, 4, &recorded("sleep 300"), ""),
    );
    let mut runner = sb.spawn_batch_with_env(&m, "runner.log", &slurm.env());
    wait_until(Duration::from_secs(90), "4 Slurm jobs running", || {
        slurm.running() == 4
    });
    let cancelled = Instant::now();
    assert_exit(&sb.op("cancel", "cancel"), 0);
    wait_until(Duration::from_secs(15), "no job left in squeue", || {
        slurm.jobs("PENDING,RUNNING,COMPLETING").is_empty()
    });
    eprintln!(
        "no job in squeue {:?} after the cancel",
        cancelled.elapsed()
    );
    let _ = wait_child(&mut runner, Duration::from_secs(120));
    for i in 0..4 {
        let receipt = receipt(&sb, "cancel", &format!("c{i}"), 1);
        assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
        assert_eq!(
            receipt["scheduler_job"]["state"], "CANCELLED",
            "{receipt:#}"
        );
    }
}

#[test]
fn a_job_held_pending_past_its_timeout_is_queued_not_timed_out_and_runs_once_released() {
    let sb = Sandbox::slurm();
    let Some(slurm) = Slurm::start(&sb, "slurm::pending") else {
        return;
    };
    slurm.cmd("scontrol", &["update", "PartitionName=debug", "State=DOWN"]);
    let m = sb.write(
        "held.yaml",
        &manifest("held", 2, 2, &recorded("sleep 1"), "")
            .replace("timeout_seconds: 120", "timeout_seconds: 10"),
    );
    let mut runner = sb.spawn_batch_with_env(&m, "runner.log", &slurm.env());
    wait_until(Duration::from_secs(60), "2 jobs pending in Slurm", || {
        slurm.jobs("PENDING").len() == 2
    });
    // Held longer than the case's timeout: not a timeout, and shown as queued.
    let held = Instant::now();
    let mut seen = Value::Null;
    wait_until(Duration::from_secs(60), "status shows both queued", || {
        seen = sb.status("held");
        seen["queued"].as_array().is_some_and(|q| q.len() == 2)
    });
    let queued = &seen["queued"][0];
    assert_eq!(queued["scheduler"], "slurm", "{seen:#}");
    assert_eq!(queued["reason"], "PartitionDown", "{seen:#}");
    let out = sb.out().display().to_string();
    let text = stdout(&sb.run(&[
        "batch",
        "status",
        "--batch-id",
        "held",
        "--output-dir",
        &out,
    ]));
    assert!(
        text.contains("queued by the scheduler, not running yet (2)"),
        "{text}"
    );
    assert!(text.contains("PartitionDown"), "{text}");
    // Twice the case's timeout: the point is time passing while the job waits in Slurm.
    while held.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(sb.read("runs").is_empty(), "nothing ran while held");
    slurm.cmd("scontrol", &["update", "PartitionName=debug", "State=UP"]);
    assert_exit_code(&mut runner, 0, &sb);
    for i in 0..2 {
        let r = sb.case_result("held", &format!("c{i}"));
        assert_eq!(r["state"], "succeeded", "{r:#}");
        assert_eq!(r["attempts"], 1, "{r:#}");
    }
    assert_eq!(slurm.accepted(), 2);
}

fn assert_exit_code(runner: &mut std::process::Child, code: i32, sb: &Sandbox) {
    assert_eq!(
        wait_child(runner, Duration::from_secs(200)),
        code,
        "{}",
        tail(&sb.path("runner.log"), 40)
    );
}
