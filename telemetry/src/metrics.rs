//! casebatch's own instruments, recorded where an attempt's stages run (the activities).
//! Without `--metrics-bind` they record into a no-op meter, so callers never branch.

use std::sync::Arc;
use std::time::Duration;

use temporalio_common::telemetry::HistogramBucketOverrides;
use temporalio_common::telemetry::metrics::{
    CoreMeter, Counter, Gauge, HistogramDuration, MetricAttributes, MetricKeyValue,
    MetricParameters, NewAttributes, NoOpCoreMeter, UpDownCounter,
};

/// casebatch's histograms, by the name they are created with: the exporter appends the unit
/// (`casebatch_stage_duration_seconds`).
const STAGE_DURATION: &str = "casebatch_stage_duration";
const ATTEMPT_DURATION: &str = "casebatch_attempt_duration";
const SLOT_WAIT: &str = "casebatch_slot_wait";
/// The SDK's histogram of how long an activity ran: a `settle` lasts as long as its harness.
const ACTIVITY_EXECUTION_LATENCY: &str = "activity_execution_latency";

/// Bucket bounds, in seconds, for durations of a stage, an attempt or an activity: 50 ms to 4
/// hours. A harness runs for seconds to hours; the SDK's defaults stop at 10 s (60 s for
/// activities), which puts every longer one in `+Inf`.
pub const DURATION_BUCKETS: [f64; 18] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
    3600.0, 7200.0, 14400.0,
];

/// The exporter's buckets for the histograms above (matched as a part of the metric's name).
pub(crate) fn bucket_overrides() -> HistogramBucketOverrides {
    HistogramBucketOverrides {
        overrides: [
            STAGE_DURATION,
            ATTEMPT_DURATION,
            SLOT_WAIT,
            ACTIVITY_EXECUTION_LATENCY,
        ]
        .into_iter()
        .map(|name| (name.to_string(), DURATION_BUCKETS.to_vec()))
        .collect(),
    }
}

/// The instruments. Cloning is cheap (each is a handle).
#[derive(Clone)]
pub struct Metrics {
    meter: Arc<dyn CoreMeter>,
    cases_finished: Counter,
    attempts: Counter,
    adopted: Counter,
    redispatched: Counter,
    retries: Counter,
    oom_escalations: Counter,
    cleanup_unconfirmed: Counter,
    released: Counter,
    jobs_awaited: UpDownCounter,
    stage_duration: HistogramDuration,
    attempt_duration: HistogramDuration,
    temporal_actions: Counter,
    usage_tokens: Counter,
    usage_cost: Counter,
    slots_capacity: Gauge,
    slots_held: Gauge,
    slots_waiting: Gauge,
    slot_wait: HistogramDuration,
}

/// How one attempt ended, as its `cleanup` (or the `settle` that closed it) recorded it.
#[derive(Debug, Clone, Copy)]
pub struct AttemptEnd<'a> {
    /// The recorded state: `succeeded`, `failed`, `cancelled`, `retrying`, or
    /// `speculative_loser` for a duplicate that lost its race.
    pub outcome: &'a str,
    /// `infra`, `harness`, `agent`, `evaluator`, `config`, …; `None` when nothing failed.
    pub failure_class: Option<&'a str>,
    /// The failure code (`JOB_LOST`, `OOM_KILLED`, …).
    pub failure_code: Option<&'a str>,
    /// The case ends with this attempt (no retry, boost or spillover follows).
    pub is_final: bool,
    /// The job was re-attached after a worker died (not run again).
    pub adopted: bool,
    pub cleanup_confirmed: bool,
    /// The runtime kind (`local-process`, `agent`, `fake`).
    pub runtime: &'a str,
    /// From its dispatch to its end, where both are known.
    pub duration: Option<Duration>,
}

fn params(name: &'static str, description: &'static str) -> MetricParameters {
    MetricParameters::builder()
        .name(name)
        .description(description)
        .build()
}

