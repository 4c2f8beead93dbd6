//! `CaseActivities`: the implementations of the stage contracts declared in
//! `casebatch_workflows::contracts`, dispatching to the case's runtime.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use casebatch_bundle::{
    AttemptJournal, AttemptRecord, Bundle, BundleError, CaseResult, CleanupReceipt, Entry, Event,
    PlanIndex, PreparedRecord, RECORD_SCHEMA_VERSION, ReleasedRecord, append_jsonl,
    layout::attempt_files, read_json, write_final_batch_files, write_json_atomic,
};
use casebatch_manifest::model::{RuntimeKind, RuntimeSpec};
use casebatch_proto::pace::PaceAsk;
use casebatch_proto::{
    ActorReport, ActorStatus, AttemptKey, AttemptSummary, AwaitInput, CleanupInput, CleanupReport,
    Evaluation, Failure, FailureCode, FinalizeInput, JobRef, Prepared, ReleaseInput, SettleInput,
    SettleShort, Settled, Stage, StageResult, StartInput, StartResult, SubmitResult, SweepInput,
    SweepReport, UNANSWERED_WAIT_S, Usage, host_task_queue,
};
use casebatch_workflows::{contracts, decide};
use temporalio_macros::activities;
use temporalio_sdk::ApplicationFailure;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tracing::Instrument;

use crate::beats::StageContext;
use crate::breakers::{BreakerOf, Breakers};
use crate::timings::StageTimings;
use casebatch_bundle::now_ms;
use casebatch_container::ContainerRuntime;
use casebatch_runtime::agent::AgentRuntime;
use casebatch_runtime::evaluator;
use casebatch_runtime::fake::Fake;
use casebatch_runtime::harness;
use casebatch_runtime::local_process::{LocalProcess, hostname};
use casebatch_runtime::{AttemptEnv, Liveness, NotStarted, Runtime};
use casebatch_telemetry::{AttemptEnd, Metrics};

/// The stage activities. One instance per worker; runtimes keep per-process state (children
/// this worker spawned, connections to agents) and plans are indexed once per bundle because
/// they never change (a case is read from the file when an activity needs it: a worker never
/// holds a 100,000-case plan whole).
#[derive(Default)]
pub struct CaseActivities {
    local: LocalProcess,
    container: ContainerRuntime,
    fake: Fake,
    agent: AgentRuntime,
    plans: Mutex<HashMap<String, Arc<PlanIndex>>>,
    /// Without a client (unit tests) every breaker reads as closed.
    breakers: Breakers,
    /// For the shared paces (`reserve_start`); `None` on the host queue's instance, which
    /// never gets that activity.
    client: Option<temporalio_client::Client>,
    /// Recorded as attempts end; a no-op meter unless the worker serves metrics.
    metrics: Metrics,
    /// Set by the worker as it begins shutting down.
    stopping: Stopping,
}

/// Whether this process's worker is shutting down. The SDK cancels the activities still
/// running when its grace period ends and does not say why, so the worker says it here, for
/// the log of a cancelled wait (no cancelled wait kills its job). Cloning shares the flag.
#[derive(Clone, Debug, Default)]
pub struct Stopping(Arc<AtomicBool>);

impl Stopping {
    pub fn begin(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Heartbeats through the activity context.
struct ActivityLiveness<'a> {
    ctx: &'a StageContext,
}

impl Liveness for ActivityLiveness<'_> {
    async fn heartbeat(&self, job: &JobRef) {
        self.ctx.heartbeat(job.clone()).await;
    }
    fn is_cancelled(&self) -> bool {
        self.ctx.is_cancelled()
    }
    // The SDK does not say why a wait was cancelled (a batch cancel, the worker stopping, or
    // heartbeats a stalled engine did not answer in time), and none of them is a reason to
    // kill the job: the default `OnCancel::EndWait` leaves it to cleanup or to the retry.
}

/// `start`'s liveness while it watches its job: the wait ends at `until` (or on cancel),
/// leaving the job running.
struct Watching<'a> {
    ctx: &'a StageContext,
    until: Instant,
}

impl Liveness for Watching<'_> {
    async fn heartbeat(&self, job: &JobRef) {
        self.ctx.heartbeat(job.clone()).await;
    }
    fn is_cancelled(&self) -> bool {
        self.ctx.is_cancelled() || Instant::now() >= self.until
    }
}

/// A job that ended, as the stages after its wait see it.
struct Ended {
    job: JobRef,
    actor: ActorReport,
    close_from: Option<AttemptSummary>,
}

/// Whether `start` may settle the job it started: where the job runs on this worker's host
/// (a local process, whose wait hands the child back when it ends early) or is simulated, and
/// nothing long follows the actor (no evaluator, whose own timeout `start`'s would cut).
fn settles_at_start(env: &AttemptEnv) -> bool {
    match env.case.runtime {
        RuntimeKind::Fake => true,
        RuntimeKind::LocalProcess => env.job.sandbox.is_none() && env.case.evaluator.is_none(),
        RuntimeKind::Agent => false,
    }
}

/// Runs `$body` with the case's runtime bound to `$rt`.
macro_rules! with_runtime {
    ($self:ident, $env:expr, |$rt:ident| $body:expr) => {
        match $env.case.runtime {
            // A container sandbox is a local runtime too: the engine is this host's.
            RuntimeKind::LocalProcess if $env.job.sandbox.is_some() => {
                let $rt = &$self.container;
                $body
            }
            RuntimeKind::LocalProcess => {
                let $rt = &$self.local;
                $body
            }
            RuntimeKind::Fake => {
                let $rt = &$self.fake;
                $body
            }
            RuntimeKind::Agent => {
                let $rt = &$self.agent;
                $body
            }
        }
    };
}

impl CaseActivities {
    /// Activities that consult the runtimes' circuit breakers and the shared paces through
    /// `client`.
    pub fn with_breakers(client: temporalio_client::Client) -> Self {
        Self {
            breakers: Breakers::new(client.clone()),
            client: Some(client),
            ..Self::default()
        }
    }

