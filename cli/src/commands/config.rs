//! `casebatch config schema`, `casebatch completions`, `casebatch man`: what describes the CLI
//! and its input rather than running anything.

use clap::CommandFactory;

use casebatch_views::ViewKind;

use crate::cli::Cli;
use crate::exit::{CliError, CliResult, Exit};

pub fn schema(kind: ViewKind) -> CliResult {
    let schema = kind.schema();
    say!(
        "{}",
        serde_json::to_string_pretty(&schema).expect("schema serializes")
    );
    Ok(Exit::Success)
}

pub fn completions(shell: clap_complete::Shell) -> CliResult {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "casebatch", &mut std::io::stdout());
    Ok(Exit::Success)
}

pub fn man() -> CliResult {
    clap_mangen::Man::new(Cli::command())
        .render(&mut std::io::stdout())
        .map_err(|e| CliError::usage(format!("failed to write the man page: {e}")))?;
    Ok(Exit::Success)
}
