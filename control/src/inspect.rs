//! Looking at a batch: live status (from the workflow when it runs, else from its last result
//! or the bundle), the report (from the bundle alone), and the raw history.

use casebatch_proto::CaseState;
use std::path::Path;
use std::time::{Duration, Instant};

use casebatch_attempt::{AttemptJournal, ScheduledState};
use casebatch_bundle::{
    AttemptRecord, BatchSummary, Bundle, CaseResult, summary, write_assembled, write_bytes_atomic,
};
use casebatch_manifest::{Plan, PlanHead};
use casebatch_proto::{BatchEnd, BatchStatus, Counts, FailureCode, Phase, workflow_id};
use casebatch_views::{QueuedCase, StatusSource};
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{
    WorkflowExecutionInfo, WorkflowFetchHistoryOptions, WorkflowGetResultOptions, WorkflowHandle,
};

use crate::error::{ControlError, Result};
use crate::location::{Attached, BatchLocation, EngineChoice};
use crate::pollers::{Workers, workers};
use crate::workflow::{Handle, Presence, presence as presence_of, query_status};

/// How long a status query may take before the bundle's view is shown instead.
const QUERY_WAIT: Duration = Duration::from_secs(5);
/// How long one status query may take before it is asked again (within [`QUERY_WAIT`]).
const QUERY_TRY: Duration = Duration::from_secs(2);
/// The pause before a refused or unanswered status query is asked again.
const QUERY_AGAIN_AFTER: Duration = Duration::from_millis(100);
/// How long a status query runs alone before a second one is asked beside it (see
/// [`hedged_query`]). A live batch answers in milliseconds; the run's end waits longer.
const QUERY_HEDGE_AFTER: Duration = Duration::from_millis(300);

/// A batch's status and where it came from.
#[derive(Debug)]
pub struct StatusView {
    pub plan: PlanHead,
    pub status: BatchStatus,
    /// The workflow is running (the status may still come from the bundle when no worker
    /// answers the query).
    pub live: bool,
    /// How the last run ended, when it ended with a result.
    pub end: Option<BatchEnd>,
    /// Where the status was read.
    pub source: StatusSource,
    /// Cases in flight whose job waits in a cluster scheduler's queue.
    pub queued: Vec<QueuedCase>,
}

pub async fn status(location: &BatchLocation, engine: &EngineChoice) -> Result<StatusView> {
    let Attached {
        bundle,
        plan,
        handle,
        mut presence,
        // Held to the end: dropping the engine stops an embedded server this command started.
        engine: _engine,
        ..
    } = location.attach(engine).await?;
    let deadline = Instant::now() + QUERY_WAIT;
    let mut live = None;
    // A query no worker can answer is not waited for: the batch's runner is gone (stopped, or
    // killed), and the workflow waits for one to come back.
    let mut unworked = presence == Presence::Running && workers(&handle).await == Workers::Gone;
    while presence == Presence::Running && !unworked && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let asked = hedged_query(&handle, &bundle, &plan);
        match tokio::time::timeout(left.min(QUERY_TRY), asked).await {
            Ok(Ok(s)) => {
                live = Some(s);
                break;
            }
            // Refused or unanswered: asked again of whichever run is the batch's now, once
            // that is proven again. The server refuses a query at once while it holds another
            // behind the workflow task in flight (it holds one; the runner's own progress
            // queries take it), and a query held as its run continues as new can wait on a
            // run that is over. No answer at all (no worker) ends in the bundle's view.
            // A runner that was still exiting when first looked at is gone by now.
            Ok(Err(_)) | Err(_) => {
                tokio::time::sleep(QUERY_AGAIN_AFTER).await;
                presence = presence_of(&handle, &bundle, &plan).await?;
                unworked = presence == Presence::Running && workers(&handle).await == Workers::Gone;
            }
        }
    }
    let running = presence == Presence::Running;
    let bundle_view = |phase| Ok::<_, ControlError>((from_bundle(&bundle, &plan, phase)?, None));
    let ((status, end), source) = match live {
        Some(s) => ((s, None), StatusSource::Workflow),
        None if running && unworked => (bundle_view(Phase::Running)?, StatusSource::NoWorker),
        None if running => (bundle_view(Phase::Running)?, StatusSource::Bundle),
        None => match handle.get_result(WorkflowGetResultOptions::default()).await {
            Ok(o) => ((o.status, Some(o.end)), StatusSource::Result),
            Err(_) => (bundle_view(Phase::Finished)?, StatusSource::Bundle),
        },
    };
    let queued = queued_cases(&bundle, &plan, &status.in_flight);
    Ok(StatusView {
        plan,
        status,
        live: running,
        end,
        source,
        queued,
    })
}

