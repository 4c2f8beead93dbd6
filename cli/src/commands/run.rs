//! `batch run` and `batch resume`: prepare the bundle, connect to the engine (starting the
//! embedded one if needed), host a worker, start or re-attach to the batch's workflow, show
//! progress until the run ends, and map its outcome to an exit code.

use std::path::Path;
use std::time::{Duration, Instant};

use casebatch_bundle::{Bundle, CaseRecordState, RECORD_SCHEMA_VERSION, write_json_atomic};
use casebatch_manifest::Plan;
use casebatch_proto::{
    BatchEnd, BatchInput, BatchOutcome, BatchStatus, Carried, CaseSlot, CaseState, TASK_QUEUE,
    workflow_id,
};
use casebatch_worker::{Engine, build_worker, run_worker_until};
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{
    Client, WorkflowDescribeOptions, WorkflowExecutionStatus, WorkflowGetResultOptions,
    WorkflowHandle, WorkflowQueryOptions, WorkflowStartOptions,
    errors::{WorkflowGetResultError, WorkflowInteractionError},
};

use super::{absolute, check_batch_id, engine_target, manifest};
use crate::cli::{EngineArgs, RerunArgs, ResumeArgs, RunArgs, SingleRunArgs};
use crate::exit::{CliError, CliResult, Exit};
use crate::render::Progress;

/// How long the runner waits for an unreachable engine before giving up (exit 3).
const ENGINE_OUTAGE: Duration = Duration::from_secs(600);

/// Linear backoff step between attempts of a case.
const RETRY_BACKOFF_MS: u64 = 1_000;

/// Writes the bundle's input files, refusing a different task list under an existing id.
pub fn prepare_bundle(
    bundle: &Bundle,
    plan: &Plan,
    manifest_path: &Path,
    engine: Option<&Engine>,
) -> CliResult<()> {
    if bundle.exists() {
        let existing = bundle.read_plan()?;
        if existing.fingerprint != plan.fingerprint {
            return Err(CliError::usage(format!(
                "failed to start batch {}: {} already holds a different task list (plan fingerprint {} vs {}). A new task list belongs in a new batch: pass another --batch-id",
                plan.batch_id,
                bundle.root().display(),
                short(&existing.fingerprint),
                short(&plan.fingerprint)
            )));
        }
    }
    std::fs::create_dir_all(bundle.root()).map_err(|e| {
        CliError::usage(format!("failed to create {}: {e}", bundle.root().display()))
    })?;
    let raw = std::fs::read_to_string(manifest_path).unwrap_or_default();
    write_json_atomic(
        &bundle.manifest(),
        &serde_json::json!({
            "schema_version": RECORD_SCHEMA_VERSION,
            "path": plan.provenance.manifest_path,
            "sha256": plan.provenance.manifest_sha256,
            "format": plan.provenance.format,
            "content": raw,
        }),
    )?;
    write_json_atomic(&bundle.plan(), plan)?;
    if let Some(engine) = engine {
        // Never a secret: only where the engine is, not how to authenticate to it.
        write_json_atomic(
            &bundle.run_config(),
            &serde_json::json!({
                "schema_version": RECORD_SCHEMA_VERSION,
                "batch_id": plan.batch_id,
                "casebatch_version": env!("CARGO_PKG_VERSION"),
                "engine": {
                    "mode": if engine.embedded.is_some() { "embedded" } else { "cluster" },
                    "address": engine.address,
                    "namespace": engine.namespace,
                    "task_queue": TASK_QUEUE,
                    "workflow_id": workflow_id(&plan.batch_id),
                },
                "settings": plan.settings,
                "retry_backoff_ms": RETRY_BACKOFF_MS,
            }),
        )?;
    }
    Ok(())
}

fn short(s: &str) -> &str {
    &s[..s.len().min(12)]
}

pub async fn run(args: RunArgs) -> CliResult {
    let plan = manifest::load(&args.manifest)?;
    let root = absolute(&args.output_dir)?;
    let bundle = Bundle::new(&root, &plan.batch_id);
    if args.dry_run {
        prepare_bundle(&bundle, &plan, &args.manifest.manifest, None)?;
        for w in &plan.warnings {
            eprintln!("warning: {w}");
        }
        say!(
            "dry run: planned {} case(s) into {}; nothing executed",
            plan.cases.len(),
            bundle.plan().display()
        );
        return Ok(Exit::Success);
    }
    prepare_bundle(&bundle, &plan, &args.manifest.manifest, None)?;
    let engine = connect(&root, &args.engine).await?;
    prepare_bundle(&bundle, &plan, &args.manifest.manifest, Some(&engine))?;
    let opts = DriveOptions {
        history_budget: args.history_budget,
        ..DriveOptions::default()
    };
    execute(engine, &bundle, &plan, args.no_worker, opts).await
}

