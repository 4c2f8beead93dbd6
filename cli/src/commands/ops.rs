//! `batch drain | pause | unpause | cancel`: signals to the running batch workflow.

pub use casebatch_control::Signal;

use crate::cli::BatchRef;
use crate::exit::{CliResult, Exit};

pub async fn signal(r: &BatchRef, signal: Signal) -> CliResult {
    let location = r.location()?;
    casebatch_control::signal(&location, &r.engine.choice(), signal).await?;
    let what = match signal {
        Signal::Drain => "drain requested: admitted cases finish, queued ones wait for resume",
        Signal::Pause => "paused: no new admissions until unpause",
        Signal::Unpause => "unpaused: admissions restart",
        Signal::Cancel => "cancel requested: in-flight cases are cancelled and cleaned up",
    };
    say!("batch {}: {what}", location.batch_id);
    Ok(Exit::Success)
}