/// The cases of `in_flight` whose latest attempt's job a scheduler holds pending, as its
/// journal last recorded it (the wait keeps the record in step with the scheduler's).
fn queued_cases(bundle: &Bundle, plan: &PlanHead, in_flight: &[u32]) -> Vec<QueuedCase> {
    in_flight
        .iter()
        .filter_map(|&i| {
            let case = plan.cases.get(i as usize)?;
            let attempts = bundle.case(&case.case_dir).join("attempts");
            let attempt = std::fs::read_dir(&attempts)
                .ok()?
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .max()?;
            let journal = AttemptJournal::read(&bundle.attempt(&case.case_dir, attempt)).ok()?;
            let job = journal.job.as_ref()?.scheduled()?;
            (job.state == ScheduledState::Pending).then(|| QueuedCase {
                case_id: case.case_id.clone(),
                attempt,
                scheduler: job.scheduler.clone(),
                job_id: job.job_id.clone(),
                reason: job.reason.clone(),
                submitted_at_ms: job.submitted_at_ms,
            })
        })
        .collect()
}

/// The batch's live status: the first answer of a query and, when it takes longer than
/// [`QUERY_HEDGE_AFTER`], of a second one asked of the batch's run as it is then (proven
/// again). A query asked as the run continues as new is answered by that run once the worker
/// has replayed it, about a second at 20,000 events; the second ask reaches the new run.
async fn hedged_query(handle: &Handle, bundle: &Bundle, plan: &PlanHead) -> Result<BatchStatus> {
    let first = query_status(handle);
    tokio::pin!(first);
    tokio::select! {
        answered = &mut first => return answered,
        () = tokio::time::sleep(QUERY_HEDGE_AFTER) => {}
    }
    if presence_of(handle, bundle, plan).await? != Presence::Running {
        return first.await;
    }
    let second = query_status(handle);
    tokio::pin!(second);
    // The first answer wins; a refusal waits for the other ask.
    tokio::select! {
        a = &mut first => match a {
            Ok(status) => Ok(status),
            Err(_) => second.await,
        },
        b = &mut second => match b {
            Ok(status) => Ok(status),
            Err(_) => first.await,
        },
    }
}

/// Status as the bundle's per-case records show it.
fn from_bundle(bundle: &Bundle, plan: &PlanHead, phase: Phase) -> Result<BatchStatus> {
    let counts = summary::count_states(bundle, plan)?;
    let get = |state| counts.get(&state).map_or(0, |n| *n as u32);
    Ok(BatchStatus {
        batch_id: plan.batch_id.clone(),
        phase,
        counts: Counts {
            queued: get(CaseState::Queued) + get(CaseState::Retrying) + get(CaseState::Running),
            running: 0,
            succeeded: get(CaseState::Succeeded),
            failed: get(CaseState::Failed),
            cancelled: get(CaseState::Cancelled),
        },
        concurrency: plan.settings.concurrency,
        ..BatchStatus::default()
    })
}