/// One case on its own: a one-case batch, so it is resumed (and its job adopted) the same way.
pub async fn run_one(args: SingleRunArgs) -> CliResult {
    let mut plan = manifest::load(&args.manifest)?;
    let Some(mut case) = plan
        .cases
        .iter()
        .find(|c| c.case_id == args.case_id)
        .cloned()
    else {
        return Err(CliError::usage(format!(
            "failed to find case {:?} in {}: use one of its task ids",
            args.case_id,
            args.manifest.manifest.display()
        )));
    };
    case.index = 0;
    plan.batch_id = format!("{}--{}", plan.batch_id, case.case_dir);
    plan.cases = vec![case];
    plan.fingerprint = format!("{}:{}", plan.fingerprint, args.case_id);
    let root = absolute(&args.output_dir)?;
    let bundle = Bundle::new(&root, &plan.batch_id);
    prepare_bundle(&bundle, &plan, &args.manifest.manifest, None)?;
    let engine = connect(&root, &args.engine).await?;
    prepare_bundle(&bundle, &plan, &args.manifest.manifest, Some(&engine))?;
    execute(engine, &bundle, &plan, false, DriveOptions::default()).await
}

pub async fn rerun(args: RerunArgs) -> CliResult {
    let requeue = if args.all {
        Requeue::All
    } else if args.failed {
        Requeue::Failed
    } else {
        Requeue::Cases(args.case.clone())
    };
    let resume = ResumeArgs {
        batch: args.batch,
        no_worker: args.no_worker,
        retry_failed: false,
    };
    resume_with(resume, requeue).await
}

pub async fn resume(args: ResumeArgs) -> CliResult {
    let requeue = if args.retry_failed {
        Requeue::Failed
    } else {
        Requeue::None
    };
    resume_with(args, requeue).await
}

async fn resume_with(args: ResumeArgs, requeue: Requeue) -> CliResult {
    check_batch_id(&args.batch.batch_id)?;
    let root = absolute(&args.batch.output_dir)?;
    let bundle = Bundle::new(&root, &args.batch.batch_id);
    if !bundle.exists() {
        return Err(CliError::usage(format!(
            "failed to resume batch {}: no bundle at {} (check --batch-id and --output-dir)",
            args.batch.batch_id,
            bundle.root().display()
        )));
    }
    // Resume uses the saved plan, never a re-read manifest.
    let plan = bundle.read_plan()?;
    if let Requeue::Cases(ids) = &requeue
        && let Some(unknown) = ids
            .iter()
            .find(|id| !plan.cases.iter().any(|c| &c.case_id == *id))
    {
        return Err(CliError::usage(format!(
            "failed to rerun case {unknown:?}: batch {} has no such case",
            plan.batch_id
        )));
    }
    let engine = connect(&root, &args.batch.engine).await?;
    let opts = DriveOptions {
        requeue,
        ..DriveOptions::default()
    };
    execute(engine, &bundle, &plan, args.no_worker, opts).await
}

pub async fn connect(root: &Path, e: &EngineArgs) -> CliResult<Engine> {
    Ok(Engine::connect(&engine_target(root, e)).await?)
}

#[derive(Debug, Default, Clone)]
pub struct DriveOptions {
    history_budget: Option<u32>,
    /// Finished cases to give a new attempt (rerun, resume --retry-failed).
    requeue: Requeue,
}

/// Which finished cases get a new attempt; their earlier attempts stay in the bundle.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum Requeue {
    #[default]
    None,
    Failed,
    Cases(Vec<String>),
    All,
}

impl Requeue {
    fn apply(&self, plan: &Plan, slots: &mut [CaseSlot]) -> usize {
        let mut n = 0;
        for (case, slot) in plan.cases.iter().zip(slots.iter_mut()) {
            let pick = match self {
                Requeue::None => false,
                Requeue::Failed => {
                    matches!(slot.state, CaseState::Failed | CaseState::Cancelled)
                }
                Requeue::Cases(ids) => ids.contains(&case.case_id),
                Requeue::All => true,
            };
            if pick && slot.state.is_terminal() {
                slot.state = CaseState::Queued;
                n += 1;
            }
        }
        n
    }
}

