//! A stage activity's context with its heartbeats metered. Every heartbeat is a Temporal
//! action: the workflow sets the heartbeat timeout to the batch's cadence
//! (`heartbeat_every_seconds`) plus a quarter, and the SDK sends at most one heartbeat per
//! 80 % of it, i.e. one per cadence, flushing the latest one recorded when each window ends
//! (so heartbeats stay on time however irregularly the runtimes report progress).
//!
//! A stage records nothing in its first half cadence: one that ends sooner costs no
//! heartbeat, and one that a crash interrupts then is found again by its attempt's files
//! (`Executor::adopt`). The count follows the SDK's throttle (first heartbeat at once, then at
//! most one per window, the latest of a window sent at its end), since the SDK does not say
//! what it sent.

use std::ops::Deref;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use casebatch_proto::BatchInput;
use casebatch_telemetry::Metrics;
use temporalio_common::data_converters::TemporalSerializable;
use temporalio_sdk::activities::ActivityContext;

/// An activity's context, and its heartbeats so far. Derefs to the SDK's context.
pub(crate) struct StageContext {
    ctx: ActivityContext,
    /// The engine's clock, read from when the server started this activity.
    clock: crate::timings::EngineClock,
    started: Instant,
    every: Duration,
    throttle: Mutex<Throttle>,
    metrics: Metrics,
}

impl StageContext {
    /// Timings for this activity's stages, on the engine's clock.
    pub(crate) fn timings(&self) -> crate::timings::StageTimings {
        crate::timings::StageTimings::new(self.clock, self.ctx.info().attempt)
    }

    /// Milliseconds since the epoch on the engine's clock (workflow time's), now.
    pub(crate) fn engine_now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn new(ctx: ActivityContext, metrics: &Metrics) -> Self {
        // The SDK's throttle: 80 % of the timeout the workflow set (`BatchInput::
        // heartbeat_timeout`), which is the batch's cadence.
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
        let clock = crate::timings::EngineClock::new(ctx.info().started_time);
        Self {
            clock,
            ctx,
            started: Instant::now(),
            every,
            throttle: Mutex::new(Throttle::default()),
            metrics: metrics.clone(),
        }
    }

    /// Records `details` as the stage's heartbeat (the SDK sends it, or a later one, in time).
    pub(crate) async fn heartbeat<D>(&self, details: D)
    where
        D: TemporalSerializable + 'static,
    {
        if self.ctx.info().is_local || self.started.elapsed() < self.every / 2 {
            return;
        }
        let sent = self
            .throttle
            .lock()
            .expect("heartbeat throttle")
            .record(Instant::now(), self.every);
        for _ in 0..sent {
            self.metrics.temporal_action("heartbeats");
        }
        let _ = self.ctx.record_heartbeat(details).await;
    }

    /// Heartbeats sent so far.
    pub(crate) fn sent(&self) -> u32 {
        let mut throttle = self.throttle.lock().expect("heartbeat throttle");
        let flushed = throttle.flush(Instant::now(), self.every);
        for _ in 0..flushed {
            self.metrics.temporal_action("heartbeats");
        }
        throttle.sent
    }
}

/// The SDK's heartbeat throttle, replayed to count what it sends: the first heartbeat goes at
/// once and opens a window; those recorded within it wait, and the latest is sent as it ends,
/// opening the next.
#[derive(Debug, Default)]
struct Throttle {
    window_ends: Option<Instant>,
    waiting: bool,
    sent: u32,
}

impl Throttle {
    /// A heartbeat recorded at `now`; returns how many were sent meanwhile (this one included).
    fn record(&mut self, now: Instant, every: Duration) -> u32 {
        let before = self.sent;
        self.flush(now, every);
        if self.window_ends.is_none() {
            self.sent += 1;
            self.window_ends = Some(now + every);
        } else {
            self.waiting = true;
        }
        self.sent - before
    }

    /// Sends what waited in the windows that ended by `now`; returns how many.
    fn flush(&mut self, now: Instant, every: Duration) -> u32 {
        let mut flushed = 0;
        while let Some(end) = self.window_ends
            && now >= end
        {
            if self.waiting {
                self.waiting = false;
                self.sent += 1;
                flushed += 1;
                self.window_ends = Some(end + every);
            } else {
                self.window_ends = None;
            }
        }
        flushed
    }
}

impl Deref for StageContext {
    type Target = ActivityContext;

    fn deref(&self) -> &ActivityContext {
        &self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_sends_the_first_at_once_then_one_per_window_at_its_end() {
        let (t0, every) = (Instant::now(), Duration::from_secs(4));
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut throttle = Throttle::default();
        // Recorded every second from 2 s to 10 s: sent at 2, at 6 (the window's end) and 10.
        let sent: Vec<u32> = (2..=10).map(|s| throttle.record(at(s), every)).collect();
        assert_eq!(sent, [1, 0, 0, 0, 1, 0, 0, 0, 1]);
        // The one recorded at 10 waits for its window's end at 14, which a stage ending
        // sooner never reaches; nothing recorded in the next window: nothing more is sent.
        assert_eq!(throttle.flush(at(13), every), 0);
        assert_eq!(throttle.flush(at(14), every), 1);
        assert_eq!(throttle.flush(at(30), every), 0);
        assert_eq!(throttle.sent, 4);
        // After a quiet window, the next heartbeat goes at once.
        assert_eq!(throttle.record(at(31), every), 1);
    }
}
