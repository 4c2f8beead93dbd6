//! Drain, pause, unpause, cancel, set-concurrency and set-share on a running batch.
//!
//! Each is sent as a Temporal update: the batch's validator checks it first, so an invalid
//! request (unpause a batch that is not paused, a limit outside 1..=512) is refused instead of
//! silently accepted. The same operations stay accepted as signals, unchecked, for
//! `temporal workflow signal --name drain` and older CLIs. An update needs a worker to answer;
//! when none does in time, the operation is sent as a signal, which the batch applies when a
//! worker next runs it.

use std::time::Duration;

use casebatch_proto::Phase;
use casebatch_proto::share::ShareChange;
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{
    WorkflowExecuteUpdateOptions, WorkflowGetResultOptions, WorkflowSignalOptions,
    errors::{WorkflowGetResultError, WorkflowUpdateError},
};

use crate::error::{ControlError, Result};
use crate::location::{Attached, BatchLocation, EngineChoice};
use crate::workflow::{Handle, Presence};

/// How long an update may wait for a worker before it is sent as a signal instead.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Admit nothing new; admitted cases finish, queued ones wait for resume.
    Drain,
    /// No new admissions until unpause.
    Pause,
    Unpause,
    /// In-flight cases are cancelled and cleaned up.
    Cancel,
    /// A new active case limit, taking effect at once.
    SetConcurrency(u32),
    /// A new priority and weight on shared runtimes, for the batch's next asks.
    SetShare(ShareChange),
    /// Admissions stop, the batch's running jobs are killed on every runtime, finished work
    /// stays and killed cases are queued again; the run ends as superseded.
    Supersede,
}

impl Control {
    fn verb(self) -> &'static str {
        match self {
            Control::Drain => "drain",
            Control::Pause => "pause",
            Control::Unpause => "unpause",
            Control::Cancel => "cancel",
            Control::Supersede => "supersede",
            Control::SetConcurrency(_) => "set the concurrency of",
            Control::SetShare(_) => "set the share of",
        }
    }

    /// The operation's name (the CLI's subcommand).
    fn name(self) -> &'static str {
        match self {
            Control::SetConcurrency(_) => "set-concurrency",
            Control::SetShare(_) => "set-share",
            other => other.verb(),
        }
    }
}

/// What the batch did with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Applied; the batch is now in this phase.
    Phase(Phase),
    /// The limit changed from `before`.
    Concurrency { before: u32 },
    /// Priority and weight changed from `before`.
    Share { before: ShareChange },
    /// No worker answered within the wait: sent as a signal, applied when one runs the batch.
    Signalled,
}

/// Sends the operation to the batch's running workflow; refused when it is not running, or
/// when its validator says no.
pub async fn control(
    location: &BatchLocation,
    engine: &EngineChoice,
    control: Control,
) -> Result<Applied> {
    let Attached {
        plan,
        handle,
        presence,
        // Held to the end: dropping the engine stops an embedded server this command started.
        engine: _engine,
        ..
    } = location.attach(engine).await?;
    if presence != Presence::Running {
        return Err(ControlError::NotRunning {
            batch_id: plan.batch_id,
            action: control.verb(),
        });
    }
    apply(&handle, &plan.batch_id, control).await
}

/// Supersedes the running run of a batch (already checked to be this plan's), then waits
/// until that run has ended: its jobs killed, its cleanups done.
pub(crate) async fn supersede_and_wait(handle: &Handle, batch_id: &str) -> Result<()> {
    apply(handle, batch_id, Control::Supersede).await?;
    let wid = handle.info().workflow_id.clone();
    match handle.get_result(WorkflowGetResultOptions::default()).await {
        Ok(_) | Err(WorkflowGetResultError::Terminated { .. }) => Ok(()),
        Err(e) => Err(ControlError::engine_call(
            format!("wait for the superseded run of {wid}"),
            e,
        )),
    }
}

/// The operation as a checked update; as a signal when no worker answers in time.
async fn apply(handle: &Handle, batch_id: &str, control: Control) -> Result<Applied> {
    let opts = WorkflowExecuteUpdateOptions::default;
    let update = async {
        match control {
            Control::Drain => handle
                .execute_update(BatchWorkflow::drain_checked, (), opts())
                .await
                .map(Applied::Phase),
            Control::Pause => handle
                .execute_update(BatchWorkflow::pause_checked, (), opts())
                .await
                .map(Applied::Phase),
            Control::Unpause => handle
                .execute_update(BatchWorkflow::unpause_checked, (), opts())
                .await
                .map(Applied::Phase),
            Control::Cancel => handle
                .execute_update(BatchWorkflow::cancel_checked, (), opts())
                .await
                .map(Applied::Phase),
            Control::Supersede => handle
                .execute_update(BatchWorkflow::supersede_checked, (), opts())
                .await
                .map(Applied::Phase),
            Control::SetConcurrency(limit) => handle
                .execute_update(BatchWorkflow::set_concurrency, limit, opts())
                .await
                .map(|before| Applied::Concurrency { before }),
            Control::SetShare(to) => handle
                .execute_update(BatchWorkflow::set_share, to, opts())
                .await
                .map(|before| Applied::Share { before }),
        }
    };
    let wid = handle.info().workflow_id.clone();
    match tokio::time::timeout(ANSWER_WITHIN, update).await {
        Ok(Ok(applied)) => Ok(applied),
        Ok(Err(WorkflowUpdateError::Failed(failure))) => Err(ControlError::Refused {
            batch_id: batch_id.to_string(),
            action: control.name(),
            reason: failure.message,
        }),
        Ok(Err(e)) => Err(ControlError::engine_call(format!("update {wid}"), e)),
        Err(_elapsed) => {
            let opts = WorkflowSignalOptions::default;
            let sent = match control {
                Control::Drain => handle.signal(BatchWorkflow::drain, (), opts()).await,
                Control::Pause => handle.signal(BatchWorkflow::pause, (), opts()).await,
                Control::Unpause => handle.signal(BatchWorkflow::unpause, (), opts()).await,
                Control::Cancel => handle.signal(BatchWorkflow::cancel, (), opts()).await,
                Control::Supersede => handle.signal(BatchWorkflow::supersede, (), opts()).await,
                Control::SetConcurrency(limit) => {
                    handle
                        .signal(BatchWorkflow::set_concurrency_signal, limit, opts())
                        .await
                }
                // Checked only: a priority out of range must be refused, not clamped.
                Control::SetShare(_) => {
                    return Err(ControlError::Refused {
                        batch_id: batch_id.to_string(),
                        action: control.name(),
                        reason: format!(
                            "no worker answered within {ANSWER_WITHIN:?}, and a share change \
                             is applied by a worker only: retry once the batch's worker runs"
                        ),
                    });
                }
            };
            sent.map_err(|e| ControlError::engine_call(format!("signal {wid}"), e))?;
            Ok(Applied::Signalled)
        }
    }
}
