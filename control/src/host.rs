//! Where a run is followed: beside a worker hosted in this process (unless the work is left
//! to replicas) and a watch on free space, with an embedded engine this process started
//! stopped at the end.

use std::future::Future;
use std::path::Path;

use casebatch_bundle::Bundle;
use casebatch_worker::{Engine, host_until};

use crate::error::{ControlError, Result};
use crate::options::DriveOptions;
use crate::space::SpaceWatch;

/// Runs `work` to its end, hosting a worker unless told otherwise, then stops an embedded
/// engine this process started. A file system the run writes to running out of space ends
/// it (see `space.rs`), also before it starts.
pub(crate) async fn hosted<T>(
    engine: &mut Engine,
    bundle: &Bundle,
    batch_id: &str,
    opts: &DriveOptions,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    let engine_dir = engine
        .embedded
        .as_ref()
        .and_then(|s| s.log.parent().map(Path::to_path_buf));
    let space = SpaceWatch::new(bundle.root(), batch_id, engine_dir);
    space.check()?;
    // Watched beside the work, not between its calls: a call to a dead engine can take many
    // seconds of retries, and a full disk is what keeps an embedded engine dead.
    let watched = async {
        tokio::select! {
            done = work => done,
            full = space.watch() => Err(full),
        }
    };
    let done = if opts.without_worker {
        watched.await
    } else {
        host_until(engine.client.clone(), opts.metrics.as_ref(), watched)
            .await
            .map_err(|e| ControlError::engine_call("host the worker", e))?
    };
    if let Some(server) = engine.embedded.as_mut() {
        server.stop();
    }
    done
}