pub async fn execute(
    mut engine: Engine,
    bundle: &Bundle,
    plan: &Plan,
    no_worker: bool,
    opts: DriveOptions,
) -> CliResult {
    let client = engine.client.clone();
    let outcome = if no_worker {
        drive(&client, bundle, plan, opts).await?
    } else {
        let runtime = temporalio_sdk::Runtime::from_current_tokio(Default::default())
            .map_err(|e| CliError::engine(format!("failed to start the worker runtime: {e}")))?;
        let mut worker = build_worker(&runtime, client.clone())
            .map_err(|e| CliError::engine(format!("failed to build the worker: {e}")))?;
        run_worker_until(&mut worker, drive(&client, bundle, plan, opts))
            .await
            .map_err(|e| CliError::engine(format!("the worker failed: {e}")))??
    };
    if let Some(server) = engine.embedded.as_mut() {
        server.stop();
    }
    let Some(outcome) = outcome else {
        // Already complete: nothing was started.
        return report_existing(bundle, plan);
    };
    crate::render::outcome(bundle, plan, &outcome);
    Ok(exit_for(&outcome))
}

/// The exit code a finished run deserves.
pub fn exit_for(o: &BatchOutcome) -> Exit {
    let c = &o.status.counts;
    match o.end {
        BatchEnd::Drained if c.queued > 0 => Exit::Incomplete,
        BatchEnd::Cancelled => Exit::Failures,
        _ if c.succeeded == c.total() => Exit::Success,
        _ => Exit::Failures,
    }
}

fn report_existing(bundle: &Bundle, plan: &Plan) -> CliResult {
    let summary = casebatch_bundle::write_batch_files(bundle, plan)?;
    let ok = summary.counts.get("succeeded").copied().unwrap_or(0);
    say!(
        "batch {} is already complete: {ok}/{} succeeded; nothing re-run",
        plan.batch_id,
        summary.total
    );
    Ok(if ok == summary.total {
        Exit::Success
    } else {
        Exit::Failures
    })
}

type Handle = WorkflowHandle<Client, BatchWorkflow>;

/// Starts the workflow (or re-attaches to the running one), shows progress, returns the
/// outcome. `None` when the batch was already complete and nothing was started.
async fn drive(
    client: &Client,
    bundle: &Bundle,
    plan: &Plan,
    opts: DriveOptions,
) -> CliResult<Option<BatchOutcome>> {
    let wid = workflow_id(&plan.batch_id);
    let handle: Handle = client.get_workflow_handle(wid.clone());
    let running = match handle.describe(WorkflowDescribeOptions::default()).await {
        Ok(d) => d.status() == WorkflowExecutionStatus::Running,
        Err(WorkflowInteractionError::NotFound(_)) => false,
        Err(e) => {
            return Err(CliError::engine(format!(
                "failed to look up workflow {wid}: {e}"
            )));
        }
    };
    let mut progress = Progress::new(plan);
    if running && opts.requeue != Requeue::None {
        return Err(CliError::usage(format!(
            "failed to rerun cases of batch {}: it is still running; wait for it or drain it",
            plan.batch_id
        )));
    }
    if running {
        progress.line(&format!("re-attaching to running batch {}", plan.batch_id));
    } else {
        let mut carried = carried_state(&handle, bundle, plan).await?;
        if let Some(c) = carried.as_mut() {
            let n = opts.requeue.apply(plan, &mut c.slots);
            if n > 0 {
                progress.line(&format!("{n} finished case(s) get a new attempt"));
            }
        }
        if let Some(c) = &carried
            && c.slots.iter().all(|s| s.state.is_terminal())
        {
            return Ok(None);
        }
        let input = BatchInput {
            batch_id: plan.batch_id.clone(),
            bundle_dir: bundle.root().display().to_string(),
            fingerprint: plan.fingerprint.clone(),
            case_count: plan.cases.len() as u32,
            concurrency: plan.settings.concurrency,
            max_retries: plan.settings.max_retries,
            retry_backoff_ms: RETRY_BACKOFF_MS,
            max_timeout_seconds: plan
                .cases
                .iter()
                .map(|c| c.timeout_seconds)
                .max()
                .unwrap_or(600),
            carried,
            history_budget: opts.history_budget,
            oom_auto_boost: plan.settings.oom_auto_boost,
            memory_boosts: memory_boosts(bundle, plan),
        };
        let start = WorkflowStartOptions::new(TASK_QUEUE, wid.clone()).build();
        client
            .start_workflow(BatchWorkflow::run, input, start)
            .await
            .map_err(|e| CliError::engine(format!("failed to start workflow {wid}: {e}")))?;
        progress.line(&format!(
            "batch {}: {} case(s), concurrency {}, workflow {wid}",
            plan.batch_id,
            plan.cases.len(),
            plan.settings.concurrency
        ));
    }

    // The engine may restart under us (the embedded server is supervised): transient RPC
    // errors mean "wait and ask again", for up to ENGINE_OUTAGE.
    let mut result = Box::pin(handle.get_result(WorkflowGetResultOptions::default()));
    let mut outage_since: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            r = &mut result => match r {
                Ok(outcome) => {
                    progress.finish();
                    return Ok(Some(outcome));
                }
                Err(e @ (WorkflowGetResultError::Rpc(_) | WorkflowGetResultError::Other(_)))
                    if outage_since.is_none_or(|t| t.elapsed() < ENGINE_OUTAGE) =>
                {
                    if outage_since.is_none() {
                        progress.line(&format!("engine unreachable ({e}); waiting for it to come back"));
                        outage_since = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    result = Box::pin(handle.get_result(WorkflowGetResultOptions::default()));
                }
                Err(e) => {
                    progress.finish();
                    return Err(CliError::engine(format!("batch workflow {wid} did not complete: {e}")));
                }
            },
            _ = tick.tick() => {
                if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), query_status(&handle)).await {
                    if outage_since.take().is_some() {
                        progress.line("engine reachable again");
                    }
                    progress.update(&s);
                }
            }
        }
    }
}

