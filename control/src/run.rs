//! Running batches: validate, plan, run, a single case, resume and rerun.

use std::path::{Path, PathBuf};

use casebatch_bundle::{
    BatchSummary, Bundle, CaseRecordState, CaseResult, RECORD_SCHEMA_VERSION, write_batch_files,
    write_json_atomic,
};
use casebatch_manifest::{LoadOptions, Plan, load_plan};
use casebatch_proto::{BatchEnd, BatchOutcome, UnrecordedFailure};

use crate::drive::{self, DriveOptions, Finished, Observer};
use crate::error::{ControlError, Result};
use crate::location::{BatchLocation, EngineChoice, absolute};
use crate::prepare;
use crate::run_history;

/// A manifest and how to read it.
#[derive(Debug, Clone)]
pub struct ManifestInput {
    pub path: PathBuf,
    pub options: LoadOptions,
}

impl ManifestInput {
    /// Loads and validates; every problem is reported at once. Nothing is written.
    pub fn load(&self) -> Result<Plan> {
        Ok(load_plan(&self.path, &self.options)?)
    }
}

/// A batch (or one case of it) to run from a manifest.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub manifest: ManifestInput,
    pub output_dir: PathBuf,
    pub engine: EngineChoice,
    pub drive: DriveOptions,
}

/// A batch that already exists in its bundle, to continue.
#[derive(Debug, Clone)]
pub struct ResumeRequest {
    pub location: BatchLocation,
    pub engine: EngineChoice,
    /// `drive.requeue` names the finished cases that get a new attempt.
    pub drive: DriveOptions,
}

/// A planned batch: its bundle holds the plan; nothing ran.
#[derive(Debug)]
pub struct Planned {
    pub bundle: Bundle,
    pub plan: Plan,
}

/// A batch followed to the end of a run.
#[derive(Debug)]
pub struct RunReport {
    pub bundle: Bundle,
    pub plan: Plan,
    pub ending: Ending,
}

#[derive(Debug)]
pub enum Ending {
    /// The workflow ran to this outcome.
    Ran(BatchOutcome),
    /// Every case was already finished: nothing was started. The batch files were rebuilt.
    AlreadyComplete(BatchSummary),
}

/// What a run adds up to, for people and exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every case succeeded (verified by its evaluator where one is configured).
    AllSucceeded,
    /// Drained, paused or superseded with queued work remaining: deliberately incomplete.
    Incomplete,
    /// Failed, cancelled or mixed outcomes (all outputs still written).
    Failures,
}

impl RunReport {
    pub fn verdict(&self) -> Verdict {
        match &self.ending {
            Ending::Ran(o) => {
                let c = &o.status.counts;
                match o.end {
                    // Superseded: its unfinished cases wait for the run that replaces it.
                    BatchEnd::Drained | BatchEnd::Superseded if c.queued > 0 => Verdict::Incomplete,
                    BatchEnd::Cancelled => Verdict::Failures,
                    _ if c.succeeded == c.total() => Verdict::AllSucceeded,
                    _ => Verdict::Failures,
                }
            }
            Ending::AlreadyComplete(s) if s.succeeded() == s.total => Verdict::AllSucceeded,
            Ending::AlreadyComplete(_) => Verdict::Failures,
        }
    }
}

/// Writes the plan into the bundle; nothing is executed.
pub fn plan(
    manifest: &ManifestInput,
    output_dir: &Path,
    history_db: Option<&Path>,
) -> Result<Planned> {
    let mut plan = manifest.load()?;
    let bundle = Bundle::new(&absolute(output_dir)?, &plan.batch_id);
    run_history::weigh(&mut plan, &bundle, history_db);
    prepare::write_plan(&bundle, &plan, &manifest.path)?;
    Ok(Planned { bundle, plan })
}

/// Plans the batch and runs it to the end of a run.
pub async fn run(req: RunRequest, observer: &mut dyn Observer) -> Result<RunReport> {
    let plan = req.manifest.load()?;
    start(req, plan, observer).await
}