    /// The same, recording into `metrics`.
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        Self { metrics, ..self }
    }

    /// The same, handing jobs back once `stopping` is set.
    pub fn with_stopping(self, stopping: Stopping) -> Self {
        Self { stopping, ..self }
    }

    fn plan(&self, bundle_dir: &str) -> Result<Arc<PlanIndex>, ActivityError> {
        if let Some(p) = self.plans.lock().expect("lock").get(bundle_dir) {
            return Ok(p.clone());
        }
        let plan =
            Arc::new(PlanIndex::open(&Bundle::at(bundle_dir).plan()).map_err(unreadable_plan)?);
        self.plans
            .lock()
            .expect("lock")
            .insert(bundle_dir.to_string(), plan.clone());
        Ok(plan)
    }

    fn env(&self, key: &AttemptKey) -> Result<AttemptEnv, ActivityError> {
        let index = self.plan(&key.bundle_dir)?;
        let plan = index.plan();
        let mut case = index
            .case(key.case_index)
            .map_err(unreadable_plan)?
            .ok_or_else(|| {
                classified(&Failure::config(
                    Stage::Provision,
                    FailureCode::CaseNotInPlan,
                    format!(
                        "case index {} is not in the plan of {}: the bundle does not match the batch",
                        key.case_index, key.bundle_dir
                    ),
                ))
            })?;
        // A routed attempt runs where the workflow sent it, one of the case's list.
        if let Some(name) = &key.runtime {
            let (kind, spec) = plan.runtime_named(name).ok_or_else(|| {
                classified(&Failure::config(
                    Stage::Provision,
                    FailureCode::RuntimeUnreachable,
                    format!(
                        "runtime `{name}` is not in the runtimes table of {}: the bundle \
                         does not match the batch",
                        key.bundle_dir
                    ),
                ))
            })?;
            case.runtime = kind;
            case.runtime_name = spec.map(|_| name.clone());
        }
        // The agent's entry of the runtimes table; a missing one is the runtime's to report
        // (a config failure of the stage, an unconfirmed cleanup), not an activity error.
        let spec = match &case.runtime_name {
            Some(n) if case.runtime == RuntimeKind::Agent => plan.runtimes.get(n).cloned(),
            _ => None,
        };
        let env = AttemptEnv::new(key.clone(), case);
        Ok(match spec {
            Some(spec) => env.with_runtime_spec(spec),
            None => env,
        })
    }

    /// The breaker a routed attempt consults; `None` for a case on one runtime.
    fn breaker_of(&self, env: &AttemptEnv) -> Option<BreakerOf> {
        let runtime = env.key.runtime.clone()?;
        let index = self.plan(&env.key.bundle_dir).ok()?;
        let plan = index.plan();
        let spec = plan.runtime_named(&runtime).and_then(|(_, spec)| spec);
        let settings = spec.map(RuntimeSpec::breaker).unwrap_or_default();
        Some(BreakerOf {
            id: plan.breaker_id(&runtime, &hostname())?,
            runtime,
            settings,
        })
    }

    fn event(env: &AttemptEnv, kind: &str, message: String) {
        let _ = append_jsonl(
            &env.bundle.events(),
            &Event {
                ts_ms: now_ms(),
                kind: kind.into(),
                case_id: Some(env.case.case_id.clone()),
                attempt: Some(env.key.attempt),
                message,
            },
        );
    }
}

/// Shared storage can blip: an unreadable plan is infra, retried by the activity policy.
fn unreadable_plan(e: BundleError) -> ActivityError {
    classified(&Failure::infra(
        Stage::Provision,
        FailureCode::BundleUnreadable,
        e.to_string(),
    ))
}

/// A classified failure as a Temporal failure of type `casebatch.<class>`, so activity retry
/// policies key on the class; the whole [`Failure`] travels as the failure's details.
fn classified(f: &Failure) -> ActivityError {
    ActivityError::application(
        ApplicationFailure::builder(f.message.clone())
            .type_name(f.class.temporal_type())
            .non_retryable(!f.retryable)
            .details(f.clone())
            .build(),
    )
}

/// A write the bundle refused because of who the worker runs as (permissions, a read-only
/// mount): a config failure naming the path and the worker's uid, never retried (the same
/// user fails the same way). Other write errors are not classified here.
fn refused_write(stage: Stage, path: &Path, e: &std::io::Error) -> Option<Failure> {
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
    use std::os::unix::fs::MetadataExt;
    if !matches!(e.kind(), PermissionDenied | ReadOnlyFilesystem) {
        return None;
    }
    // /proc/self belongs to the process's effective uid and gid.
    let who = std::fs::metadata("/proc/self")
        .map(|m| format!("uid {}, gid {}", m.uid(), m.gid()))
        .unwrap_or_else(|_| "uid unknown".into());
    Some(Failure::config(
        stage,
        FailureCode::BundleUnwritable,
        format!(
            "the worker ({who}) cannot write {}: {e}; give that user write access to the \
             output directory (casebatch's images run as uid 10001), or run the worker as its owner",
            path.display()
        ),
    ))
}

/// A write that failed for want of space (or of quota): the disk's state, not the attempt's.
fn out_of_space(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    matches!(e.kind(), StorageFull | QuotaExceeded)
}

