//! Bundle writes of a stage: a full disk waited out (no fault of the attempt), a write the
//! worker's user may not make refused as the config failure it is.

use std::path::Path;

use casebatch_bundle::BundleError;
use casebatch_proto::{Failure, FailureCode, Stage};
use temporalio_sdk::activities::ActivityError;

use super::context::{classified, heartbeating};
use crate::beats::StageContext;

/// A write the bundle refused because of who the worker runs as (permissions, a read-only
/// mount): a config failure naming the path and the worker's uid, never retried (the same
/// user fails the same way). Other write errors are not classified here.
pub(crate) fn refused_write(stage: Stage, path: &Path, e: &std::io::Error) -> Option<Failure> {
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
    use std::os::unix::fs::MetadataExt;
    if !matches!(e.kind(), PermissionDenied | ReadOnlyFilesystem) {
        return None;
    }
    // /proc/self belongs to the process's effective uid and gid.
    let who = std::fs::metadata("/proc/self")
        .map(|m| format!("uid {}, gid {}", m.uid(), m.gid()))
        .unwrap_or_else(|_| "uid unknown".into());
    Some(Failure::config(
        stage,
        FailureCode::BundleUnwritable,
        format!(
            "the worker ({who}) cannot write {}: {e}; give that user write access to the \
             output directory (casebatch's images run as uid 10001), or run the worker as its owner",
            path.display()
        ),
    ))
}

/// A write that failed for want of space (or of quota): the disk's state, not the attempt's.
fn out_of_space(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    matches!(e.kind(), StorageFull | QuotaExceeded)
}

/// Pauses between tries of a bundle write the disk had no space for: 1 s, growing to 5 s.
const SPACE_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
const SPACE_MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `write` until it does not fail for want of space, heartbeating while it waits; raises
/// a cancel when the activity is cancelled meanwhile. A full disk is no fault of the attempt:
/// failing it would spend the case's attempts (or fail the case, which `resume` does not run
/// again), while the runner stops the run on a full disk, its worker hands this activity
/// back, and the engine's retry of it writes once space is back.
pub(crate) async fn with_space<T>(
    ctx: &StageContext,
    mut write: impl FnMut() -> Result<T, BundleError>,
) -> Result<Result<T, BundleError>, ActivityError> {
    let path = match write() {
        Err(BundleError::Write { path, source }) if out_of_space(&source) => {
            tracing::warn!(%path, error = %source, "no space for the bundle: waiting for space");
            path
        }
        written => return Ok(written),
    };
    let waited = async {
        let mut pause = SPACE_FIRST_PAUSE;
        loop {
            tokio::select! {
                _ = ctx.cancelled() => return Err(ActivityError::cancelled()),
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(SPACE_MAX_PAUSE);
            match write() {
                Err(BundleError::Write { source, .. }) if out_of_space(&source) => {}
                written => return Ok(written),
            }
        }
    };
    let written = heartbeating(ctx, (), waited).await;
    if written.is_ok() {
        tracing::info!(%path, "space is back: written");
    } else {
        tracing::info!(%path, "no space yet: the write is left to the engine's retry");
    }
    written
}

/// A bundle write of `stage`: a full disk waited out ([`with_space`]), a refusal raised as
/// the config failure it is.
pub(crate) async fn bundle_write<T>(
    ctx: &StageContext,
    stage: Stage,
    write: impl FnMut() -> Result<T, BundleError>,
) -> Result<T, ActivityError> {
    match with_space(ctx, write).await? {
        Err(BundleError::Write { path, source }) => {
            Err(match refused_write(stage, Path::new(&path), &source) {
                Some(f) => classified(&f),
                None => BundleError::Write { path, source }.into(),
            })
        }
        other => Ok(other?),
    }
}

/// Creates a directory of the bundle, its error the write error it is.
pub(crate) fn make_dir(dir: &Path) -> Result<(), BundleError> {
    std::fs::create_dir_all(dir).map_err(|source| BundleError::Write {
        path: dir.display().to_string(),
        source,
    })
}
