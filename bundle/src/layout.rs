//! Where each file of the bundle lives. Every path the engine writes comes from here.

use std::path::{Path, PathBuf};

use casebatch_manifest::model::{Plan, PlanHead};

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
    /// One row per task, beside the case rows, when tasks run several times.
    pub fn tasks_csv(&self) -> PathBuf {
        self.root.join("batch_tasks.csv")
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
        casebatch_attempt::layout::attempt_dir(&self.root, case_dir, attempt)
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

    /// The plan without its cases' specs (ids, directories, runtimes): what status and the
    /// run's views need, without parsing every case whole.
    pub fn read_plan_head(&self) -> Result<PlanHead, BundleError> {
        read_json(&self.plan())
    }
}
