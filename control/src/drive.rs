//! One run of a batch on its engine: the tail that `run`, `resume`, `rerun` and
//! `retry-failed` share once the bundle holds the batch's input files.
//!
//! start or attach (`begin.rs`) → follow (`follow.rs`), hosted beside a worker and a watch
//! on free space (`host.rs`), then the run's end recorded in the bundle (`finish.rs`).

use casebatch_bundle::Bundle;
use casebatch_manifest::Plan;
use casebatch_worker::Engine;

use crate::begin::{Begun, begin};
use crate::error::Result;
use crate::events::{DriveEvent, Observer};
use crate::finish::{RunReport, finish};
use crate::follow::follow;
use crate::host::hosted;
use crate::options::DriveOptions;
use crate::workflow;

/// Drives the batch through one run of its workflow and records how it ended.
pub(crate) async fn drive(
    mut engine: Engine,
    bundle: Bundle,
    plan: Plan,
    opts: DriveOptions,
    observer: &mut dyn Observer,
) -> Result<RunReport> {
    let handle = workflow::handle(&engine.client, &plan);
    let head = plan.head();
    let ui = engine.embedded.as_ref().and_then(|s| s.ui_address());
    let run = async {
        observer.on(DriveEvent::Batch(&head));
        if let Some(ui) = &ui {
            observer.on(DriveEvent::EngineUi(ui));
        }
        let begun = begin(&handle, &bundle, &plan, &opts, observer).await?;
        // Begun, the cases' specs are the workers' to read from the bundle: a 100,000-case
        // plan held whole for the hours a batch runs was most of a runner's memory.
        drop(plan);
        match begun {
            Begun::Following => follow(&handle, observer).await.map(Some),
            Begun::AlreadyComplete => Ok(None),
        }
    };
    let ran = hosted(&mut engine, &bundle, &head.batch_id, &opts, run).await?;
    finish(bundle, head, ran)
}
