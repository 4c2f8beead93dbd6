//! One module per group of subcommands; `dispatch` routes to them.

mod config;
mod demo;
mod manifest;
mod ops;
mod retry;
mod run;
mod status;
mod worker;

use std::path::{Path, PathBuf};

use casebatch_manifest::{CommandSpec, Defaults, LoadOptions, RuntimeKind};
use casebatch_worker::EngineTarget;

use crate::cli::{BatchCommand, Command, ConfigCommand, EngineArgs, ManifestArgs};
use crate::exit::{CliError, CliResult};

pub async fn dispatch(command: Command) -> CliResult {
    match command {
        Command::Config(ConfigCommand::Schema { kind }) => config::schema(kind),
        Command::Batch(b) => match b {
            BatchCommand::Validate(m) => manifest::validate(&m),
            BatchCommand::Plan {
                manifest,
                output_dir,
            } => manifest::plan(&manifest, &output_dir),
            BatchCommand::Run(args) => run::run(args).await,
            BatchCommand::Resume(args) => run::resume(args).await,
            BatchCommand::Rerun(args) => run::rerun(args).await,
            BatchCommand::Status(r) => status::status(&r).await,
            BatchCommand::Report(r) => status::report(&r).await,
            BatchCommand::Drain(r) => ops::signal(&r, ops::Op::Drain).await,
            BatchCommand::Pause(r) => ops::signal(&r, ops::Op::Pause).await,
            BatchCommand::Unpause(r) => ops::signal(&r, ops::Op::Unpause).await,
            BatchCommand::Cancel(r) => ops::signal(&r, ops::Op::Cancel).await,
            BatchCommand::RetryFailed(args) => retry::retry_failed(args).await,
            BatchCommand::History { batch, run_id, out } => {
                status::history(&batch, run_id, &out).await
            }
        },
        Command::Run(args) => run::run_one(args).await,
        Command::Worker(args) => worker::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Harness(h) => demo::harness(h).await,
    }
}

/// Flags → manifest load options.
fn load_options(m: &ManifestArgs) -> CliResult<LoadOptions> {
    let runtime = match m.runtime.as_deref() {
        None => None,
        Some("local-process") => Some(RuntimeKind::LocalProcess),
        Some("fake") => Some(RuntimeKind::Fake),
        Some(other) => {
            return Err(CliError::usage(format!(
                "failed to read --runtime: {other:?} is not a runtime; use local-process or fake"
            )));
        }
    };
    Ok(LoadOptions {
        batch_id: m.batch_id.clone(),
        overrides: Defaults {
            concurrency: m.parallelism,
            max_retries: m.max_retries,
            runtime,
            harness: m.harness.clone().map(CommandSpec::Shell),
            evaluator: m.evaluator.clone().map(CommandSpec::Shell),
            ..Defaults::default()
        },
        defaults_file: m.defaults.clone(),
        max_cases: m.max_cases,
    })
}

/// Output roots are made absolute: activities may run in other processes.
fn absolute(path: &Path) -> CliResult<PathBuf> {
    std::path::absolute(path)
        .map_err(|e| CliError::usage(format!("failed to resolve {}: {e}", path.display())))
}

fn engine_target(output_root: &Path, e: &EngineArgs) -> EngineTarget {
    EngineTarget::resolve(
        output_root,
        e.address.clone(),
        e.namespace.clone(),
        e.profile.clone(),
    )
}

/// Batch ids name directories: refuse anything that could leave the output root.
fn check_batch_id(id: &str) -> CliResult<()> {
    let ok = !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "failed to use --batch-id {id:?}: use letters, digits, '.', '_' and '-' only, not starting with '.'"
        )))
    }
}
