//! Running batches: validate, plan, run, a single case, resume and rerun. Each operation is
//! its steps in order, here: locate → plan → prepare the bundle → drive (`drive.rs`: start
//! or attach → follow → finish).

use std::path::{Path, PathBuf};

use casebatch_bundle::Bundle;
use casebatch_manifest::{LoadOptions, Plan, load_plan};
use casebatch_views::StartRequest;
use casebatch_worker::Engine;

use crate::carry::carried;
use crate::drive::drive;
use crate::error::{ControlError, Result};
use crate::events::Observer;
use crate::finish::RunReport;
use crate::location::{BatchLocation, EngineChoice, absolute};
use crate::options::DriveOptions;
use crate::workflow::Presence;
use crate::{prepare, run_history, start, workflow};

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
    launch(req, plan, observer).await
}

/// One case on its own: a one-case batch (`<batch>--<case_dir>`), so it is resumed and its
/// job adopted the same way as any batch.
pub async fn run_case(
    req: RunRequest,
    case_id: &str,
    observer: &mut dyn Observer,
) -> Result<RunReport> {
    let plan = one_case(req.manifest.load()?, case_id, &req.manifest.path)?;
    launch(req, plan, observer).await
}

/// The one-case batch of `case_id`: its own id and fingerprint, so it never shares a bundle
/// or a workflow with the whole batch.
fn one_case(mut plan: Plan, case_id: &str, manifest: &Path) -> Result<Plan> {
    let Some(mut case) = plan.cases.iter().find(|c| c.case_id == case_id).cloned() else {
        return Err(ControlError::UnknownCase {
            case_id: case_id.to_string(),
            within: manifest.display().to_string(),
            hint: crate::error::ONE_CASE,
        });
    };
    case.index = 0;
    plan.batch_id = format!("{}--{}", plan.batch_id, case.case_dir);
    plan.cases = vec![case];
    plan.fingerprint = format!("{}:{case_id}", plan.fingerprint);
    Ok(plan)
}

/// A batch from a manifest. Another task list under its id, or someone else's workflow, is
/// refused before anything is written.
async fn launch(req: RunRequest, plan: Plan, observer: &mut dyn Observer) -> Result<RunReport> {
    let claimed = claim(&req, plan, false).await?;
    // Start or attach, follow, finish.
    drive(
        claimed.engine,
        claimed.bundle,
        claimed.plan,
        req.drive,
        observer,
    )
    .await
}

/// `batch prepare`: plans the batch and writes its bundle as `run` does, then returns its next
/// run as a start request for another client to send (the ownership checks come first, and a
/// running batch is refused: its next run can only start once it has ended).
pub async fn prepare_start(req: RunRequest) -> Result<(Bundle, StartRequest)> {
    let Claimed {
        bundle,
        plan,
        engine,
        found,
    } = claim(&req, req.manifest.load()?, true).await?;
    let handle = workflow::handle(&engine.client, &plan);
    let carried = carried(&handle, found, &bundle, &plan).await?;
    let request = start::request(&handle, &bundle, &plan, carried, &req.drive).await?;
    Ok((bundle, request))
}

/// A batch from a manifest, its bundle's input files written, on the engine it runs on.
struct Claimed {
    bundle: Bundle,
    plan: Plan,
    engine: Engine,
    /// Its workflow, proven to be this batch's.
    found: Presence,
}

/// What `launch` and `prepare_start` do before the start: locate, plan, claim, write.
async fn claim(req: &RunRequest, mut plan: Plan, refuse_running: bool) -> Result<Claimed> {
    // Locate the bundle; another task list under its id is refused first.
    let root = absolute(&req.output_dir)?;
    let bundle = Bundle::new(&root, &plan.batch_id);
    prepare::check_same_task_list(&bundle, &plan)?;
    // Plan: the runtime lists dealt by the run history (a batch keeps the deal it has).
    run_history::weigh(&mut plan, &bundle, req.drive.history_db.as_deref());
    // Locate the engine the batch runs on; someone else's workflow under its id is refused.
    let choice = req.engine.for_batch(&bundle)?;
    let engine = choice.connect(&root).await?;
    let found = workflow::claim(&engine.client, &bundle, &plan).await?;
    if refuse_running && found == Presence::Running {
        return Err(ControlError::StillRunning {
            batch_id: plan.batch_id.clone(),
            action: "prepare a start of",
        });
    }
    // Prepare the bundle: its input files.
    prepare::write_plan(&bundle, &plan, &req.manifest.path)?;
    prepare::write_run_config(&bundle, &plan, &engine, &choice)?;
    Ok(Claimed {
        bundle,
        plan,
        engine,
        found,
    })
}

/// Continues a batch from its bundle's saved plan (never a re-read manifest).
pub async fn resume(req: ResumeRequest, observer: &mut dyn Observer) -> Result<RunReport> {
    let (bundle, plan) = req.location.open()?;
    if let Some(unknown) = req.drive.requeue.unknown_case(&plan) {
        return Err(ControlError::UnknownCase {
            case_id: unknown.to_string(),
            within: format!("batch {}", plan.batch_id),
            hint: crate::error::TASK_OR_CASE,
        });
    }
    let engine = req
        .engine
        .for_batch(&bundle)?
        .connect(&req.location.output_root)
        .await?;
    drive(engine, bundle, plan, req.drive, observer).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_case_is_a_batch_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let whole = crate::test_plan::two_cases(dir.path());
        let manifest = dir.path().join("m.yaml");
        let plan = one_case(whole.clone(), "b", &manifest).unwrap();
        assert_eq!(plan.cases.len(), 1);
        let case = &plan.cases[0];
        assert_eq!((case.case_id.as_str(), case.index), ("b", 0));
        assert_eq!(plan.batch_id, format!("t--{}", case.case_dir));
        assert_eq!(plan.fingerprint, format!("{}:b", whole.fingerprint));

        let err = one_case(whole, "c", &manifest).unwrap_err();
        assert!(
            matches!(&err, ControlError::UnknownCase { case_id, within, .. }
                if case_id == "c" && within == &manifest.display().to_string()),
            "{err}"
        );
    }
}