/// Pauses between tries of a bundle write the disk had no space for: 1 s, growing to 5 s.
const SPACE_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
const SPACE_MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `write` until it does not fail for want of space, heartbeating while it waits; raises
/// a cancel when the activity is cancelled meanwhile. A full disk is no fault of the attempt:
/// failing it would spend the case's attempts (or fail the case, which `resume` does not run
/// again), while the runner stops the run on a full disk, its worker hands this activity
/// back, and the engine's retry of it writes once space is back.
async fn with_space<T>(
    ctx: &StageContext,
    mut write: impl FnMut() -> Result<T, BundleError>,
) -> Result<Result<T, BundleError>, ActivityError> {
    let path = match write() {
        Err(BundleError::Write { path, source }) if out_of_space(&source) => {
            tracing::warn!(%path, error = %source, "no space for the bundle: waiting for space");
            path
        }
        written => return Ok(written),
    };
    let waited = async {
        let mut pause = SPACE_FIRST_PAUSE;
        loop {
            tokio::select! {
                _ = ctx.cancelled() => return Err(ActivityError::cancelled()),
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(SPACE_MAX_PAUSE);
            match write() {
                Err(BundleError::Write { source, .. }) if out_of_space(&source) => {}
                written => return Ok(written),
            }
        }
    };
    let written = heartbeating(ctx, (), waited).await;
    if written.is_ok() {
        tracing::info!(%path, "space is back: written");
    } else {
        tracing::info!(%path, "no space yet: the write is left to the engine's retry");
    }
    written
}

/// A bundle write of `stage`: a full disk waited out ([`with_space`]), a refusal raised as
/// the config failure it is.
async fn bundle_write<T>(
    ctx: &StageContext,
    stage: Stage,
    write: impl FnMut() -> Result<T, BundleError>,
) -> Result<T, ActivityError> {
    match with_space(ctx, write).await? {
        Err(BundleError::Write { path, source }) => {
            Err(match refused_write(stage, Path::new(&path), &source) {
                Some(f) => classified(&f),
                None => BundleError::Write { path, source }.into(),
            })
        }
        other => Ok(other?),
    }
}

/// Creates a directory of the bundle, its error the write error it is.
/// The attempt's journal, read on a blocking thread. One that cannot be read (replaced by
/// the attempt's processes, an I/O error) reads as empty, named in the log: what it would
/// have said is done again (an evaluation) or left out (timings).
async fn journal_of(env: &AttemptEnv) -> Arc<AttemptJournal> {
    let dir = env.dir.clone();
    let read = tokio::task::spawn_blocking(move || AttemptJournal::read(&dir)).await;
    match read {
        Ok(Ok(journal)) => journal,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the attempt's journal is unreadable");
            Arc::default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the attempt's journal failed");
            Arc::default()
        }
    }
}

fn make_dir(dir: &Path) -> Result<(), BundleError> {
    std::fs::create_dir_all(dir).map_err(|source| BundleError::Write {
        path: dir.display().to_string(),
        source,
    })
}

/// The stages themselves, shared by the current activities (`start`, `settle`) and the
/// single-stage ones that batches started on the local-activity pipeline still call.
impl CaseActivities {
    /// Where the attempt's processes run: `settle` and `cleanup` are routed there.
    fn host_queue(env: &AttemptEnv) -> Option<String> {
        match env.case.runtime {
            RuntimeKind::LocalProcess => Some(host_task_queue(&hostname())),
            RuntimeKind::Fake | RuntimeKind::Agent => None,
        }
    }

