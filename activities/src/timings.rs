//! Per-stage wall-clock timings of an attempt. The stages of one attempt run in different
//! activities, possibly on different workers, so each activity appends its stages to the
//! attempt's `stages.jsonl` (one write) and cleanup folds them into `attempt.json`.

use std::future::Future;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use casebatch_bundle::{StageTiming, layout::attempt_files};
use casebatch_proto::Stage;
use casebatch_runtime::AttemptEnv;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The stages one activity ran.
#[derive(Debug, Default)]
pub(crate) struct StageTimings(Vec<StageTiming>);

impl StageTimings {
    /// Runs `work` as `stage`, keeping when it began and ended.
    pub async fn time<T>(&mut self, stage: Stage, work: impl Future<Output = T>) -> T {
        let started_at_ms = now_ms();
        let out = work.await;
        let ended_at_ms = now_ms().max(started_at_ms);
        self.0.push(StageTiming {
            stage,
            started_at_ms,
            ended_at_ms,
            duration_ms: ended_at_ms - started_at_ms,
        });
        out
    }

    /// Appends the stages to the attempt's file in one write. Timings are evidence, not
    /// outcome: a failure to keep them is logged, never raised.
    pub fn append_to(&self, env: &AttemptEnv) {
        if self.0.is_empty() {
            return;
        }
        let mut lines = Vec::new();
        for t in &self.0 {
            serde_json::to_writer(&mut lines, t).expect("timings always serialize");
            lines.push(b'\n');
        }
        let path = env.file(attempt_files::STAGES);
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(&lines));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "stage timings not kept");
        }
    }

    /// The attempt's timings so far (from its file) followed by these: the order they ran in.
    /// A torn last line (a worker killed mid-write) is skipped.
    pub fn with_recorded(self, env: &AttemptEnv) -> Vec<StageTiming> {
        let recorded = std::fs::read_to_string(env.file(attempt_files::STAGES)).unwrap_or_default();
        let mut all: Vec<StageTiming> = recorded
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        all.extend(self.0);
        all
    }
}
