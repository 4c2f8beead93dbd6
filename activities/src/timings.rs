//! Per-stage timings of an attempt. The stages of one attempt run in different activities,
//! possibly on different workers, so each activity appends its stages to the attempt's
//! journal (one write) and cleanup folds them into the attempt's record.
//!
//! One clock per record: a stage's duration is measured on this process's monotonic clock
//! (a wall-clock step cannot stretch or shrink it), and its start is read on the engine's
//! clock ([`EngineClock`]), the one the workflow's times are on, so a record's stages and its
//! attempt's start and end line up; its end is its start plus its duration.

use std::future::Future;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use casebatch_bundle::{Entry, StageTiming};
use casebatch_proto::Stage;
use casebatch_runtime::AttemptEnv;

/// The engine's clock as an activity can read it: when the server started the activity (its
/// clock, which workflow time is on) plus this process's monotonic time since. A step of the
/// worker's own wall clock moves neither.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineClock {
    started_ms: u64,
    began: Instant,
}

impl EngineClock {
    /// The clock of an activity the server started at `started` (this worker's wall clock
    /// when the server did not say).
    pub(crate) fn new(started: Option<SystemTime>) -> Self {
        let started = started.unwrap_or_else(SystemTime::now);
        Self {
            started_ms: started
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            began: Instant::now(),
        }
    }

    /// Milliseconds since the epoch on the engine's clock, now.
    pub(crate) fn now_ms(&self) -> u64 {
        self.started_ms + self.began.elapsed().as_millis() as u64
    }
}

/// The stages one activity ran.
#[derive(Debug)]
pub(crate) struct StageTimings {
    clock: EngineClock,
    /// Set on every stage: the activity is a retry (its previous try was lost with a worker,
    /// or with the engine's patience), so its stage follows a stretch no stage covers.
    resumed: Option<u32>,
    stages: Vec<StageTiming>,
}

impl StageTimings {
    /// The timings of an activity on `clock`, in its try `activity_attempt` (1 for the first).
    pub(crate) fn new(clock: EngineClock, activity_attempt: u32) -> Self {
        Self {
            clock,
            resumed: (activity_attempt > 1).then_some(activity_attempt),
            stages: Vec::new(),
        }
    }

    /// Runs `work` as `stage`, keeping when it began and how long it took.
    pub async fn time<T>(&mut self, stage: Stage, work: impl Future<Output = T>) -> T {
        let started_at_ms = self.clock.now_ms();
        let began = Instant::now();
        let out = work.await;
        let duration_ms = began.elapsed().as_millis() as u64;
        self.stages.push(StageTiming {
            stage,
            started_at_ms,
            ended_at_ms: started_at_ms + duration_ms,
            duration_ms,
            resumed: self.resumed,
        });
        out
    }

    /// Appends the stages to the attempt's journal in one write, and forgets them (each is
    /// kept once). Timings are evidence, not outcome: a failure to keep them is logged,
    /// never raised.
    pub fn append_to(&mut self, env: &AttemptEnv) {
        if self.stages.is_empty() {
            return;
        }
        let entries: Vec<Entry> = self.stages.drain(..).map(Entry::Stage).collect();
        if let Err(e) = env.record(&entries) {
            tracing::warn!(error = %e, "stage timings not kept");
        }
    }

    /// The attempt's timings so far (from its journal) followed by these: the order they ran
    /// in.
    pub fn with_recorded(self, recorded: Vec<StageTiming>) -> Vec<StageTiming> {
        let mut all = recorded;
        all.extend(self.stages);
        all
    }
}
