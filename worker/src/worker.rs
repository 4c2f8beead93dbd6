//! The worker: registers `BatchWorkflow`, the runtimes' `RuntimeBreaker`s and `RuntimeSlots`, the shared paces' `RatePacer`s and `CaseActivities`
//! on the casebatch task queue.
//! Several replicas on one task queue share batches safely: the workflow owns continuation.

use std::future::Future;
use std::time::Duration;

use casebatch_activities::{CaseActivities, Stopping};
use casebatch_attempt::hostname;
use casebatch_proto::{TASK_QUEUE, host_task_queue};
use casebatch_telemetry::{Listen, Metrics, Readiness, Telemetry};
use casebatch_workflows::{BatchWorkflow, RatePacer, RuntimeBreaker, RuntimeSlots};
use temporalio_client::Client;
use temporalio_common::telemetry::TelemetryOptions;
use temporalio_common::worker::WorkerDeploymentOptions;
use temporalio_sdk::runtime::worker_tuner::{FixedSizeSlotSupplier, TunerHolder};
use temporalio_sdk::runtime::{PollerBehavior, RuntimeOptions};
use temporalio_sdk::{Runtime, Worker, WorkerOptions};

/// Concurrent activity polls: a round of cases finishing together schedules dozens of
/// `settle` tasks at once, and the default of 5 polls fetches them a few at a time.
const ACTIVITY_POLLERS: usize = 16;
/// Activity slots a workflow task may reserve for eager `start`s (where the server allows
/// eager execution): a task that admits a round of cases hands them all over at once, where
/// the SDK's default of 3 would send the rest through matching.
const EAGER_STARTS_PER_TASK: usize = 32;
/// Activities each worker runs at once. A case in flight holds one (its `start` watching the
/// job, or its `settle`), two while a speculative duplicate or a cleanup runs beside it, and
/// a batch has up to 512 in flight: the SDK's default of 100 held a 512-wide batch's starts
/// in the server's queue (the last of a round began 10 s after the first). Activities here
/// wait on processes and agents, so a slot costs a task, not a core; what bounds a host's
/// load is the batches' `concurrency` and the runtimes' envelopes.
const ACTIVITY_SLOTS: usize = 1024;
/// The SDK's default for the other kinds of task (workflow tasks, local activities, Nexus).
const OTHER_SLOTS: usize = 100;

/// The two workers of one casebatch process: the shared task queue (workflows and every
/// activity) and this host's queue (where `await` of jobs started on this host runs).
pub struct Workers {
    shared: Worker,
    host: Worker,
    /// `/readyz` of the process's telemetry listener, if it serves one.
    ready: Option<Readiness>,
    /// Told before shutdown begins, so waits cut short by it hand their jobs back.
    stopping: Stopping,
    /// Keeps the shared runtimes' slots metrics while the process serves metrics.
    slots_metrics: Option<std::pin::Pin<Box<dyn Future<Output = ()>>>>,
}

/// The SDK runtime workers run on. With `telemetry`, its worker metrics land there, beside
/// casebatch's own, served with `/healthz` and `/readyz`.
pub fn worker_runtime(telemetry: Option<&Telemetry>) -> anyhow::Result<Runtime> {
    let mut options = RuntimeOptions::default();
    if let Some(t) = telemetry {
        options = RuntimeOptions::builder()
            .telemetry_options(TelemetryOptions::builder().metrics(t.meter.clone()).build())
            .build()
            .map_err(anyhow::Error::msg)?;
    }
    Ok(Runtime::from_current_tokio(options)?)
}

/// What the workers tell the engine they are built from (informational: casebatch does not opt
/// into worker versioning; replays across builds are kept safe by the workflow's patches). The
/// SDK's default is a CRC of the whole executable, read from disk at every start: 72 MB here,
/// 13 ms with a warm page cache before any batch can begin.
const BUILD_ID: &str = concat!("casebatch-", env!("CARGO_PKG_VERSION"));

