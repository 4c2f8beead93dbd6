//! Per-stage wall-clock timings of an attempt. The stages of one attempt run in different
//! activities, possibly on different workers, so each activity appends its stages to the
//! attempt's journal (one write) and cleanup folds them into the attempt's record.

use std::future::Future;

use casebatch_bundle::now_ms;
use casebatch_bundle::{Entry, StageTiming};
use casebatch_proto::Stage;
use casebatch_runtime::AttemptEnv;

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

    /// Appends the stages to the attempt's journal in one write. Timings are evidence, not
    /// outcome: a failure to keep them is logged, never raised.
    pub fn append_to(&self, env: &AttemptEnv) {
        if self.0.is_empty() {
            return;
        }
        let entries: Vec<Entry> = self.0.iter().cloned().map(Entry::Stage).collect();
        if let Err(e) = env.record(&entries) {
            tracing::warn!(error = %e, "stage timings not kept");
        }
    }

    /// The attempt's timings so far (from its journal) followed by these: the order they ran
    /// in.
    pub fn with_recorded(self, recorded: Vec<StageTiming>) -> Vec<StageTiming> {
        let mut all = recorded;
        all.extend(self.0);
        all
    }
}