/// The batch's report, rebuilt from its per-case records (the batch files are rewritten).
#[derive(Debug)]
pub struct ReportView {
    pub plan: Plan,
    pub summary: BatchSummary,
    /// Each case's latest result, in plan order (`None`: no attempt finished).
    pub results: Vec<Option<CaseResult>>,
    /// Every attempt record, in case order (what the HTML report plots).
    pub attempts: Vec<AttemptRecord>,
    /// The bundle's root directory (what the HTML report links into).
    pub bundle_root: std::path::PathBuf,
    /// Attempts whose job was lost with nothing to adopt, so the case was run again.
    pub redispatched: usize,
}

/// Needs no engine: the bundle is the source of truth.
pub fn report(location: &BatchLocation) -> Result<ReportView> {
    let (bundle, plan) = location.open()?;
    let assembled = summary::assemble(&bundle, &plan)?;
    write_assembled(&bundle, &plan, &assembled)?;
    let redispatched = assembled
        .attempts
        .iter()
        .filter(|a| {
            a.summary
                .failure
                .as_ref()
                .is_some_and(|f| f.code == FailureCode::JobLost)
        })
        .count();
    Ok(ReportView {
        plan,
        summary: assembled.summary,
        results: assembled.results,
        attempts: assembled.attempts,
        bundle_root: bundle.root().to_path_buf(),
        redispatched,
    })
}

/// Whose history: the batch's, or a shared workflow its plan names.
#[derive(Debug, Clone, Copy)]
pub enum HistoryOf<'a> {
    Batch,
    /// The circuit breaker of this runtime of the plan.
    Breaker(&'a str),
    /// The shared pace of the plan's `rate_key`.
    Pace,
    /// The slots of this shared runtime (an agent) of the plan.
    Slots(&'a str),
}

/// Writes a run's history as JSON (the latest run unless `run_id` names one); returns the
/// workflow id.
pub async fn history(
    location: &BatchLocation,
    engine: &EngineChoice,
    run_id: Option<String>,
    of: HistoryOf<'_>,
    out: &Path,
) -> Result<String> {
    let Attached { plan, engine, .. } = location.attach(engine).await?;
    let wid = match of {
        HistoryOf::Batch => workflow_id(&plan.batch_id),
        // Only the shared workflows this batch's plan names.
        HistoryOf::Pace => plan
            .settings
            .rate
            .as_ref()
            .and_then(|r| r.rate_key.as_deref())
            .map(casebatch_proto::pace::pacer_workflow_id)
            .ok_or(ControlError::BadArgument {
                what: "--pace",
                value: plan.batch_id.clone(),
                hint: "the batch's plan names no defaults.rate.rate_key",
            })?,
        HistoryOf::Slots(name) => (plan.runtimes.get(name))
            .and_then(|spec| spec.endpoint.as_deref())
            .map(|e| casebatch_proto::share::slots_workflow_id(e.trim().trim_end_matches('/')))
            .ok_or(ControlError::BadArgument {
                what: "--slots",
                value: name.to_string(),
                hint: "name an agent of the batch's runtimes table",
            })?,
        HistoryOf::Breaker(name) => plan
            .breaker_id(name, &casebatch_attempt::hostname())
            .ok_or(ControlError::BadArgument {
                what: "--breaker",
                value: name.to_string(),
                hint: "name a runtime of the batch's plan (its runtimes table, local-process or fake)",
            })?,
    };
    let info = WorkflowExecutionInfo::builder()
        .namespace(engine.namespace.clone())
        .workflow_id(wid.clone())
        .maybe_run_id(run_id)
        .build();
    let handle: WorkflowHandle<_, BatchWorkflow> = WorkflowHandle::new(engine.client.clone(), info);
    let json = handle
        .fetch_history(WorkflowFetchHistoryOptions::default())
        .to_json()
        .await
        .map_err(|e| ControlError::engine_call("fetch the history", e))?;
    write_bytes_atomic(out, &json)?;
    Ok(wid)
}
