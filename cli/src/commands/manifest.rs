//! `batch validate` and `batch plan`: everything before execution.

use std::path::Path;

use crate::cli::ManifestArgs;
use crate::exit::{CliResult, Exit};
use crate::render;

pub fn validate(m: &ManifestArgs) -> CliResult {
    let plan = m.input()?.load()?;
    render::warnings(&plan);
    say!(
        "ok: {} is valid: batch {} with {} case(s)",
        m.manifest.display(),
        plan.batch_id,
        plan.cases.len()
    );
    Ok(Exit::Success)
}

pub fn plan(m: &ManifestArgs, output_dir: &Path) -> CliResult {
    let planned = casebatch_control::plan(&m.input()?, output_dir, None)?;
    render::warnings(&planned.plan);
    render::spread(&planned.plan);
    say!(
        "planned {} case(s) of batch {} into {} (nothing executed)",
        planned.plan.cases.len(),
        planned.plan.batch_id,
        planned.bundle.plan().display()
    );
    Ok(Exit::Success)
}