/// Per-case memory granted by `retry-failed` (from lineage.json), by case index.
fn memory_boosts(bundle: &Bundle, plan: &Plan) -> std::collections::BTreeMap<u32, u64> {
    let Ok(lineage) = casebatch_bundle::read_json::<casebatch_bundle::Lineage>(&bundle.lineage())
    else {
        return Default::default();
    };
    plan.cases
        .iter()
        .filter_map(|c| {
            lineage
                .memory_boost_mb
                .get(&c.case_id)
                .map(|mb| (c.index, *mb))
        })
        .collect()
}

pub async fn query_status(handle: &Handle) -> Result<BatchStatus, String> {
    handle
        .query(BatchWorkflow::status, (), WorkflowQueryOptions::default())
        .await
        .map_err(|e| e.to_string())
}

/// State to start a new run from: the last run's result, or (if that run was terminated
/// or failed and left no result) the per-case records in the bundle.
async fn carried_state(
    handle: &Handle,
    bundle: &Bundle,
    plan: &Plan,
) -> CliResult<Option<Carried>> {
    match handle.describe(WorkflowDescribeOptions::default()).await {
        Err(WorkflowInteractionError::NotFound(_)) => return Ok(carried_from_bundle(bundle, plan)),
        Err(e) => {
            return Err(CliError::engine(format!(
                "failed to look up the batch: {e}"
            )));
        }
        Ok(_) => {}
    }
    match handle.get_result(WorkflowGetResultOptions::default()).await {
        Ok(prev) => Ok(Some(Carried {
            slots: prev.slots,
            counters: prev.status.counters,
            timeline: prev.status.timeline,
            paused: false,
            segment: prev.status.segment,
        })),
        Err(_) => Ok(carried_from_bundle(bundle, plan)),
    }
}

fn carried_from_bundle(bundle: &Bundle, plan: &Plan) -> Option<Carried> {
    let mut any = false;
    let slots = plan
        .cases
        .iter()
        .map(|c| {
            let r: Option<casebatch_bundle::CaseResult> =
                casebatch_bundle::read_json(&bundle.case_result(&c.case_dir)).ok();
            let Some(r) = r else {
                return CaseSlot::default();
            };
            any = true;
            let state = match r.state {
                CaseRecordState::Succeeded => CaseState::Succeeded,
                CaseRecordState::Failed => CaseState::Failed,
                CaseRecordState::Cancelled => CaseState::Cancelled,
                _ => CaseState::Queued,
            };
            CaseSlot {
                state,
                attempts: r.attempts,
            }
        })
        .collect();
    any.then(|| Carried {
        slots,
        ..Carried::default()
    })
}