    async fn provision_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
    ) -> Result<StageResult, ActivityError> {
        // A bundle the worker may not write fails the attempt as config, not the activity.
        if let Err(BundleError::Write { path, source }) =
            with_space(ctx, || make_dir(&env.dir)).await?
        {
            return match refused_write(Stage::Provision, &env.dir, &source) {
                Some(f) => Ok(StageResult::Failed(f)),
                None => Err(BundleError::Write { path, source }.into()),
            };
        }
        let spec = [Entry::Spec(serde_json::json!({
            "schema_version": RECORD_SCHEMA_VERSION,
            "key": env.key,
            "case": env.case,
            "simulated": env.case.runtime == RuntimeKind::Fake,
        }))];
        bundle_write(ctx, Stage::Provision, || env.record(&spec)).await?;
        let result = with_runtime!(self, env, |rt| rt.provision(env).await);
        Ok(match result {
            Ok(()) => StageResult::Ok,
            Err(f) => StageResult::Failed(f),
        })
    }

    async fn submit_stage(&self, env: &AttemptEnv) -> Result<JobRef, NotStarted> {
        with_runtime!(self, env, |rt| rt.submit(env).await)
    }

    /// Waits for the job to end. A retry of the activity (the previous worker died)
    /// re-attaches to the job named by the last heartbeat, or finds it by its case key.
    /// Returns the job it awaited with the report.
    async fn await_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        submitted: JobRef,
    ) -> Result<(JobRef, ActorReport), ActivityError> {
        let job = ctx
            .heartbeat_details()
            .deserialize::<JobRef>()
            .ok()
            .flatten()
            .or_else(|| with_runtime!(self, env, |rt| rt.adopt(env)))
            .unwrap_or(submitted);
        let retried = ctx.info().attempt > 1;
        let live = ActivityLiveness { ctx };
        let mut report = with_runtime!(self, env, |rt| rt.await_job(env, &job, &live).await);
        // local-process knows whether it re-attached (see its module doc); for the fake
        // runtime (no process) and an agent (the job lives there, another worker's await
        // died), a retried await stands for re-attaching.
        report.adopted |= retried
            && matches!(env.case.runtime, RuntimeKind::Fake | RuntimeKind::Agent)
            && report
                .failure
                .as_ref()
                .is_none_or(|f| f.code != FailureCode::JobLost);
        if report.adopted {
            Self::event(env, "adopted", format!("re-attached to job {}", job.marker));
        }
        if report.status == ActorStatus::Cancelled {
            if self.stopping.get() {
                tracing::info!(job = %job.marker, "worker stopping: the job is handed back to the engine's retry");
            } else {
                tracing::warn!(
                    job = %job.marker,
                    "the engine cancelled the wait (a batch cancel, or heartbeats it did not \
                     answer in time): the job runs on, for the attempt's cleanup or the \
                     engine's retry of the wait, which re-attaches"
                );
            }
            return Err(ActivityError::cancelled());
        }
        Ok((job, report))
    }

    /// The runtime evaluates the attempt where its actor ran (the fake one simulates it).
    async fn evaluate_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        job: &JobRef,
    ) -> Result<Evaluation, ActivityError> {
        // Run again after a crash: the verdict already written stands.
        if let Some(done) = &journal_of(env).await.evaluation {
            return Ok(evaluator::to_evaluation(done));
        }
        let record = match (&env.case.runtime, &env.case.evaluator) {
            (RuntimeKind::Fake, _) | (_, Some(_)) => {
                let live = ActivityLiveness { ctx };
                with_runtime!(self, env, |rt| rt.evaluate(env, job, &live).await)
            }
            (_, None) => evaluator::not_configured(),
        };
        let evaluation = evaluator::to_evaluation(&record);
        let entry = [Entry::Evaluation(record)];
        bundle_write(ctx, Stage::Evaluate, || env.record(&entry)).await?;
        Ok(evaluation)
    }

    /// Artifacts written to CASEBATCH_OUTPUT_DIR are already in the bundle; a trace the
    /// harness names is pulled here. A failure keeps the work (verdict, scores).
    async fn collect_stage(&self, env: &AttemptEnv) -> Option<Failure> {
        let trace = harness::read_result::<harness::TraceOnly>(&env.file(attempt_files::RESULT))
            .await
            .ok()
            .flatten()
            .and_then(|r| r.trace)?;
        crate::trace::collect(&trace, &env.file(attempt_files::TRACE))
            .await
            .err()
    }

    /// What `settle` does once the job ended: evaluate and collect for a finished actor, and
    /// close a final attempt as `cleanup` would (one round trip less). Shared by `settle` and
    /// by a `start` that saw its job end ([`Self::settle_short`]).
    async fn settle_ended(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        ended: Ended,
        mut timings: StageTimings,
    ) -> Result<Settled, ActivityError> {
        let Ended {
            job,
            actor,
            close_from,
        } = ended;
        tracing::info!(status = ?actor.status, exit_code = ?actor.exit_code, "job ended");
        let finished = actor.status == ActorStatus::Finished && actor.failure.is_none();
        let (evaluation, collect_failure) = if finished && !ctx.is_cancelled() {
            // Heartbeating the job: a retry after a crash here re-attaches to it.
            let judged = self.judge(ctx, env, &job, &mut timings);
            let (evaluation, collect_failure) = heartbeating(ctx, job.clone(), judged).await;
            (Some(evaluation), collect_failure)
        } else {
            (None, None)
        };
        let mut settled = Settled {
            key: env.key.clone(),
            actor,
            evaluation,
            collect_failure,
            closed: None,
            heartbeats: 0,
        };
        if let Some(mut summary) = close_from {
            summary.apply_settled(&settled);
            if decide::is_final_when_settled(&summary) {
                summary.ended_at_ms = Some(now_ms());
                let timings = std::mem::take(&mut timings);
                let closing = Closing::of_final();
                let report = self.close(ctx, env, &summary, closing, timings).await?;
                summary.cleanup_confirmed = Some(report.cleanup_confirmed);
                settled.closed = Some(summary);
            }
        }
        timings.append_to(env);
        settled.heartbeats = ctx.sent();
        Ok(settled)
    }

    /// `start`'s watch of a job it started: up to `short.within_ms`, then either the job
    /// ended (settled here, no `settle` follows) or it runs on (`Started`, as ever). The
    /// wait only ends, never kills: a job still running is awaited by `settle` next, and a
    /// retry of this `start` after a crash finds the job by its key and watches it again.
    async fn settle_short(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        job: JobRef,
        short: &SettleShort,
    ) -> Result<StartResult, ActivityError> {
        let mut timings = StageTimings::default();
        let live = Watching {
            ctx,
            until: Instant::now() + Duration::from_millis(short.within_ms),
        };
        let awaiting = self.metrics.awaiting(env.case.runtime.as_str());
        let watched = timings.time(Stage::Await, async {
            with_runtime!(self, env, |rt| rt.await_job(env, &job, &live).await)
        });
        let actor = watched.await;
        drop(awaiting);
        if actor.status == ActorStatus::Cancelled {
            if ctx.is_cancelled() {
                return Err(ActivityError::cancelled());
            }
            // Still running: its wait so far is not a stage of its own (settle's await is).
            let heartbeats = ctx.sent();
            return Ok(StartResult::Watched { job, heartbeats });
        }
        let ended = Ended {
            job: job.clone(),
            actor,
            close_from: Some(short.close_from.clone()),
        };
        let settled = self.settle_ended(ctx, env, ended, timings).await?;
        Ok(StartResult::Settled {
            job,
            settled: Box::new(settled),
        })
    }

    /// Provision, then submit. A full runtime is waited out here, so a busy agent does not
    /// spend the case's attempts: the batch holds back what a runtime's declared envelope
    /// says, and this covers the rest (other batches, an agent's own limits).
    async fn dispatch_stage(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        timings: &mut StageTimings,
    ) -> Result<StartResult, ActivityError> {
        let failed = |n: NotStarted| StartResult::Failed {
            failure: n.failure,
            host_queue: Self::host_queue(env),
            circuit: None,
            job_may_exist: n.job_may_exist,
        };
        // Provisioned ahead (`prepare`, which kept its own timing): ready as it is.
        if journal_of(env).await.prepared.is_none() {
            let provisioned = timings
                .time(Stage::Provision, self.provision_stage(ctx, env))
                .await?;
            if let StageResult::Failed(f) = provisioned {
                return Ok(failed(f.into()));
            }
        }
        let submitted = timings.time(Stage::Submit, self.submit_until_taken(ctx, env));
        Ok(match submitted.await? {
            Ok(job) => StartResult::Started(job),
            Err(n) => failed(n),
        })
    }

    /// Submits, waiting out a full runtime (the wait counts as the submit stage's time).
    async fn submit_until_taken(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
    ) -> Result<Result<JobRef, NotStarted>, ActivityError> {
        let mut pause = FULL_FIRST_PAUSE;
        let mut waiting = false;
        loop {
            match self.submit_stage(env).await {
                Err(n) if n.failure.code == FailureCode::RuntimeFull => {
                    if !waiting {
                        waiting = true;
                        let message = format!("waiting: {}", n.failure.message);
                        Self::event(env, "runtime_full", message);
                    }
                    tokio::select! {
                        _ = ctx.cancelled() => return Err(ActivityError::cancelled()),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(FULL_MAX_PAUSE);
                }
                taken_or_failed => return Ok(taken_or_failed),
            }
        }
    }

    /// Evaluate and collect for a finished actor.
    async fn judge(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        job: &JobRef,
        timings: &mut StageTimings,
    ) -> (Evaluation, Option<Failure>) {
        let evaluated = timings.time(Stage::Evaluate, self.evaluate_stage(ctx, env, job));
        let evaluation = evaluated.await.unwrap_or_else(|e| Evaluation {
            configured: true,
            verdict: None,
            failure: Some(Failure::infra(
                Stage::Evaluate,
                FailureCode::ActivityError,
                format!("failed to record the evaluation: {e:?}"),
            )),
        });
        let collect_failure = timings.time(Stage::Collect, self.collect_stage(env)).await;
        (evaluation, collect_failure)
    }
}

