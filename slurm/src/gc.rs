//! Stopping casebatch's Slurm jobs by name or by batch, and `casebatch sandbox gc --slurm`:
//! the jobs of closed attempts or deleted bundles that nothing will stop any more. A dry run
//! by default (a maintenance operation lists first); only this user's jobs are cancelled.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use casebatch_attempt::AttemptJournal;
use serde::Serialize;

use crate::commands;
use crate::queue::{Job, Queue};

/// Cancels the job(s) named `name`, best effort (cleanup checks what became of them).
pub(crate) async fn cancel(name: &str) {
    let args = [format!("--name={name}")];
    match commands::run("scancel", &args, None, None).await {
        Ok(said) if said.ok => {}
        Ok(said) => tracing::warn!(job = name, "scancel failed: {}", said.complaint()),
        Err(e) => tracing::warn!(job = name, "scancel did not run: {e:?}"),
    }
}

async fn cancel_ids(ids: &[String]) -> Result<(), String> {
    if ids.is_empty() {
        return Ok(());
    }
    match commands::run("scancel", ids, None, None).await {
        Ok(said) if said.ok => Ok(()),
        Ok(said) => Err(format!("scancel failed: {}", said.complaint())),
        Err(e) => Err(format!("scancel did not run: {e:?}")),
    }
}

/// Cancels the jobs of batch `batch_id` under `bundle_dir` that have not ended; returns their
/// names.
pub(crate) async fn kill_batch(
    queue: &Queue,
    batch_id: &str,
    bundle_dir: &str,
) -> Result<Vec<String>, String> {
    let jobs = queue.snapshot(std::time::Instant::now()).await?;
    let prefix = format!("{batch_id}/");
    let live: Vec<&Job> = jobs
        .all()
        .filter(|j| !j.has_ended())
        .filter(|j| {
            j.attempt().is_some_and(|(marker, dir)| {
                marker.starts_with(&prefix) && Path::new(dir).starts_with(bundle_dir)
            })
        })
        .collect();
    let ids: Vec<String> = live.iter().map(|j| j.id.clone()).collect();
    cancel_ids(&ids).await?;
    Ok(live
        .iter()
        .map(|j| format!("{} ({})", j.name, j.id))
        .collect())
}

/// One casebatch job Slurm knows, and what gc makes of it.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub name: String,
    pub job_id: String,
    pub marker: String,
    pub attempt_dir: String,
    pub state: String,
    /// `bundle_gone`, `attempt_closed`, `in_use`, `ended` or `not_yours`.
    pub verdict: &'static str,
    /// True when this run cancelled it (`--apply`, and garbage).
    pub cancelled: bool,
}

impl Found {
    pub fn is_garbage(&self) -> bool {
        matches!(self.verdict, "bundle_gone" | "attempt_closed")
    }
}

fn verdict(job: &Job, me: u32) -> &'static str {
    if job.user_id.is_some_and(|u| u != me) {
        return "not_yours";
    }
    if job.has_ended() {
        return "ended";
    }
    let Some((_, dir)) = job.attempt() else {
        return "in_use";
    };
    let dir = Path::new(dir);
    // `<bundle>/cases/<case>/attempts/<n>`: the bundle is four levels up.
    let bundle = dir.ancestors().nth(4);
    if bundle.is_none_or(|b| !b.is_dir()) {
        return "bundle_gone";
    }
    if AttemptJournal::read(dir).is_ok_and(|j| j.cleanup.is_some()) {
        return "attempt_closed";
    }
    "in_use"
}

/// casebatch's Slurm jobs (of batch `batch_id` only, when given), each with its verdict;
/// with `apply`, the garbage among them cancelled.
pub async fn gc(apply: bool, batch_id: Option<&str>) -> Result<Vec<Found>, String> {
    let jobs = Queue::default().snapshot(std::time::Instant::now()).await?;
    let me = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    let mut found: Vec<Found> = jobs
        .all()
        .filter(|j| {
            batch_id.is_none_or(|b| {
                j.attempt()
                    .is_some_and(|(marker, _)| marker.starts_with(&format!("{b}/")))
            })
        })
        .map(|j| {
            let (marker, dir) = j.attempt().unwrap_or(("", ""));
            Found {
                name: j.name.clone(),
                job_id: j.id.clone(),
                marker: marker.into(),
                attempt_dir: dir.into(),
                state: j.state.clone(),
                verdict: verdict(j, me),
                cancelled: false,
            }
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name).then(a.job_id.cmp(&b.job_id)));
    if apply {
        let ids: Vec<String> = found
            .iter()
            .filter(|f| f.is_garbage())
            .map(|f| f.job_id.clone())
            .collect();
        cancel_ids(&ids).await?;
        for f in found.iter_mut().filter(|f| f.is_garbage()) {
            f.cancelled = true;
        }
    }
    Ok(found)
}
