//! `batch drain | pause | unpause | cancel`: signals to the running batch workflow. The same
//! signals can be sent with `temporal workflow signal --workflow-id casebatch-<id> --name drain`.

use casebatch_proto::workflow_id;
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{
    WorkflowDescribeOptions, WorkflowExecutionStatus, WorkflowHandle, WorkflowSignalOptions,
};

use super::{absolute, run, status};
use crate::cli::BatchRef;
use crate::exit::{CliError, CliResult, Exit};

#[derive(Debug, Clone, Copy)]
pub enum Op {
    Drain,
    Pause,
    Unpause,
    Cancel,
}

pub async fn signal(r: &BatchRef, op: Op) -> CliResult {
    let (_bundle, plan) = status::open(r)?;
    let engine = run::connect(&absolute(&r.output_dir)?, &r.engine).await?;
    let wid = workflow_id(&plan.batch_id);
    let handle: WorkflowHandle<_, BatchWorkflow> = engine.client.get_workflow_handle(wid.clone());
    let running = handle
        .describe(WorkflowDescribeOptions::default())
        .await
        .map(|d| d.status() == WorkflowExecutionStatus::Running)
        .unwrap_or(false);
    if !running {
        return Err(CliError::usage(format!(
            "failed to {op:?} batch {}: it is not running (see `casebatch batch status`)",
            plan.batch_id
        )));
    }
    let opts = WorkflowSignalOptions::default;
    let sent = match op {
        Op::Drain => handle.signal(BatchWorkflow::drain, (), opts()).await,
        Op::Pause => handle.signal(BatchWorkflow::pause, (), opts()).await,
        Op::Unpause => handle.signal(BatchWorkflow::unpause, (), opts()).await,
        Op::Cancel => handle.signal(BatchWorkflow::cancel, (), opts()).await,
    };
    sent.map_err(|e| CliError::engine(format!("failed to signal {wid}: {e}")))?;
    let what = match op {
        Op::Drain => "drain requested: admitted cases finish, queued ones wait for resume",
        Op::Pause => "paused: no new admissions until unpause",
        Op::Unpause => "unpaused: admissions restart",
        Op::Cancel => "cancel requested: in-flight cases are cancelled and cleaned up",
    };
    say!("batch {}: {what}", plan.batch_id);
    Ok(Exit::Success)
}
