//! A stage activity's context with its heartbeats metered: sent at the batch's cadence
//! (`heartbeat_every_seconds`, read back from the heartbeat timeout the workflow gave the
//! activity), never faster however often the runtimes report progress, and counted, since
//! every heartbeat is a Temporal action.
//!
//! The first heartbeat goes out one cadence after the stage began, not at once: a stage that
//! ends sooner costs none, and one that a crash interrupts before it is found again by its
//! attempt's files (`Runtime::adopt`).

use std::ops::Deref;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use casebatch_proto::BatchInput;
use casebatch_telemetry::Metrics;
use temporalio_common::data_converters::TemporalSerializable;
use temporalio_sdk::activities::ActivityContext;

/// An activity's context, and its heartbeats so far. Derefs to the SDK's context.
pub(crate) struct StageContext {
    ctx: ActivityContext,
    every: Duration,
    last: Mutex<Instant>,
    sent: AtomicU32,
    metrics: Metrics,
}

impl StageContext {
    pub(crate) fn new(ctx: ActivityContext, metrics: &Metrics) -> Self {
        // The workflow sets the timeout to the cadence plus a quarter (`BatchInput::
        // heartbeat_timeout`): the SDK sends at most one heartbeat per 80 % of it.
        let every = ctx.info().heartbeat_timeout.map_or(
            Duration::from_millis(BatchInput::DEFAULT_HEARTBEAT_EVERY_MS),
            |t| t * 4 / 5,
        );
        // A local activity (the old pipeline's stages) is a marker in its workflow's history.
        metrics.temporal_action(if ctx.info().is_local {
            "markers"
        } else {
            "activities"
        });
        Self {
            ctx,
            every,
            last: Mutex::new(Instant::now()),
            sent: AtomicU32::new(0),
            metrics: metrics.clone(),
        }
    }

    /// Sends `details` as a heartbeat if a cadence has passed since the last one.
    pub(crate) async fn heartbeat<D>(&self, details: D)
    where
        D: TemporalSerializable + 'static,
    {
        {
            let mut last = self.last.lock().expect("heartbeat clock");
            if last.elapsed() < self.every || self.ctx.info().is_local {
                return;
            }
            *last = Instant::now();
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.metrics.temporal_action("heartbeats");
        let _ = self.ctx.record_heartbeat(details).await;
    }

    /// Heartbeats sent so far.
    pub(crate) fn sent(&self) -> u32 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Deref for StageContext {
    type Target = ActivityContext;

    fn deref(&self) -> &ActivityContext {
        &self.ctx
    }
}
