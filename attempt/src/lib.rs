//! One attempt of a case, wherever it runs: its identity ([`AttemptKey`]), its job
//! ([`JobSpec`]), its directory and the typed journal of everything the engine records there,
//! the [`Executor`] seam that every runtime implements once, and the local-process machinery
//! ([`local`]) that runs a job on a worker's host and on an agent alike.
//!
//! Must not know manifests, bundles or Temporal: the worker builds an [`Attempt`] from a
//! planned case at one edge (`casebatch-runtime`), an agent from the job it was sent, and
//! both hand it to an executor. Only `casebatch-proto` is below it.

pub mod case_env;
pub mod evaluation;
pub mod executor;
pub mod files;
pub mod harness;
pub mod journal;
pub mod layout;
pub mod local;
pub mod logs;
pub mod records;
pub mod result_contract;
pub mod scratch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use casebatch_proto::runtime_v1::JobSpec;
pub use casebatch_proto::{AttemptKey, Failure, JobRef};
pub use executor::{Executor, Liveness, NotStarted, OnCancel};
pub use journal::{AttemptJournal, Entry, JournalError};
pub use layout::attempt_files;
pub use records::*;

/// One attempt as an executor runs it (on a worker's host, an agent's, or a scheduler's):
/// its key, its job, and its directory. Nothing of the manifest.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub key: AttemptKey,
    pub job: JobSpec,
    /// `cases/<case_dir>/attempts/<n>/` under `key.bundle_dir` (a bundle, or an agent's own
    /// directory).
    pub dir: PathBuf,
}

impl Attempt {
    /// The attempt of `job` under `key.bundle_dir`.
    pub fn new(key: AttemptKey, job: JobSpec) -> Self {
        let dir = layout::attempt_dir(Path::new(&key.bundle_dir), &job.case_dir, key.attempt);
        Self { key, job, dir }
    }

    /// `batch/case/attempt`: what names the attempt's job to every runtime.
    pub fn marker(&self) -> String {
        self.key.marker()
    }

    /// The value of [`local::procfs::MARKER_ENV`] in the attempt's processes, which cleanup's
    /// scans look for: the marker with a hash of the attempt's directory, as its cgroup is
    /// named. The marker alone (`batch/case/attempt`) is the same in two bundles of one batch
    /// id on a host (a copied manifest, a second checkout), and one's cleanup killed the
    /// other's processes.
    pub fn process_marker(&self) -> String {
        host_name(&self.marker(), &self.dir)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The attempt's working directory and input file on this host, outside the bundle.
    pub fn scratch(&self) -> scratch::Scratch {
        scratch::Scratch::for_attempt(&self.marker(), &self.dir)
    }

    /// Reads the attempt's journal (its engine records), as this process keeps it.
    pub fn journal(&self) -> Result<Arc<AttemptJournal>, JournalError> {
        AttemptJournal::read(&self.dir)
    }

    /// Appends to the attempt's journal.
    pub fn record(&self, entries: &[Entry]) -> Result<(), JournalError> {
        journal::append(&self.dir, entries)
    }

    /// The trace the harness named in its result, if any (the collect stage pulls it).
    pub async fn harness_trace(&self) -> Option<TraceRef> {
        harness::read_result::<harness::TraceOnly>(&self.file(attempt_files::RESULT))
            .await
            .ok()
            .flatten()
            .and_then(|r| r.trace)
    }

    /// What the engine reads of the harness's result (outputs, scores, trace): empty when
    /// there is none or it is unusable (its classification said so when the actor ended).
    pub async fn harness_result(&self) -> harness::HarnessResult {
        harness::read_result::<harness::HarnessResult>(&self.file(attempt_files::RESULT))
            .await
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Appends an event about the attempt to its batch's timeline (`events.jsonl` beside the
    /// attempt's `cases/`). Evidence, not outcome: a failed write is logged, never raised.
    pub fn event(&self, kind: &str, message: String) {
        let event = Event {
            ts_ms: now_ms(),
            kind: kind.into(),
            case_id: Some(self.job.case_id.clone()),
            attempt: Some(self.key.attempt),
            message,
        };
        let path = layout::events_file(Path::new(&self.key.bundle_dir));
        if let Err(e) = journal::append_jsonl(&path, &event) {
            tracing::warn!(error = %e, kind, "event not kept");
        }
    }

    /// Memory limit for this attempt: the job's declared one, or the boosted one.
    pub fn memory_mb(&self) -> Option<u64> {
        self.key.memory_boost_mb.or(self.job.memory_mb())
    }

    /// The job's harness: `config/NO_HARNESS` when the case has none (every runtime that
    /// starts one refuses alike).
    pub fn harness(&self) -> Result<&casebatch_proto::runtime_v1::Command, Failure> {
        self.job
            .harness
            .as_ref()
            .filter(|c| !c.argv.is_empty())
            .ok_or_else(|| {
                Failure::config(
                    casebatch_proto::Stage::Submit,
                    casebatch_proto::FailureCode::NoHarness,
                    format!(
                        "case {} has no harness command: set defaults.harness",
                        self.job.case_id
                    ),
                )
            })
    }

    /// Whether the job has an evaluator to run after its actor.
    pub fn has_evaluator(&self) -> bool {
        self.job
            .evaluator
            .as_ref()
            .is_some_and(|c| !c.argv.is_empty())
    }

    /// The harness contract's environment variables (docs/harness.md).
    pub fn contract_env(&self) -> BTreeMap<String, String> {
        let path = |name: &str| self.file(name).display().to_string();
        let mut env = BTreeMap::new();
        env.insert("CASEBATCH_BATCH_ID".into(), self.key.batch_id.clone());
        env.insert("CASEBATCH_CASE_ID".into(), self.job.case_id.clone());
        env.insert("CASEBATCH_ATTEMPT".into(), self.key.attempt.to_string());
        env.insert(
            "CASEBATCH_INPUT".into(),
            self.scratch().input.display().to_string(),
        );
        env.insert("CASEBATCH_OUTPUT_DIR".into(), path(attempt_files::OUTPUT));
        env.insert("CASEBATCH_RESULT".into(), path(attempt_files::RESULT));
        env.insert(local::procfs::MARKER_ENV.into(), self.process_marker());
        env
    }
}

/// An attempt's name on its host (its cgroup, scratch entries and process marker): the
/// marker made filesystem-safe, plus a hash of its directory, so two bundles that reuse a
/// batch id on one host never share one.
pub fn host_name(marker: &str, attempt_dir: &Path) -> String {
    let safe: String = marker
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '_',
        })
        .take(180)
        .collect();
    format!(
        "{safe}-{:016x}",
        fnv1a(attempt_dir.as_os_str().as_encoded_bytes())
    )
}

/// A stable hash (the std hasher is not stable across releases; names must be).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Milliseconds since the Unix epoch, for records (never for a deadline or a duration).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This host's name, as used in its activity task queue (read once: every job names it).
pub fn hostname() -> String {
    static NAME: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into())
    });
    NAME.clone()
}