/// One case on its own: a one-case batch (`<batch>--<case_dir>`), so it is resumed and its
/// job adopted the same way as any batch.
pub async fn run_case(
    req: RunRequest,
    case_id: &str,
    observer: &mut dyn Observer,
) -> Result<RunReport> {
    let mut plan = req.manifest.load()?;
    let Some(mut case) = plan.cases.iter().find(|c| c.case_id == case_id).cloned() else {
        return Err(ControlError::UnknownCase {
            case_id: case_id.to_string(),
            within: req.manifest.path.display().to_string(),
        });
    };
    case.index = 0;
    plan.batch_id = format!("{}--{}", plan.batch_id, case.case_dir);
    plan.cases = vec![case];
    plan.fingerprint = format!("{}:{case_id}", plan.fingerprint);
    start(req, plan, observer).await
}

async fn start(req: RunRequest, mut plan: Plan, observer: &mut dyn Observer) -> Result<RunReport> {
    let root = absolute(&req.output_dir)?;
    let bundle = Bundle::new(&root, &plan.batch_id);
    prepare::check_same_task_list(&bundle, &plan)?;
    run_history::weigh(&mut plan, &bundle, req.drive.history_db.as_deref());
    let choice = req.engine.for_batch(&bundle)?;
    let engine = choice.connect(&root).await?;
    // Someone else's batch under this id is refused before anything is written.
    drive::claim(&engine.client, &bundle, &plan).await?;
    prepare::write_plan(&bundle, &plan, &req.manifest.path)?;
    prepare::write_run_config(&bundle, &plan, &engine, &choice)?;
    follow(engine, bundle, plan, req.drive, observer).await
}

/// Continues a batch from its bundle's saved plan (never a re-read manifest).
pub async fn resume(req: ResumeRequest, observer: &mut dyn Observer) -> Result<RunReport> {
    let (bundle, plan) = req.location.open()?;
    if let Some(unknown) = req.drive.requeue.unknown_case(&plan) {
        return Err(ControlError::UnknownCase {
            case_id: unknown.to_string(),
            within: format!("batch {}", plan.batch_id),
        });
    }
    let engine = req
        .engine
        .for_batch(&bundle)?
        .connect(&req.location.output_root)
        .await?;
    follow(engine, bundle, plan, req.drive, observer).await
}

pub(crate) async fn follow(
    engine: casebatch_worker::Engine,
    bundle: Bundle,
    plan: Plan,
    opts: DriveOptions,
    observer: &mut dyn Observer,
) -> Result<RunReport> {
    let ending = match drive::execute(engine, &bundle, &plan, opts, observer).await? {
        Finished::Ran(outcome) => {
            record_unrecorded(&bundle, &plan, &outcome.status.unrecorded)?;
            Ending::Ran(*outcome)
        }
        Finished::AlreadyComplete => Ending::AlreadyComplete(write_batch_files(&bundle, &plan)?),
    };
    Ok(RunReport {
        bundle,
        plan,
        ending,
    })
}

/// Writes the results a worker could not (it may not write the bundle; the engine kept their
/// failures), so the bundle and `batch report` show why those cases failed. A result the
/// worker did write is left alone.
fn record_unrecorded(bundle: &Bundle, plan: &Plan, unrecorded: &[UnrecordedFailure]) -> Result<()> {
    let mut wrote = false;
    for u in unrecorded {
        let Some(case) = plan.cases.get(u.case as usize) else {
            continue;
        };
        let path = bundle.case_result(&case.case_dir);
        if path.exists() {
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| ControlError::write(dir, e))?;
        }
        let result = CaseResult {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            case_id: case.case_id.clone(),
            case_dir: case.case_dir.clone(),
            state: CaseRecordState::Failed,
            attempts: u.attempts,
            actor_status: None,
            exit_code: None,
            evaluation_configured: false,
            verdict: None,
            cleanup_confirmed: false,
            failure: Some(u.failure.clone()),
            collect_failure: None,
            adopted: false,
            job_starts: None,
            scores: Default::default(),
            outputs: serde_json::Value::Null,
            simulated: false,
            memory_boost_mb: None,
            trace_ref: None,
            origin: None,
            runtime: Some(case.runtime_label().to_owned()),
        };
        write_json_atomic(&path, &result)?;
        wrote = true;
    }
    if wrote {
        write_batch_files(bundle, plan)?;
    }
    Ok(())
}