impl Metrics {
    pub fn new(meter: Arc<dyn CoreMeter>) -> Self {
        let counter = |name, description| meter.counter(params(name, description));
        Self {
            cases_finished: counter(
                "casebatch_cases_finished",
                "Cases that reached their end, by outcome and failure class",
            ),
            attempts: counter("casebatch_attempts", "Attempts closed, by outcome"),
            temporal_actions: counter(
                "casebatch_temporal_actions",
                "Temporal actions this worker's stage activities cost, by kind (activities \
                 started, heartbeats sent; the batch counts the rest in its status)",
            ),
            usage_tokens: counter(
                "casebatch_usage_tokens",
                "Tokens attempts reported in their result's usage, by kind (input, output)",
            ),
            usage_cost: counter(
                "casebatch_usage_cost_microdollars",
                "Cost attempts reported in their result's usage (usage.cost_usd), in millionths \
                 of a US dollar (a counter counts whole numbers)",
            ),
            adopted: counter(
                "casebatch_adopted",
                "Attempts whose job was re-attached after a worker died (not run again)",
            ),
            redispatched: counter(
                "casebatch_redispatched",
                "Attempts whose job was lost with nothing to adopt, so the case runs again",
            ),
            retries: counter(
                "casebatch_retries",
                "Attempts followed by another attempt of the case, by failure class",
            ),
            oom_escalations: counter(
                "casebatch_oom_escalations",
                "OOM-killed attempts re-run with more memory inside the batch",
            ),
            cleanup_unconfirmed: counter(
                "casebatch_cleanup_unconfirmed",
                "Cleanups that could not confirm every process of the attempt gone",
            ),
            released: counter(
                "casebatch_prepared_released",
                "Environments provisioned ahead and cleaned up unused",
            ),
            jobs_awaited: meter.up_down_counter(params(
                "casebatch_jobs_awaited",
                "Jobs this worker is waiting on now (a settle in progress)",
            )),
            stage_duration: meter.histogram_duration(params(
                STAGE_DURATION,
                "How long each stage activity took (start, settle, cleanup, prepare, release)",
            )),
            attempt_duration: meter.histogram_duration(params(
                ATTEMPT_DURATION,
                "How long each attempt took, from its dispatch to its end, by outcome and runtime",
            )),
            slots_capacity: meter.gauge(params(
                "casebatch_slots_capacity",
                "A shared runtime's slots (an agent's --max-concurrent), by endpoint, as its \
                 slots workflow last said",
            )),
            slots_held: meter.gauge(params(
                "casebatch_slots_held",
                "A shared runtime's slots held by cases of any batch, by endpoint",
            )),
            slot_wait: meter.histogram_duration(params(
                SLOT_WAIT,
                "How long each case waited for a shared runtime's slot, from its ask to its \
                 grant, by endpoint and priority",
            )),
            slots_waiting: meter.gauge(params(
                "casebatch_slots_waiting",
                "Cases of any batch waiting for a shared runtime's slot, by endpoint and priority",
            )),
            meter,
        }
    }

    /// Records nothing: a worker without `--metrics-bind`.
    pub fn disabled() -> Self {
        Self::new(Arc::new(NoOpCoreMeter))
    }

