//! The bundle's input files (`manifest.json`, `batch_plan.json`, `run_config.json`), written
//! before anything runs, and the one-task-list-per-batch-id check.

use std::path::Path;

use casebatch_bundle::{
    Bundle, EngineMode, EngineRecord, ManifestRecord, RECORD_SCHEMA_VERSION, RunConfig,
    write_json_atomic,
};
use casebatch_manifest::Plan;
use casebatch_proto::{TASK_QUEUE, workflow_id};
use casebatch_worker::Engine;

use crate::error::{ControlError, Result};
use crate::location::EngineChoice;

/// Linear backoff step between attempts of a case.
pub(crate) const RETRY_BACKOFF_MS: u64 = 1_000;

/// Refuses a different task list under an existing batch id; nothing is written then.
pub(crate) fn check_same_task_list(bundle: &Bundle, plan: &Plan) -> Result<()> {
    if !bundle.exists() {
        return Ok(());
    }
    let existing = bundle.read_plan()?;
    if existing.fingerprint == plan.fingerprint {
        return Ok(());
    }
    Err(ControlError::PlanConflict {
        batch_id: plan.batch_id.clone(),
        path: bundle.root().to_path_buf(),
        existing: short(&existing.fingerprint).to_string(),
        planned: short(&plan.fingerprint).to_string(),
    })
}

/// Writes the manifest as read and the plan.
pub(crate) fn write_plan(bundle: &Bundle, plan: &Plan, manifest_path: &Path) -> Result<()> {
    check_same_task_list(bundle, plan)?;
    std::fs::create_dir_all(bundle.root()).map_err(|e| ControlError::write(bundle.root(), e))?;
    let record = ManifestRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        path: plan.provenance.manifest_path.clone(),
        sha256: plan.provenance.manifest_sha256.clone(),
        format: plan.provenance.format,
        content: std::fs::read_to_string(manifest_path).unwrap_or_default(),
    };
    write_json_atomic(&bundle.manifest(), &record)?;
    write_json_atomic(&bundle.plan(), plan)?;
    Ok(())
}

/// Records which engine runs the batch.
pub(crate) fn write_run_config(
    bundle: &Bundle,
    plan: &Plan,
    engine: &Engine,
    choice: &EngineChoice,
) -> Result<()> {
    let config = RunConfig {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        batch_id: plan.batch_id.clone(),
        casebatch_version: env!("CARGO_PKG_VERSION").into(),
        engine: EngineRecord {
            mode: if engine.embedded.is_some() {
                EngineMode::Embedded
            } else {
                EngineMode::Cluster
            },
            address: engine.address.clone(),
            namespace: engine.namespace.clone(),
            profile: choice.profile.clone(),
            task_queue: TASK_QUEUE.into(),
            workflow_id: workflow_id(&plan.batch_id),
        },
        settings: plan.settings.clone(),
        retry_backoff_ms: RETRY_BACKOFF_MS,
    };
    Ok(write_json_atomic(&bundle.run_config(), &config)?)
}

fn short(s: &str) -> &str {
    &s[..s.len().min(12)]
}
