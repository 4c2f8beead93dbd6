//! `batch run`, `batch resume`, `batch rerun` and `run --case`: one library call each, with
//! live progress drawn while the batch runs.

use casebatch_control::{DriveOptions, EngineChoice, Requeue, ResumeRequest, RunRequest};

use std::path::PathBuf;

use crate::cli::{EngineArgs, ManifestArgs, RerunArgs, ResumeArgs, RunArgs, SingleRunArgs};
use crate::exit::{CliResult, Exit};
use crate::render::{self, Progress};

pub async fn run(args: RunArgs) -> CliResult {
    let manifest = args.manifest.input()?;
    if args.dry_run {
        let planned =
            casebatch_control::plan(&manifest, &args.output_dir, args.history_db.as_deref())?;
        render::warnings(&planned.plan);
        if args.json {
            render::json(&super::manifest::plan_view(&planned));
            return Ok(Exit::Success);
        }
        render::spread(&planned.plan.head());
        say!(
            "dry run: planned {} case(s) into {}; nothing executed",
            planned.plan.cases.len(),
            planned.bundle.plan().display()
        );
        return Ok(Exit::Success);
    }
    let request = RunRequest {
        manifest,
        output_dir: args.output_dir,
        engine: EngineChoice {
            ui: args.ui,
            ..args.engine.choice()
        },
        drive: DriveOptions {
            without_worker: args.no_worker,
            history_budget: args.history_budget,
            supersede: args.supersede,
            no_speculation: args.no_speculation,
            history_db: args.history_db,
            metrics: args.metrics.listen()?,
            ..DriveOptions::default()
        },
    };
    let mut progress = Progress::default();
    let report = casebatch_control::run(request, &mut progress).await;
    progress.finish();
    Ok(outcome(&report?, args.json))
}

fn outcome(report: &casebatch_control::RunReport, json: bool) -> Exit {
    if json {
        render::run_report_json(report)
    } else {
        render::run_report(report)
    }
}

pub async fn run_one(args: SingleRunArgs) -> CliResult {
    let request = RunRequest {
        manifest: args.manifest.input()?,
        output_dir: args.output_dir,
        engine: EngineChoice {
            ui: args.ui,
            ..args.engine.choice()
        },
        drive: DriveOptions::default(),
    };
    let mut progress = Progress::default();
    let report = casebatch_control::run_case(request, &args.case_id, &mut progress).await;
    progress.finish();
    Ok(render::run_report(&report?))
}

/// `batch prepare`: the bundle written, the start request on stdout.
pub async fn prepare(
    manifest: &ManifestArgs,
    output_dir: PathBuf,
    engine: &EngineArgs,
) -> CliResult {
    let request = RunRequest {
        manifest: manifest.input()?,
        output_dir,
        engine: engine.choice(),
        drive: DriveOptions::default(),
    };
    let (bundle, start) = casebatch_control::prepare_start(request).await?;
    render::json(&start);
    // stdout is the request alone, for a program to read.
    eprintln!(
        "prepared batch {} in {}: start it with the request printed (workflow {} on task queue {})",
        start.input.batch_id,
        bundle.root().display(),
        start.workflow_id,
        start.task_queue
    );
    Ok(Exit::Success)
}

pub async fn resume(args: ResumeArgs) -> CliResult {
    let requeue = if args.retry_failed {
        Requeue::Failed
    } else {
        Requeue::None
    };
    resume_with(args, requeue).await
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
        budget: None,
        ui: false,
    };
    resume_with(resume, requeue).await
}

async fn resume_with(args: ResumeArgs, requeue: Requeue) -> CliResult {
    let request = ResumeRequest {
        location: args.batch.location()?,
        engine: EngineChoice {
            ui: args.ui,
            ..args.batch.engine.choice()
        },
        drive: DriveOptions {
            without_worker: args.no_worker,
            requeue,
            budget: args.budget,
            ..DriveOptions::default()
        },
    };
    let mut progress = Progress::default();
    let report = casebatch_control::resume(request, &mut progress).await;
    progress.finish();
    Ok(outcome(&report?, args.batch.json))
}