    fn attributes(&self, pairs: &[(&'static str, &str)]) -> MetricAttributes {
        let kvs = pairs
            .iter()
            .map(|(k, v)| MetricKeyValue::new(*k, v.to_string()));
        self.meter
            .new_attributes(NewAttributes::new(kvs.collect::<Vec<_>>()))
    }

    /// What a closed attempt reported it consumed. Call once per attempt, with its close.
    pub fn usage(&self, input_tokens: f64, output_tokens: f64, cost_usd: f64) {
        for (kind, n) in [("input", input_tokens), ("output", output_tokens)] {
            if n > 0.0 {
                self.usage_tokens
                    .add(n.round() as u64, &self.attributes(&[("kind", kind)]));
            }
        }
        if cost_usd > 0.0 {
            let micro = (cost_usd * 1e6).round() as u64;
            self.usage_cost.add(micro, &self.attributes(&[]));
        }
    }

    /// An attempt was closed. Call once per attempt (not again on an activity retry).
    pub fn attempt_closed(&self, end: AttemptEnd<'_>) {
        let class = end.failure_class.unwrap_or("none");
        let by_outcome = self.attributes(&[("outcome", end.outcome), ("runtime", end.runtime)]);
        self.attempts.add(1, &by_outcome);
        if let Some(took) = end.duration {
            self.attempt_duration.record(took, &by_outcome);
        }
        let by_runtime = self.attributes(&[("runtime", end.runtime)]);
        if end.adopted {
            self.adopted.add(1, &by_runtime);
        }
        if !end.cleanup_confirmed {
            self.cleanup_unconfirmed.add(1, &by_runtime);
        }
        if end.outcome == "speculative_loser" {
            return;
        }
        if end.is_final {
            self.cases_finished.add(
                1,
                &self.attributes(&[("outcome", end.outcome), ("failure_class", class)]),
            );
            return;
        }
        self.retries
            .add(1, &self.attributes(&[("failure_class", class)]));
        match end.failure_code {
            Some("JOB_LOST") => self.redispatched.add(1, &by_runtime),
            Some("OOM_KILLED") => self.oom_escalations.add(1, &by_runtime),
            _ => {}
        }
    }

    /// An environment provisioned ahead was released unused.
    pub fn released(&self, runtime: &str) {
        self.released
            .add(1, &self.attributes(&[("runtime", runtime)]));
    }

    /// A stage activity cost a Temporal action of `kind` (`activities`, `heartbeats`).
    pub fn temporal_action(&self, kind: &'static str) {
        self.temporal_actions
            .add(1, &self.attributes(&[("kind", kind)]));
    }

    /// A stage activity took `took`.
    pub fn stage(&self, stage: &'static str, took: Duration) {
        self.stage_duration
            .record(took, &self.attributes(&[("stage", stage)]));
    }

    /// A shared runtime's slots as its slots workflow answered: the same for every worker that
    /// reads them (aggregate with `max`, not `sum`). `waiting`: cases per priority level,
    /// every level given (zeros too, so a drained level reads 0).
    pub fn slots(
        &self,
        endpoint: &str,
        capacity: u32,
        held: u32,
        waiting: impl IntoIterator<Item = (u32, u32)>,
    ) {
        let at = self.attributes(&[("endpoint", endpoint)]);
        self.slots_capacity.record(u64::from(capacity), &at);
        self.slots_held.record(u64::from(held), &at);
        for (priority, cases) in waiting {
            let level = priority.to_string();
            let at = self.attributes(&[("endpoint", endpoint), ("priority", &level)]);
            self.slots_waiting.record(u64::from(cases), &at);
        }
    }

    /// A case waited `waited` for its slot on the shared runtime at `endpoint`. Call once per
    /// grant.
    pub fn slot_wait(&self, endpoint: &str, priority: u32, waited: Duration) {
        let level = priority.to_string();
        let at = self.attributes(&[("endpoint", endpoint), ("priority", &level)]);
        self.slot_wait.record(waited, &at);
    }

    /// Counts a job as awaited until the returned guard is dropped.
    pub fn awaiting(&self, runtime: &str) -> Awaiting {
        let attributes = self.attributes(&[("runtime", runtime)]);
        self.jobs_awaited.add(1, &attributes);
        Awaiting {
            gauge: self.jobs_awaited.clone(),
            attributes,
        }
    }
}

/// One awaited job, counted in `casebatch_jobs_awaited` while it lives.
pub struct Awaiting {
    gauge: UpDownCounter,
    attributes: MetricAttributes,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.gauge.add(-1, &self.attributes);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::disabled()
    }
}