/// One span per attempt: every log line of its stages carries batch, case and attempt.
fn attempt_span(env: &AttemptEnv) -> tracing::Span {
    tracing::info_span!(
        "attempt",
        batch = %env.key.batch_id,
        case = %env.case.case_id,
        attempt = env.key.attempt,
        runtime = env.case.runtime_label(),
    )
}

/// How often a working stage offers a heartbeat; [`StageContext`] sends one per the batch's
/// cadence (a few seconds by default), so a worker that dies mid-stage is noticed within
/// seconds and the stage retried elsewhere.
const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Pauses between submits to a full runtime: 1 s, growing to 5 s.
const FULL_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
const FULL_MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `work`, heartbeating `details` until it is done.
async fn heartbeating<T, D>(
    ctx: &StageContext,
    details: D,
    work: impl std::future::Future<Output = T>,
) -> T
where
    D: temporalio_common::data_converters::TemporalSerializable + Clone + 'static,
{
    tokio::pin!(work);
    let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = beat.tick() => ctx.heartbeat(details.clone()).await,
        }
    }
}

#[activities]
impl CaseActivities {
    #[activity(definition = contracts::Start)]
    pub async fn start(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: StartInput,
    ) -> Result<StartResult, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(input.key())?;
        let span = attempt_span(&env);
        async move {
            let mut timings = StageTimings::default();
            // Heartbeating throughout: the breaker's answer can take a moment too.
            let start = async {
                // A routed case consults its runtime's breaker first: an open circuit sends it
                // elsewhere before anything is provisioned.
                let breaker = self.breaker_of(&env);
                let pass = match &breaker {
                    None => None,
                    Some(of) => match self.breakers.before(of).await {
                        Ok(pass) => Some(pass),
                        Err(circuit) => {
                            let message =
                                format!("runtime {}: circuit open, not dispatched", of.runtime);
                            Self::event(&env, "circuit_open", message);
                            return Ok(StartResult::Skipped { circuit });
                        }
                    },
                };
                let mut result = self.dispatch_stage(&ctx, &env, &mut timings).await?;
                if let (Some(of), Some(pass)) = (&breaker, pass) {
                    match &mut result {
                        StartResult::Started(_) => {
                            self.breakers.after(of, pass, true).await;
                        }
                        // Only the runtime's own failures count against it.
                        StartResult::Failed {
                            failure, circuit, ..
                        } if decide::spills(failure) => {
                            *circuit = self.breakers.after(of, pass, false).await;
                        }
                        StartResult::Failed { .. }
                        | StartResult::Skipped { .. }
                        | StartResult::Watched { .. }
                        | StartResult::Settled { .. } => {}
                    }
                }
                Ok(result)
            };
            let started = heartbeating(&ctx, (), start).await;
            timings.append_to(&env);
            let started = match (started, input.settle()) {
                (Ok(StartResult::Started(job)), Some(short)) if settles_at_start(&env) => {
                    self.settle_short(&ctx, &env, job, short).await
                }
                (started, _) => started,
            };
            match &started {
                Ok(StartResult::Started(job) | StartResult::Watched { job, .. }) => {
                    tracing::info!(job = %job.marker, "started")
                }
                Ok(StartResult::Settled { job, .. }) => {
                    tracing::info!(job = %job.marker, "started and settled")
                }
                Ok(StartResult::Failed { failure, .. }) => {
                    tracing::info!(%failure, "start failed")
                }
                Ok(StartResult::Skipped { .. }) => tracing::info!("not dispatched: circuit open"),
                Err(e) => tracing::info!(error = ?e, "start raised"),
            }
            self.metrics.stage("start", began.elapsed());
            started
        }
        .instrument(span)
        .await
    }

    #[activity(definition = contracts::Settle)]
    pub async fn settle(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: SettleInput,
    ) -> Result<Settled, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(&input.key)?;
        let span = attempt_span(&env);
        async move {
            let mut timings = StageTimings::default();
            let awaiting = self.metrics.awaiting(env.case.runtime.as_str());
            let awaited = timings.time(Stage::Await, self.await_stage(&ctx, &env, input.job));
            let (job, actor) = awaited.await?;
            drop(awaiting);
            let ended = Ended {
                job,
                actor,
                close_from: input.close_from,
            };
            let settled = self.settle_ended(&ctx, &env, ended, timings).await?;
            self.metrics.stage("settle", began.elapsed());
            Ok(settled)
        }
        .instrument(span)
        .await
    }

    /// Provisions the attempt's environment while other cases run (`prepare_ahead`) and marks
    /// it prepared. A failure is reported, not raised: the attempt's `start` provisions again
    /// and fails as provision failures always do.
    #[activity(definition = contracts::Prepare)]
    pub async fn prepare(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Prepared, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(&key)?;
        let span = attempt_span(&env);
        async move {
            let host_queue = Self::host_queue(&env);
            let mut timings = StageTimings::default();
            let provisioned = timings.time(Stage::Provision, self.provision_stage(&ctx, &env));
            let provisioned = heartbeating(&ctx, (), provisioned).await?;
            timings.append_to(&env);
            let failure = match provisioned {
                StageResult::Ok => {
                    let record = PreparedRecord {
                        schema_version: RECORD_SCHEMA_VERSION.into(),
                        marker: env.marker(),
                        prepared_at_ms: now_ms(),
                    };
                    env.record(&[Entry::Prepared(Some(record))])?;
                    None
                }
                StageResult::Failed(f) => Some(f),
            };
            tracing::info!(failure = ?failure, "provisioned ahead");
            self.metrics.stage("prepare", began.elapsed());
            Ok(Prepared {
                host_queue,
                failure,
            })
        }
        .instrument(span)
        .await
    }

    /// Cleans up an environment provisioned ahead for an attempt that will not start in this
    /// run: the runtime's cleanup, its receipt kept under the case's `released/`, and the
    /// attempt's directory removed once confirmed, so the attempt starts fresh when the case
    /// runs. Nothing is recorded as an attempt.
    #[activity(definition = contracts::Release)]
    pub async fn release(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: ReleaseInput,
    ) -> Result<CleanupReport, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&input.key)?;
        let span = attempt_span(&env);
        async move {
            // Released already (this is a retry): nothing of it is left.
            if !env.dir.exists() {
                return Ok(CleanupReport {
                    cleanup_confirmed: true,
                    failure: None,
                    held_job: false,
                    heartbeats: ctx.sent(),
                });
            }
            let receipt = heartbeating(&ctx, (), async {
                with_runtime!(self, &env, |rt| rt.cleanup(&env).await)
            })
            .await;
            let confirmed = receipt.cleanup_confirmed;
            let at_ms = now_ms();
            let method = receipt.method.clone().unwrap_or_default();
            let record = ReleasedRecord {
                schema_version: RECORD_SCHEMA_VERSION.into(),
                case_id: env.case.case_id.clone(),
                attempt: env.key.attempt,
                why: input.why.clone(),
                released_at_ms: at_ms,
                receipt,
            };
            let path = env
                .bundle
                .released(&env.case.case_dir, env.key.attempt, at_ms);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            write_json_atomic(&path, &record)?;
            if confirmed {
                std::fs::remove_dir_all(&env.dir)?;
            } else {
                // Kept as evidence; the attempt provisions afresh when it runs.
                let _ = env.record(&[Entry::Prepared(None)]);
            }
            tracing::info!(why = %input.why, cleanup_confirmed = confirmed, "released unused");
            self.metrics.released(env.case.runtime.as_str());
            Self::event(
                &env,
                "prepared_released",
                format!(
                    "environment provisioned ahead, released unused ({}): cleanup {} ({method})",
                    input.why,
                    if confirmed {
                        "confirmed"
                    } else {
                        "NOT confirmed"
                    }
                ),
            );
            Ok(CleanupReport {
                cleanup_confirmed: confirmed,
                failure: None,
                held_job: false,
                heartbeats: ctx.sent(),
            })
        }
        .instrument(span)
        .await
    }

    #[activity(definition = contracts::Provision)]
    pub async fn provision(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<StageResult, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&key)?;
        self.provision_stage(&ctx, &env).await
    }

    #[activity(definition = contracts::Submit)]
    pub async fn submit(
        self: Arc<Self>,
        _ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<SubmitResult, ActivityError> {
        let env = self.env(&key)?;
        Ok(match self.submit_stage(&env).await {
            Ok(job) => SubmitResult::Started(job),
            Err(n) => SubmitResult::Failed(n.failure),
        })
    }

    #[activity(definition = contracts::AwaitJob)]
    pub async fn await_job(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: AwaitInput,
    ) -> Result<ActorReport, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&input.key)?;
        Ok(self.await_stage(&ctx, &env, input.job).await?.1)
    }

    #[activity(definition = contracts::Evaluate)]
    pub async fn evaluate(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Evaluation, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&key)?;
        // The old pipeline passes no job: the runtime finds it by the attempt's key.
        let job = with_runtime!(self, &env, |rt| rt.adopt(&env)).unwrap_or_else(|| JobRef {
            marker: env.marker(),
            pid: None,
            start_ticks: None,
            host_queue: Self::host_queue(&env),
            runtime: env.case.runtime_name.clone(),
        });
        self.evaluate_stage(&ctx, &env, &job).await
    }

    #[activity(definition = contracts::Collect)]
    pub async fn collect(
        self: Arc<Self>,
        _ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Option<Failure>, ActivityError> {
        let env = self.env(&key)?;
        Ok(self.collect_stage(&env).await)
    }

    /// `supersede`'s force-kill: every agent of the plan kills the batch's jobs at once. The
    /// cases' own cancel and cleanup still run after it (and stop local processes, which
    /// live with a worker); this only makes sure no job keeps burning compute meanwhile.
    /// Books one case start on the batch's shared pace (`rate_key`).
    #[activity(definition = contracts::ReserveStart)]
    pub async fn reserve_start(
        self: Arc<Self>,
        ctx: ActivityContext,
        ask: PaceAsk,
    ) -> Result<u64, ActivityError> {
        // Counted as an action; the ask is short and sends no heartbeat.
        let _ctx = StageContext::new(ctx, &self.metrics);
        let unanswered = |message: String| {
            ActivityError::application(ApplicationFailure::builder(message).build())
        };
        let Some(client) = &self.client else {
            return Err(unanswered(
                "this worker has no client for the shared paces".into(),
            ));
        };
        crate::pacers::reserve(client, ask)
            .await
            .map_err(unanswered)
    }

    #[activity(definition = contracts::Sweep)]
    pub async fn sweep(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: SweepInput,
    ) -> Result<SweepReport, ActivityError> {
        // Counted as an action; the sweep is short and sends no heartbeat.
        let _ctx = StageContext::new(ctx, &self.metrics);
        // The whole plan, for the sandboxes of its cases: a supersede is rare.
        let plan = Bundle::at(&input.bundle_dir)
            .read_plan()
            .map_err(unreadable_plan)?;
        let mut report = SweepReport::default();
        let agents: Vec<_> = plan
            .runtimes
            .iter()
            .filter(|(_, spec)| spec.kind == RuntimeKind::Agent)
            .collect();
        let has_agents = !agents.is_empty();
        for (name, spec) in agents {
            match self.agent.kill_batch(name, spec, &input.batch_id).await {
                Ok(keys) => report
                    .killed
                    .extend(keys.into_iter().map(|k| format!("{name}: {k}"))),
                Err(why) => report.unreachable.push(format!("{name}: {why}")),
            }
        }
        // Containers run on the engine of the host that started them: this worker kills
        // those on its engine now; elsewhere they end with their cases' cleanup, which runs
        // on their host.
        let boxed = plan
            .cases
            .iter()
            .any(|c| c.sandbox.as_ref().is_some_and(|s| s.is_container()));
        if boxed {
            match casebatch_container::gc::kill_batch(&input.batch_id, &input.bundle_dir).await {
                Ok(names) => report
                    .killed
                    .extend(names.into_iter().map(|n| format!("container: {n}"))),
                Err(why) => report.unreachable.push(format!("container engine: {why}")),
            }
        }
        let places: Vec<&str> = [
            (has_agents, "the agents"),
            (boxed, "this host's container engine"),
        ]
        .into_iter()
        .filter_map(|(swept, place)| swept.then_some(place))
        .collect();
        let message = format!(
            "superseded: {} job(s) killed on {}{}",
            report.killed.len(),
            if places.is_empty() {
                "no runtime (nothing to sweep)".to_string()
            } else {
                places.join(" and ")
            },
            if report.unreachable.is_empty() {
                String::new()
            } else {
                format!("; not reached: {}", report.unreachable.join("; "))
            }
        );
        let _ = append_jsonl(
            &Bundle::at(&input.bundle_dir).events(),
            &Event {
                ts_ms: now_ms(),
                kind: "superseded".into(),
                case_id: None,
                attempt: None,
                message,
            },
        );
        Ok(report)
    }

    #[activity(definition = contracts::Cleanup)]
    pub async fn cleanup(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: CleanupInput,
    ) -> Result<CleanupReport, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(&input.key)?;
        let span = attempt_span(&env);
        async move {
            let closing = Closing {
                will_retry: input.will_retry,
                never_submitted: input.never_submitted,
                patient: input.patient,
            };
            let report = self
                .close(&ctx, &env, &input.summary, closing, StageTimings::default())
                .await;
            self.metrics.stage("cleanup", began.elapsed());
            report
        }
        .instrument(span)
        .await
    }

    #[activity(definition = contracts::Finalize)]
    pub async fn finalize(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: FinalizeInput,
    ) -> Result<bool, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        // Reading every case's records takes seconds on a large batch: off the async
        // threads, heartbeating meanwhile (as a regular activity; a local one does not).
        let write = tokio::task::spawn_blocking(move || -> Result<bool, ActivityError> {
            let bundle = Bundle::at(&input.bundle_dir);
            let plan = bundle.read_plan_head().map_err(unreadable_plan)?;
            write_final_batch_files(&bundle, &plan, input.status.counters.temporal_actions)?;
            append_jsonl(
                &bundle.events(),
                &Event::of_batch(
                    Event::RUN_ENDED,
                    serde_json::to_string(&input.status.counts).unwrap_or_default(),
                ),
            )?;
            Ok(true)
        });
        heartbeating(&ctx, (), write).await.map_err(|e| {
            let message = format!("the closing write of the batch files stopped: {e}");
            ActivityError::application(ApplicationFailure::builder(message).build())
        })?
    }
}

