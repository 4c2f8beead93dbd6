//! One module per group of subcommands; `dispatch` routes to them. Every command parses its
//! flags, calls one `casebatch_control` operation and renders what comes back.

mod agent;
mod config;
mod demo;
mod engine;
mod health;
mod manifest;
mod ops;
mod retry;
mod run;
mod sandbox;
mod status;
mod worker;

use crate::cli::{BatchCommand, Command, ConfigCommand, EngineCommand, SandboxCommand};
use crate::exit::CliResult;

pub async fn dispatch(command: Command) -> CliResult {
    match command {
        Command::Config(ConfigCommand::Schema { kind }) => config::schema(kind),
        Command::Batch(b) => match b {
            BatchCommand::Validate { manifest, json } => manifest::validate(&manifest, json),
            BatchCommand::Plan {
                manifest,
                output_dir,
                json,
            } => manifest::plan(&manifest, &output_dir, json),
            // The start request is JSON with or without `--json`.
            BatchCommand::Prepare {
                manifest,
                output_dir,
                engine,
                json: _,
            } => run::prepare(&manifest, output_dir, &engine).await,
            BatchCommand::Run(args) => run::run(args).await,
            BatchCommand::Resume(args) => run::resume(args).await,
            BatchCommand::Rerun(args) => run::rerun(args).await,
            BatchCommand::Status(r) => status::status(&r).await,
            BatchCommand::Report { batch, html } => status::report(&batch, html.as_deref()),
            BatchCommand::Logs(args) => status::logs(&args),
            BatchCommand::Drain(r) => ops::control(&r, ops::Control::Drain).await,
            BatchCommand::Pause(r) => ops::control(&r, ops::Control::Pause).await,
            BatchCommand::Unpause(r) => ops::control(&r, ops::Control::Unpause).await,
            BatchCommand::Cancel(r) => ops::control(&r, ops::Control::Cancel).await,
            BatchCommand::Supersede(r) => ops::control(&r, ops::Control::Supersede).await,
            BatchCommand::SetConcurrency { batch, limit } => {
                ops::control(&batch, ops::Control::SetConcurrency(limit)).await
            }
            BatchCommand::SetShare {
                batch,
                priority,
                weight,
            } => {
                let to = casebatch_proto::share::ShareChange { priority, weight };
                ops::control(&batch, ops::Control::SetShare(to)).await
            }
            BatchCommand::RetryFailed(args) => retry::retry_failed(args).await,
            BatchCommand::Diff {
                a,
                b,
                output_dir,
                json,
            } => status::diff(&output_dir, &a, &b, json),
            BatchCommand::List { output_dir, json } => status::list(&output_dir, json),
            BatchCommand::History {
                batch,
                run_id,
                breaker,
                pace,
                slots,
                out,
            } => {
                use casebatch_control::HistoryOf;
                let of = match (breaker.as_deref(), pace, slots.as_deref()) {
                    (Some(name), _, _) => HistoryOf::Breaker(name),
                    (None, true, _) => HistoryOf::Pace,
                    (None, false, Some(name)) => HistoryOf::Slots(name),
                    (None, false, None) => HistoryOf::Batch,
                };
                status::history(&batch, run_id, of, &out).await
            }
        },
        Command::Run(args) => run::run_one(args).await,
        Command::Worker(args) => worker::run(args).await,
        Command::Agent(args) => agent::run(args).await,
        Command::Health(args) => health::probe(&args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Harness(h) => demo::harness(h).await,
        Command::History(args) => status::run_history(&args),
        Command::Sandbox(SandboxCommand::Gc {
            apply,
            batch_id,
            json,
            slurm: false,
        }) => sandbox::gc(apply, batch_id.as_deref(), json).await,
        Command::Sandbox(SandboxCommand::Gc {
            apply,
            batch_id,
            json,
            slurm: true,
        }) => sandbox::gc_slurm(apply, batch_id.as_deref(), json).await,
        Command::Engine(EngineCommand::Status { output_dir, json }) => {
            engine::status(&output_dir, json)
        }
        Command::Engine(EngineCommand::Stop { output_dir }) => engine::stop(&output_dir),
        Command::Engine(EngineCommand::Ui { output_dir }) => engine::ui(&output_dir).await,
        Command::Engine(EngineCommand::Keep {
            state_dir,
            port,
            idle_secs,
            ui_port,
        }) => engine::keep(&state_dir, port, idle_secs, ui_port),
        Command::Completions { shell } => config::completions(shell),
        Command::Man { dir } => config::man(dir.as_deref()),
    }
}