/// Builds the workers for the casebatch task queue and this host's queue, recording into
/// `telemetry`'s metrics when there is one.
pub fn build_worker(
    runtime: &Runtime,
    client: Client,
    telemetry: Option<&Telemetry>,
) -> anyhow::Result<Workers> {
    let metrics = telemetry.map_or_else(Metrics::disabled, |t| t.metrics.clone());
    let stopping = Stopping::default();
    let build = WorkerDeploymentOptions::from_build_id(BUILD_ID.into());
    let activities = CaseActivities::with_breakers(client.clone())
        .with_metrics(metrics.clone())
        .with_stopping(stopping.clone());
    let slots_metrics = (telemetry.is_some())
        .then(|| activities.slots_metrics())
        .flatten()
        .map(|watch| Box::pin(watch) as std::pin::Pin<Box<dyn Future<Output = ()>>>);
    let shared = WorkerOptions::new(TASK_QUEUE)
        .deployment_options(build.clone())
        .register_workflow::<BatchWorkflow>()?
        .register_workflow::<RuntimeBreaker>()?
        .register_workflow::<RatePacer>()?
        .register_workflow::<RuntimeSlots>()?
        // `start` runs here, and consults the runtimes' breakers through the client.
        .register_activities(activities)
        // A crashed worker's sticky queue is abandoned quickly.
        .sticky_queue_schedule_to_start_timeout(Duration::from_secs(3))
        .graceful_shutdown_period(Duration::from_secs(2))
        .activity_task_poller_behavior(PollerBehavior::SimpleMaximum(ACTIVITY_POLLERS))
        .max_eager_activity_reservations_per_workflow_task(EAGER_STARTS_PER_TASK)
        .tuner(slots())
        .build();
    let host = WorkerOptions::new(host_task_queue(&hostname()))
        .deployment_options(build.clone())
        .register_activities(
            CaseActivities::default()
                .with_metrics(metrics)
                .with_stopping(stopping.clone()),
        )
        .graceful_shutdown_period(Duration::from_secs(2))
        .activity_task_poller_behavior(PollerBehavior::SimpleMaximum(ACTIVITY_POLLERS))
        .tuner(slots())
        .build();
    Ok(Workers {
        shared: Worker::new(runtime, client.clone(), shared)?,
        host: Worker::new(runtime, client, host)?,
        ready: telemetry.map(|t| t.ready.clone()),
        stopping,
        slots_metrics,
    })
}

/// How many tasks of each kind a worker runs at once.
fn slots() -> TunerHolder {
    let fixed = FixedSizeSlotSupplier::new;
    TunerHolder::builder()
        .workflow_task_slot_supplier(fixed(OTHER_SLOTS))
        .activity_task_slot_supplier(fixed(ACTIVITY_SLOTS))
        .local_activity_task_slot_supplier(fixed(OTHER_SLOTS))
        .nexus_task_slot_supplier(fixed(OTHER_SLOTS))
        .build()
}

/// Hosts this process's workers on `client` until `until` completes, serving metrics and
/// probes as `metrics` says if given.
pub async fn host_until<F, T>(
    client: Client,
    metrics: Option<&Listen>,
    until: F,
) -> anyhow::Result<T>
where
    F: Future<Output = T>,
{
    let telemetry = match metrics {
        Some(listen) => Some(Telemetry::serve(listen).await?),
        None => None,
    };
    host_served_until(client, telemetry.as_ref(), until).await
}

/// [`host_until`] with a listener already serving: a worker replica starts it before it
/// connects, so `/healthz` answers from its first moment while `/readyz` waits for the
/// engine.
pub async fn host_served_until<F, T>(
    client: Client,
    telemetry: Option<&Telemetry>,
    until: F,
) -> anyhow::Result<T>
where
    F: Future<Output = T>,
{
    let runtime = worker_runtime(telemetry)?;
    let mut workers = build_worker(&runtime, client, telemetry)?;
    run_worker_until(&mut workers, until).await
}

/// Runs the workers until `until` completes, then shuts them down. `Worker::run` is not
/// `Send`, so everything is driven in the current task.
pub async fn run_worker_until<F, T>(workers: &mut Workers, until: F) -> anyhow::Result<T>
where
    F: Future<Output = T>,
{
    let stop_shared = workers.shared.shutdown_handle();
    let stop_host = workers.host.shutdown_handle();
    let (shared, host) = (workers.shared.run(), workers.host.run());
    let slots_metrics = workers.slots_metrics.take();
    let run = async {
        // The watch runs as long as the workers do: they end it.
        let watch = async {
            if let Some(watch) = slots_metrics {
                watch.await;
            }
            std::future::pending::<std::convert::Infallible>().await
        };
        tokio::select! {
            ran = async { tokio::join!(shared, host) } => ran,
            never = watch => match never {},
        }
    };
    tokio::pin!(run);
    tokio::pin!(until);
    // Connected (the client is) and polling from here on, until shutdown begins.
    let ready = |now: bool| {
        if let Some(r) = &workers.ready {
            r.set(now);
        }
    };
    ready(true);
    let out = tokio::select! {
        (a, b) = &mut run => {
            ready(false);
            a?;
            b?;
            anyhow::bail!("the worker stopped before the work was done")
        }
        out = &mut until => {
            ready(false);
            workers.stopping.begin();
            stop_shared();
            stop_host();
            let (a, b) = run.await;
            a?;
            b?;
            out
        }
    };
    Ok(out)
}
