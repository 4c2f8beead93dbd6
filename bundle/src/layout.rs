//! Where each file of the bundle lives. Every path the engine writes comes from here.

use std::path::{Path, PathBuf};

use casebatch_manifest::model::Plan;

use crate::{BundleError, read_json};

/// A batch's bundle directory, `<output-dir>/<batch_id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    root: PathBuf,
}

impl Bundle {
    pub fn new(output_dir: &Path, batch_id: &str) -> Self {
        Self {
            root: output_dir.join(batch_id),
        }
    }

    /// A bundle by its own directory (as carried in activity inputs).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn manifest(&self) -> PathBuf {
        self.root.join("manifest.json")
    }
    pub fn run_config(&self) -> PathBuf {
        self.root.join("run_config.json")
    }
    pub fn plan(&self) -> PathBuf {
        self.root.join("batch_plan.json")
    }
    pub fn results(&self) -> PathBuf {
        self.root.join("batch_results.json")
    }
    pub fn attempts(&self) -> PathBuf {
        self.root.join("batch_attempts.json")
    }
    pub fn summary(&self) -> PathBuf {
        self.root.join("batch_summary.json")
    }
    pub fn summary_csv(&self) -> PathBuf {
        self.root.join("batch_summary.csv")
    }
    pub fn lineage(&self) -> PathBuf {
        self.root.join("lineage.json")
    }
    pub fn events(&self) -> PathBuf {
        self.root.join("events.jsonl")
    }
    pub fn case(&self, case_dir: &str) -> PathBuf {
        self.root.join("cases").join(case_dir)
    }
    /// The case's current outcome (latest attempt).
    pub fn case_result(&self, case_dir: &str) -> PathBuf {
        self.case(case_dir).join("result.json")
    }
    pub fn attempt(&self, case_dir: &str, attempt: u32) -> PathBuf {
        self.case(case_dir)
            .join("attempts")
            .join(attempt.to_string())
    }

    /// Records of environments provisioned ahead and released unused ([`crate::ReleasedRecord`]).
    pub fn released(&self, case_dir: &str, attempt: u32, at_ms: u64) -> PathBuf {
        self.case(case_dir)
            .join("released")
            .join(format!("{attempt}-{at_ms}.json"))
    }

    pub fn exists(&self) -> bool {
        self.plan().exists()
    }

    pub fn read_plan(&self) -> Result<Plan, BundleError> {
        read_json(&self.plan())
    }
}

/// Files inside one attempt directory.
pub mod attempt_files {
    pub const SPEC: &str = "spec.json";
    /// Written by the harness (`CASEBATCH_RESULT`).
    pub const RESULT: &str = "result.json";
    pub const STDOUT: &str = "stdout.log";
    pub const STDERR: &str = "stderr.log";
    pub const EVALUATION: &str = "evaluation.json";
    pub const CLEANUP: &str = "cleanup.json";
    /// Present when the environment was provisioned ahead of need (`prepare_ahead`).
    pub const PREPARED: &str = "prepared.json";
    /// The trace pulled by the collect stage.
    pub const TRACE: &str = "trace.json";
    /// The engine's record of the attempt.
    pub const RECORD: &str = "attempt.json";
    /// Stage timings appended as the stages end, folded into the record at cleanup.
    pub const STAGES: &str = "stages.jsonl";
    /// The runtime's job identity (pid, start time, marker).
    pub const JOB: &str = "job.json";
    /// The container runtime's record of the attempt's container (name, image, creation),
    /// written before the container is created: a container of the attempt exists only if
    /// this file does.
    pub const CONTAINER: &str = "container.json";
    /// The harness's exit status, written by the wrapper that outlives a worker crash.
    pub const EXIT: &str = "exit_status";
    /// `<pid> <start ticks>` of the wrapper, written as its first act, before the harness runs:
    /// a start that left no such file (and no exit status, and no marked process) never ran
    /// the harness.
    pub const WRAPPER_PID: &str = "wrapper.pid";
    /// Held (flock) by whoever decides whether to start the attempt's process.
    pub const JOB_LOCK: &str = "job.lock";
    /// The harness's working directory (fresh per attempt).
    pub const WORKDIR: &str = "work";
    pub const OUTPUT: &str = "output";
    pub const INPUT: &str = "input.json";
    pub const EVAL_STDOUT: &str = "evaluator.stdout.log";
    pub const EVAL_STDERR: &str = "evaluator.stderr.log";
    pub const EVAL_RESULT: &str = "evaluator_result.json";
}
