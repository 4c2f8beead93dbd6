//! `batch validate` and `batch plan`: everything before execution.

use std::path::Path;

use casebatch_bundle::Bundle;
use casebatch_manifest::{Plan, load_plan};

use super::{absolute, load_options};
use crate::cli::ManifestArgs;
use crate::exit::{CliError, CliResult, Exit};

/// Loads and validates; every problem is reported at once, as exit 2.
pub fn load(m: &ManifestArgs) -> CliResult<Plan> {
    let opts = load_options(m)?;
    load_plan(&m.manifest, &opts).map_err(CliError::usage)
}

pub fn validate(m: &ManifestArgs) -> CliResult {
    let plan = load(m)?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    say!(
        "ok: {} is valid: batch {} with {} case(s)",
        m.manifest.display(),
        plan.batch_id,
        plan.cases.len()
    );
    Ok(Exit::Success)
}

pub fn plan(m: &ManifestArgs, output_dir: &Path) -> CliResult {
    let plan = load(m)?;
    let bundle = Bundle::new(&absolute(output_dir)?, &plan.batch_id);
    super::run::prepare_bundle(&bundle, &plan, &m.manifest, None)?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    say!(
        "planned {} case(s) of batch {} into {} (nothing executed)",
        plan.cases.len(),
        plan.batch_id,
        bundle.plan().display()
    );
    Ok(Exit::Success)
}