/// How an attempt is closed (from `cleanup`'s input; a `settle` closes only final attempts).
#[derive(Debug, Clone, Copy)]
struct Closing {
    will_retry: bool,
    /// Its `start` never reached the runtime: nothing to stop or ask there.
    never_submitted: bool,
    /// Its runtime did not answer for its job: wait for it longer (up to `UNANSWERED_WAIT_S`).
    patient: bool,
}

impl Closing {
    fn of_final() -> Self {
        Self {
            will_retry: false,
            never_submitted: false,
            patient: false,
        }
    }
}

impl CaseActivities {
    /// The runtime's cleanup of the attempt, or the receipt of one that never reached it.
    async fn runtime_cleanup(&self, env: &AttemptEnv, closing: Closing) -> CleanupReceipt {
        // A remote runtime never reached holds nothing: asking it would only wait out its
        // grace. Local runtimes clean up what provisioning made here all the same.
        if closing.never_submitted && env.case.runtime == RuntimeKind::Agent {
            return CleanupReceipt {
                schema_version: RECORD_SCHEMA_VERSION.into(),
                marker: env.marker(),
                cleanup_confirmed: true,
                killed: Vec::new(),
                remaining: Vec::new(),
                scans: 0,
                message: format!(
                    "runtime `{}` holds nothing of this attempt: its submit never reached it \
                     (no connection), or it refused the job",
                    env.case.runtime_label()
                ),
                method: Some("not_submitted".into()),
                checks: vec!["not_submitted".into()],
                escaped: Vec::new(),
                held_job: Some(false),
                containers: Vec::new(),
            };
        }
        if closing.patient {
            // Five times the runtime's own patience (at most `UNANSWERED_WAIT_S`, all of it
            // when it declares none): long enough to ride out what made it stop answering.
            let declared = env
                .runtime_spec
                .as_ref()
                .and_then(|s| s.unreachable_grace_s);
            let patience =
                declared.map_or(UNANSWERED_WAIT_S, |g| (5 * g).clamp(10, UNANSWERED_WAIT_S));
            let env = env.clone().with_unreachable_grace(patience);
            return with_runtime!(self, &env, |rt| rt.cleanup(&env).await);
        }
        with_runtime!(self, env, |rt| rt.cleanup(env).await)
    }

