//! `casebatch sandbox gc`: the containers (or Slurm jobs) nothing will clean up any more.

use crate::exit::{CliError, CliResult, Exit};

pub async fn gc(apply: bool, batch_id: Option<&str>, json: bool) -> CliResult {
    let found = casebatch_container::gc::gc(apply, batch_id)
        .await
        .map_err(|message| CliError {
            exit: Exit::Engine,
            message: format!("failed to list the sandbox containers: {message}"),
        })?;
    if json {
        say!(
            "{}",
            serde_json::to_string_pretty(&found).expect("containers serialize")
        );
        return Ok(Exit::Success);
    }
    for f in &found {
        let action = match (f.removed, f.is_garbage()) {
            (true, _) => "removed",
            (false, true) => "garbage",
            (false, false) => "kept",
        };
        say!(
            "{action:<8} {} ({}, {}, attempt {})",
            f.name,
            f.verdict,
            f.state,
            f.marker
        );
    }
    let garbage = found.iter().filter(|f| f.is_garbage()).count();
    let removed = found.iter().filter(|f| f.removed).count();
    let tail = if apply {
        format!("{removed} removed")
    } else {
        "`casebatch sandbox gc --apply` removes them".into()
    };
    say!(
        "{} container(s) labelled by casebatch: {garbage} garbage ({tail}), {} kept",
        found.len(),
        found.len() - garbage
    );
    Ok(Exit::Success)
}

/// `sandbox gc --slurm`: casebatch's Slurm jobs of closed attempts or deleted bundles.
pub async fn gc_slurm(apply: bool, batch_id: Option<&str>, json: bool) -> CliResult {
    let found = casebatch_slurm::gc::gc(apply, batch_id)
        .await
        .map_err(|message| CliError {
            exit: Exit::Engine,
            message: format!("failed to list casebatch's Slurm jobs: {message}"),
        })?;
    if json {
        say!(
            "{}",
            serde_json::to_string_pretty(&found).expect("jobs serialize")
        );
        return Ok(Exit::Success);
    }
    for f in &found {
        let action = match (f.cancelled, f.is_garbage()) {
            (true, _) => "cancelled",
            (false, true) => "garbage",
            (false, false) => "kept",
        };
        say!(
            "{action:<9} {} (job {}, {}, {}, attempt {})",
            f.name,
            f.job_id,
            f.verdict,
            f.state,
            f.marker
        );
    }
    let garbage = found.iter().filter(|f| f.is_garbage()).count();
    let tail = if apply {
        format!("{} cancelled", found.iter().filter(|f| f.cancelled).count())
    } else {
        "`casebatch sandbox gc --slurm --apply` cancels them".into()
    };
    say!(
        "{} Slurm job(s) named by casebatch: {garbage} garbage ({tail}), {} kept",
        found.len(),
        found.len() - garbage
    );
    Ok(Exit::Success)
}
