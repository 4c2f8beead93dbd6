//! `batch validate` and `batch plan`: everything before execution.

use std::path::Path;

use casebatch_control::ControlError;
use casebatch_views::{PlanView, ValidateView};

use crate::cli::ManifestArgs;
use crate::exit::{CliResult, Exit};
use crate::render;

pub fn validate(m: &ManifestArgs, as_json: bool) -> CliResult {
    let loaded = m.input()?.load();
    if as_json {
        return match loaded {
            Ok(plan) => {
                render::json(&ValidateView {
                    valid: true,
                    file: m.manifest.clone(),
                    batch_id: Some(plan.batch_id),
                    cases: Some(plan.cases.len()),
                    fingerprint: Some(plan.fingerprint),
                    warnings: Some(plan.warnings),
                    problems: None,
                });
                Ok(Exit::Success)
            }
            // Refused: the problems are the answer, on stdout like a success's.
            Err(ControlError::Manifest(e)) => {
                render::json(&ValidateView {
                    valid: false,
                    file: e.file,
                    batch_id: None,
                    cases: None,
                    fingerprint: None,
                    warnings: None,
                    problems: Some(e.problems),
                });
                Ok(Exit::Usage)
            }
            Err(e) => Err(e.into()),
        };
    }
    let plan = loaded?;
    render::warnings(&plan);
    say!(
        "ok: {} is valid: batch {} with {} case(s)",
        m.manifest.display(),
        plan.batch_id,
        plan.cases.len()
    );
    Ok(Exit::Success)
}

pub fn plan(m: &ManifestArgs, output_dir: &Path, as_json: bool) -> CliResult {
    let planned = casebatch_control::plan(&m.input()?, output_dir, None)?;
    if as_json {
        render::json(&plan_view(&planned));
        return Ok(Exit::Success);
    }
    render::warnings(&planned.plan);
    render::spread(&planned.plan.head());
    say!(
        "planned {} case(s) of batch {} into {} (nothing executed)",
        planned.plan.cases.len(),
        planned.plan.batch_id,
        planned.bundle.plan().display()
    );
    Ok(Exit::Success)
}

/// The `--json` answer of `batch plan` and `batch run --dry-run`.
pub fn plan_view(planned: &casebatch_control::Planned) -> PlanView {
    let plan = &planned.plan;
    PlanView {
        batch_id: plan.batch_id.clone(),
        cases: plan.cases.len(),
        fingerprint: plan.fingerprint.clone(),
        plan: planned.bundle.plan(),
        warnings: plan.warnings.clone(),
        spread: plan.spread.clone(),
    }
}