    /// Kills what is left of the attempt, writes its receipt and its record, and (unless it
    /// is evidence only: a speculation's loser, a stranded attempt) the case's result: the
    /// end of every attempt, by `cleanup` or by a `settle` that closed a final attempt. Safe
    /// to run again (a retry): the attempt is logged once per distinct record.
    async fn close(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        s: &AttemptSummary,
        closing: Closing,
        mut timings: StageTimings,
    ) -> Result<CleanupReport, ActivityError> {
        let will_retry = closing.will_retry;
        bundle_write(ctx, Stage::Cleanup, || make_dir(&env.dir)).await?;
        let cleaned = timings.time(Stage::Cleanup, self.runtime_cleanup(env, closing));
        let receipt = heartbeating(ctx, (), cleaned).await;
        let held_job = receipt.held_job == Some(true);
        let confirmed = receipt.cleanup_confirmed;

        let record = AttemptRecord {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            case_id: env.case.case_id.clone(),
            summary: s.clone(),
            cleanup_confirmed: confirmed,
            will_retry,
            runtime: env.case.runtime.as_str().into(),
            runtime_name: env.case.runtime_name.clone(),
            held_job: receipt.held_job,
            stages: Vec::new(),
        };
        // Cleanup can run more than once for an attempt (an activity retry, or a local
        // activity re-run on replay): log an attempt only once per distinct record (its
        // timings aside: each run of cleanup has its own).
        let journal = journal_of(env).await;
        let already_logged = journal.record.as_ref().is_some_and(|p| {
            AttemptRecord {
                stages: Vec::new(),
                ..p.clone()
            } == record
        });
        let record = AttemptRecord {
            stages: timings.with_recorded(journal.stages.clone()),
            ..record
        };
        // The receipt and the record, in one write.
        let unconfirmed_why = receipt.message.clone();
        let closed = [Entry::Cleanup(receipt), Entry::Record(record)];
        bundle_write(ctx, Stage::Cleanup, || env.record(&closed)).await?;
        let end = |outcome| AttemptEnd {
            outcome,
            failure_class: s.failure.as_ref().map(|f| f.class.as_str()),
            failure_code: s.failure.as_ref().map(|f| f.code.as_str()),
            is_final: !will_retry,
            adopted: s.adopted,
            cleanup_confirmed: confirmed,
            runtime: env.case.runtime.as_str(),
            duration: s.duration_ms().map(std::time::Duration::from_millis),
        };
        // Evidence, never the case's result: the attempt that counts writes that.
        if s.is_evidence_only() {
            if !already_logged {
                let (outcome, what) = if s.speculative_loser {
                    (
                        "speculative_loser",
                        "speculative loser: stopped, the other copy counts".to_string(),
                    )
                } else {
                    let found = if held_job {
                        "its runtime answered holding the job (stopped; paid for twice)"
                    } else {
                        "its runtime answered holding nothing of it"
                    };
                    (
                        "stranded",
                        format!("stranded while the case moved on: {found}"),
                    )
                };
                self.metrics.attempt_closed(end(outcome));
                let unconfirmed = if confirmed {
                    ""
                } else {
                    "; cleanup NOT confirmed"
                };
                Self::event(env, "attempt_finished", format!("{what}{unconfirmed}"));
            }
            return Ok(CleanupReport {
                cleanup_confirmed: confirmed,
                failure: None,
                held_job,
                heartbeats: ctx.sent(),
            });
        }

        // The one full parse of the harness's result: its outputs and scores move into the
        // case result.
        let harness_result =
            harness::read_result::<harness::HarnessResult>(&env.file(attempt_files::RESULT))
                .await
                .ok()
                .flatten()
                .unwrap_or_default();
        let mut scores = harness_result.scores;
        if let Some(e) = &journal.evaluation {
            scores.extend(e.scores.clone());
        }
        let state = if will_retry {
            casebatch_bundle::CaseRecordState::Retrying
        } else {
            decide::attempt_state(s).into()
        };
        let result = CaseResult {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            case_id: env.case.case_id.clone(),
            case_dir: env.case.case_dir.clone(),
            state,
            attempts: s.attempt,
            actor_status: s.actor,
            exit_code: s.exit_code,
            evaluation_configured: s.evaluation_configured,
            verdict: s.verdict,
            cleanup_confirmed: confirmed,
            // A failed trace pull is what keeps an otherwise verified case from passing.
            failure: s.failure.clone().or_else(|| s.collect_failure.clone()),
            collect_failure: s.collect_failure.clone(),
            adopted: s.adopted,
            // An agent's job record is fetched with the attempt's files.
            job_starts: match env.case.runtime {
                RuntimeKind::LocalProcess | RuntimeKind::Agent => {
                    LocalProcess::recorded_starts(env)
                }
                RuntimeKind::Fake => None,
            },
            scores,
            trace_ref: harness_result.trace.clone(),
            outputs: harness_result.outputs,
            simulated: env.case.runtime == RuntimeKind::Fake,
            memory_boost_mb: s.memory_boost_mb,
            origin: read_json::<casebatch_bundle::Lineage>(&env.bundle.lineage())
                .ok()
                .map(|l| casebatch_bundle::Origin {
                    retry_of: l.retry_of,
                    carried: false,
                    recollected: false,
                }),
            runtime: Some(env.case.runtime_label().to_owned()),
        };
        let result_path = env.bundle.case_result(&env.case.case_dir);
        bundle_write(ctx, Stage::Cleanup, || {
            write_json_atomic(&result_path, &result)
        })
        .await?;
        let simulated = if result.simulated { " (simulated)" } else { "" };
        if !already_logged {
            tracing::info!(
                state = state.as_str(),
                cleanup_confirmed = confirmed,
                "attempt closed"
            );
            self.metrics.attempt_closed(end(state.as_str()));
            if let Some(u) = &s.usage {
                let (input, output) = (u.get(Usage::INPUT_TOKENS), u.get(Usage::OUTPUT_TOKENS));
                self.metrics.usage(input, output, u.cost_usd());
            }
            Self::event(
                env,
                "attempt_finished",
                format!(
                    "{}{simulated}: {}{}",
                    state.as_str(),
                    s.failure
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_else(|| "ok".into()),
                    if confirmed {
                        ""
                    } else {
                        "; cleanup NOT confirmed"
                    }
                ),
            );
        }
        Ok(CleanupReport {
            cleanup_confirmed: confirmed,
            held_job,
            heartbeats: ctx.sent(),
            failure: (!confirmed).then(|| {
                Failure::infra(
                    Stage::Cleanup,
                    FailureCode::CleanupUnconfirmed,
                    unconfirmed_why.clone(),
                )
            }),
        })
    }
}
