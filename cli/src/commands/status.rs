//! `batch status` (live from the workflow when it runs, else from its result or the bundle)
//! and `batch report` (from the bundle alone; no engine needed).

use std::time::Duration;

use casebatch_bundle::{Bundle, write_batch_files};
use casebatch_manifest::Plan;
use casebatch_proto::{BatchEnd, BatchStatus, Counts, Phase, codes, workflow_id};
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{
    WorkflowDescribeOptions, WorkflowExecutionInfo, WorkflowExecutionStatus,
    WorkflowFetchHistoryOptions, WorkflowGetResultOptions, WorkflowHandle,
};

use super::{absolute, check_batch_id, run};
use crate::cli::BatchRef;
use crate::exit::{CliError, CliResult, Exit};
use crate::render;

pub fn open(r: &BatchRef) -> CliResult<(Bundle, Plan)> {
    check_batch_id(&r.batch_id)?;
    let bundle = Bundle::new(&absolute(&r.output_dir)?, &r.batch_id);
    if !bundle.exists() {
        return Err(CliError::usage(format!(
            "failed to find batch {}: no bundle at {} (check --batch-id and --output-dir)",
            r.batch_id,
            bundle.root().display()
        )));
    }
    let plan = bundle.read_plan()?;
    Ok((bundle, plan))
}

pub async fn status(r: &BatchRef) -> CliResult {
    let (bundle, plan) = open(r)?;
    let engine = run::connect(&absolute(&r.output_dir)?, &r.engine).await?;
    let handle: WorkflowHandle<_, BatchWorkflow> = engine
        .client
        .get_workflow_handle(workflow_id(&plan.batch_id));
    let (status, live, end) = match handle.describe(WorkflowDescribeOptions::default()).await {
        Ok(d) if d.status() == WorkflowExecutionStatus::Running => {
            let q = tokio::time::timeout(Duration::from_secs(5), run::query_status(&handle)).await;
            match q {
                Ok(Ok(s)) => (s, true, None),
                // Running but no worker answers (its runner died): show the bundle's view.
                _ => (from_bundle(&bundle, &plan, Phase::Running)?, true, None),
            }
        }
        Ok(_) => match handle.get_result(WorkflowGetResultOptions::default()).await {
            Ok(o) => (o.status, false, Some(o.end)),
            Err(_) => (from_bundle(&bundle, &plan, Phase::Finished)?, false, None),
        },
        Err(_) => (from_bundle(&bundle, &plan, Phase::Finished)?, false, None),
    };
    if r.json {
        let v = serde_json::json!({ "live": live, "end": end, "status": status });
        say!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
    } else {
        render::status(&plan, &status, live);
        if let Some(end) = end {
            let how = match end {
                BatchEnd::Completed => "completed",
                BatchEnd::Drained => "drained (resume continues it)",
                BatchEnd::Cancelled => "cancelled",
            };
            say!("  last run ended: {how}");
        }
    }
    Ok(Exit::Success)
}

/// Status as the bundle's per-case records show it.
fn from_bundle(bundle: &Bundle, plan: &Plan, phase: Phase) -> CliResult<BatchStatus> {
    let a = casebatch_bundle::summary::assemble(bundle, plan)?;
    let get = |k: &str| a.summary.counts.get(k).copied().unwrap_or(0) as u32;
    Ok(BatchStatus {
        batch_id: plan.batch_id.clone(),
        phase,
        counts: Counts {
            queued: get("queued") + get("retrying") + get("running"),
            running: 0,
            succeeded: get("succeeded"),
            failed: get("failed"),
            cancelled: get("cancelled"),
        },
        concurrency: plan.settings.concurrency,
        ..BatchStatus::default()
    })
}

pub async fn report(r: &BatchRef) -> CliResult {
    let (bundle, plan) = open(r)?;
    let summary = write_batch_files(&bundle, &plan)?;
    let attempts = casebatch_bundle::summary::assemble(&bundle, &plan)?.attempts;
    let redispatched = attempts
        .iter()
        .filter(|a| {
            a.summary
                .failure
                .as_ref()
                .is_some_and(|f| f.code == codes::JOB_LOST)
        })
        .count();
    if r.json {
        let v = serde_json::json!({ "summary": summary, "redispatched": redispatched });
        say!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
    } else {
        render::report(&plan, &summary, redispatched);
    }
    Ok(Exit::Success)
}

pub async fn history(r: &BatchRef, run_id: Option<String>, out: &std::path::Path) -> CliResult {
    let (_bundle, plan) = open(r)?;
    let engine = run::connect(&absolute(&r.output_dir)?, &r.engine).await?;
    let info = WorkflowExecutionInfo::builder()
        .namespace(engine.namespace.clone())
        .workflow_id(workflow_id(&plan.batch_id))
        .maybe_run_id(run_id)
        .build();
    let handle: WorkflowHandle<_, BatchWorkflow> = WorkflowHandle::new(engine.client.clone(), info);
    let json = handle
        .fetch_history(WorkflowFetchHistoryOptions::default())
        .to_json()
        .await
        .map_err(|e| CliError::engine(format!("failed to fetch the history: {e}")))?;
    std::fs::write(out, json)
        .map_err(|e| CliError::usage(format!("failed to write {}: {e}", out.display())))?;
    say!(
        "wrote the history of {} to {}",
        workflow_id(&plan.batch_id),
        out.display()
    );
    Ok(Exit::Success)
}
