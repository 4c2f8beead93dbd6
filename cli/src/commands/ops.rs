//! `batch drain | pause | unpause | cancel | supersede | set-concurrency | set-share`: operations on the running batch
//! workflow, checked by its validators (a refusal exits 2).

use casebatch_control::Applied;
pub use casebatch_control::Control;
use casebatch_views::{ControlView, Effect};

use crate::cli::BatchRef;
use crate::exit::{CliResult, Exit};

pub async fn control(r: &BatchRef, control: Control) -> CliResult {
    let location = r.location()?;
    let applied = casebatch_control::control(&location, &r.engine.choice(), control).await?;
    let what = match (control, applied) {
        (_, Applied::Signalled) => {
            "no worker answered, so it was sent as a signal: it takes effect when a worker runs \
             the batch (`casebatch batch resume` hosts one)"
                .to_string()
        }
        (Control::SetConcurrency(after), Applied::Concurrency { before }) => {
            format!("concurrency {before} → {after}; lowering it lets running cases finish")
        }
        (Control::Drain, _) => {
            "drain requested: admitted cases finish, queued ones wait for resume".to_string()
        }
        (Control::Pause, _) => "paused: no new admissions until unpause".to_string(),
        (Control::Unpause, _) => "unpaused: admissions restart".to_string(),
        (Control::Cancel, _) => {
            "cancel requested: in-flight cases are cancelled and cleaned up".to_string()
        }
        (Control::Supersede, _) => "superseded: admissions stopped and its running jobs are being \
             killed; finished work stays, killed cases wait for `batch resume` or \
             `batch run --supersede`"
            .to_string(),
        (Control::SetConcurrency(after), _) => format!("concurrency set to {after}"),
        (Control::SetShare(to), Applied::Share { before }) => format!(
            "priority {} → {}, weight {} → {} on its shared runtimes; its next waiting cases \
             are queued by them",
            before.priority, to.priority, before.weight, to.weight
        ),
        (Control::SetShare(to), _) => {
            format!("priority {}, weight {}", to.priority, to.weight)
        }
    };
    if r.json {
        crate::render::json(&ControlView {
            batch_id: location.batch_id.clone(),
            operation: operation(control).into(),
            effect: effect(control, applied),
            message: what,
        });
    } else {
        say!("batch {}: {what}", location.batch_id);
    }
    Ok(Exit::Success)
}

/// The operation's subcommand name.
fn operation(control: Control) -> &'static str {
    match control {
        Control::Drain => "drain",
        Control::Pause => "pause",
        Control::Unpause => "unpause",
        Control::Cancel => "cancel",
        Control::SetConcurrency(_) => "set-concurrency",
        Control::SetShare(_) => "set-share",
        Control::Supersede => "supersede",
    }
}

fn effect(control: Control, applied: Applied) -> Effect {
    match (control, applied) {
        (_, Applied::Signalled) => Effect::Signalled,
        (Control::SetConcurrency(after), Applied::Concurrency { before }) => {
            Effect::Concurrency { before, after }
        }
        (Control::SetShare(after), Applied::Share { before }) => Effect::Share { before, after },
        (_, Applied::Share { before }) => Effect::Share {
            before,
            after: before,
        },
        (_, Applied::Concurrency { before }) => Effect::Concurrency {
            before,
            after: before,
        },
        (_, Applied::Phase(phase)) => Effect::Phase { phase },
    }
}
