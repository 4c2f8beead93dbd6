//! `batch validate` and `batch plan`: everything before execution.

use std::path::Path;

use casebatch_control::ControlError;
use serde_json::json;

use crate::cli::ManifestArgs;
use crate::exit::{CliResult, Exit};
use crate::render;

pub fn validate(m: &ManifestArgs, as_json: bool) -> CliResult {
    let loaded = m.input()?.load();
    if as_json {
        return match loaded {
            Ok(plan) => {
                say!(
                    "{}",
                    json!({
                        "valid": true,
                        "file": m.manifest,
                        "batch_id": plan.batch_id,
                        "cases": plan.cases.len(),
                        "fingerprint": plan.fingerprint,
                        "warnings": plan.warnings,
                    })
                );
                Ok(Exit::Success)
            }
            // Refused: the problems are the answer, on stdout like a success's.
            Err(ControlError::Manifest(e)) => {
                say!(
                    "{}",
                    json!({"valid": false, "file": e.file, "problems": e.problems})
                );
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
        let plan = &planned.plan;
        say!(
            "{}",
            json!({
                "batch_id": plan.batch_id,
                "cases": plan.cases.len(),
                "fingerprint": plan.fingerprint,
                "plan": planned.bundle.plan(),
                "warnings": plan.warnings,
                "spread": plan.spread,
            })
        );
        return Ok(Exit::Success);
    }
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
