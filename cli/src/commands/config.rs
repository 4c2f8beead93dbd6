//! `casebatch config schema`, `casebatch completions`, `casebatch man`: what describes the CLI
//! and its input rather than running anything.

use std::path::Path;

use casebatch_cli::manual;
use casebatch_views::ViewKind;

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
    manual::completions(shell, &mut std::io::stdout());
    Ok(Exit::Success)
}

/// The top page on stdout, or every command's page into `dir` (each file named on stderr).
pub fn man(dir: Option<&Path>) -> CliResult {
    let Some(dir) = dir else {
        manual::man_page(&mut std::io::stdout())
            .map_err(|e| CliError::usage(format!("failed to write the man page: {e}")))?;
        return Ok(Exit::Success);
    };
    let written = manual::man_pages(dir).map_err(|e| CliError {
        exit: Exit::Output,
        message: format!("failed to write the man pages into {}: {e}", dir.display()),
    })?;
    eprintln!("{} man pages in {}", written.len(), dir.display());
    Ok(Exit::Success)
}
