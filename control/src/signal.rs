//! Drain, pause, unpause and cancel: signals to a running batch's workflow. The same signals
//! can be sent with `temporal workflow signal --workflow-id casebatch-<id> --name drain`.

use casebatch_workflows::BatchWorkflow;
use temporalio_client::WorkflowSignalOptions;

use crate::drive::Presence;
use crate::error::{ControlError, Result};
use crate::location::{Attached, BatchLocation, EngineChoice};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Admit nothing new; admitted cases finish, queued ones wait for resume.
    Drain,
    /// No new admissions until unpause.
    Pause,
    Unpause,
    /// In-flight cases are cancelled and cleaned up.
    Cancel,
}

impl Signal {
    fn verb(self) -> &'static str {
        match self {
            Signal::Drain => "drain",
            Signal::Pause => "pause",
            Signal::Unpause => "unpause",
            Signal::Cancel => "cancel",
        }
    }
}

/// Sends the signal to the batch's running workflow; refused when it is not running.
pub async fn signal(location: &BatchLocation, engine: &EngineChoice, signal: Signal) -> Result<()> {
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
            action: signal.verb(),
        });
    }
    let opts = WorkflowSignalOptions::default;
    let sent = match signal {
        Signal::Drain => handle.signal(BatchWorkflow::drain, (), opts()).await,
        Signal::Pause => handle.signal(BatchWorkflow::pause, (), opts()).await,
        Signal::Unpause => handle.signal(BatchWorkflow::unpause, (), opts()).await,
        Signal::Cancel => handle.signal(BatchWorkflow::cancel, (), opts()).await,
    };
    let wid = &handle.info().workflow_id;
    sent.map_err(|e| ControlError::engine_call(format!("signal {wid}"), e))
}
