//! Retention (`--keep-ended`): an ended job's row and attempt directory stay for a while after
//! the job ended, so a worker that was away can still fetch its files and clean it up; then
//! both are removed, so a long-lived agent's table and disk hold what ran recently, not
//! everything it ever ran. A job that nobody cleaned up is cleaned up first: whatever it left
//! running is killed before its record goes.
//!
//! Order, so that a crash loses nothing and leaks nothing: clean up, remove the attempt
//! directory, then (under the table lock) delete the row and, when no row of its batch
//! directory is left, that directory. A submit to the same directory inserts its row under the
//! same lock before it creates anything, so the directory is never removed under it.

use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Duration;

use crate::jobs::{JobError, Jobs, now_ms};
use crate::table::{self, JobRow};

/// Default of `--keep-ended`: a week, longer than any worker outage a batch rides out.
pub const DEFAULT_KEEP_ENDED: Duration = Duration::from_secs(7 * 24 * 3600);
/// Rows looked at per table call: the lock is released between batches of this many.
const PER_ROUND: u32 = 500;

/// `--keep-ended`: `forever`, or a whole number with a unit (`s`, `m`, `h`, `d`).
pub fn parse_keep_ended(value: &str) -> Result<Option<Duration>, String> {
    if value == "forever" {
        return Ok(None);
    }
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 24 * 3600,
        _ => 0,
    };
    match number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(seconds))
    {
        Some(0) if seconds > 0 => Err(format!(
            "--keep-ended {value:?}: ended jobs are kept at least 1s; to keep them all, say forever"
        )),
        Some(secs) if seconds > 0 => Ok(Some(Duration::from_secs(secs))),
        _ => Err(format!(
            "--keep-ended {value:?}: give a whole number and a unit (30m, 12h, 7d) or forever"
        )),
    }
}

/// How often to look: a job outlives its time by at most a quarter of it, and never by more
/// than an hour.
fn period(keep: Duration) -> Duration {
    (keep / 4).clamp(Duration::from_millis(250), Duration::from_secs(3600))
}

/// Removes ended jobs older than `keep` until the agent stops (the task is dropped then).
pub(crate) async fn run(jobs: Arc<Jobs>, keep: Duration) {
    loop {
        match prune(&jobs, keep).await {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed {n} jobs that ended over {keep:?} ago (--keep-ended)"),
            Err(e) => tracing::warn!("failed to remove old ended jobs: {e}"),
        }
        tokio::time::sleep(period(keep)).await;
    }
}

/// One pass: every job that ended over `keep` ago. Returns how many were removed.
async fn prune(jobs: &Jobs, keep: Duration) -> Result<u64, JobError> {
    let cutoff = now_ms().saturating_sub(keep.as_millis() as u64);
    let mut removed = 0;
    let mut after = (0, String::new());
    loop {
        let from = after.clone();
        let rows = jobs
            .table()
            .with(move |conn| table::ended_before(conn, cutoff, (from.0, &from.1), PER_ROUND))
            .await?;
        let done = rows.len() < PER_ROUND as usize;
        for row in rows {
            after = (row.ended_at_ms.unwrap_or(0), row.job_key.clone());
            if remove(jobs, row).await? {
                removed += 1;
                jobs.count_pruned(1);
            }
        }
        if done {
            return Ok(removed);
        }
    }
}

async fn remove(jobs: &Jobs, row: JobRow) -> Result<bool, JobError> {
    if row.cleanup_receipt.is_none() {
        match row.env() {
            Ok(env) => {
                let receipt = jobs.exec(&env).cleanup(&env).await;
                if !receipt.cleanup_confirmed {
                    // Kept: its record is how the next pass finds what is still alive.
                    tracing::warn!(job = %row.job_key, "not removed: {}", receipt.message);
                    return Ok(false);
                }
            }
            Err(e) => tracing::warn!(job = %row.job_key, "removed without cleanup: {e}"),
        }
    }
    let batches = jobs.batches();
    let attempt = Path::new(&row.attempt_dir);
    let local = Path::new(&row.local_bundle);
    let inside = |p: &Path| {
        p.strip_prefix(batches)
            .is_ok_and(|rest| rest.components().all(|c| matches!(c, Component::Normal(_))))
    };
    if inside(attempt) {
        remove_dir(attempt);
    } else {
        tracing::warn!(job = %row.job_key, "{} is outside {}: left in place", attempt.display(), batches.display());
    }
    let local_inside = inside(local) && local != batches;
    let (key, batch_id, local) = (row.job_key, row.batch_id, row.local_bundle.clone());
    jobs.table()
        .with(move |conn| {
            let deleted = table::delete_ended(conn, &key)?;
            if local_inside && !table::bundle_in_use(conn, &batch_id, &local)? {
                remove_dir(Path::new(&local));
            }
            Ok(deleted)
        })
        .await
        .map_err(JobError::from)
}

/// Removes a directory tree; one already gone is fine.
fn remove_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!("failed to remove {}: {e}", dir.display());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_ended_reads_units_and_forever_and_refuses_the_rest() {
        let secs = |s| Ok(Some(Duration::from_secs(s)));
        assert_eq!(parse_keep_ended("45s"), secs(45));
        assert_eq!(parse_keep_ended("30m"), secs(1800));
        assert_eq!(parse_keep_ended("12h"), secs(43_200));
        assert_eq!(parse_keep_ended("7d"), secs(604_800));
        assert_eq!(parse_keep_ended("forever"), Ok(None));
        for bad in [
            "",
            "7",
            "d",
            "7w",
            "1.5h",
            "-1d",
            "0s",
            "99999999999999999999d",
        ] {
            assert!(parse_keep_ended(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_keep_ended("0s").unwrap_err().contains("forever"));
    }

    #[test]
    fn passes_come_a_quarter_of_the_time_apart_at_most_hourly() {
        assert_eq!(period(DEFAULT_KEEP_ENDED), Duration::from_secs(3600));
        assert_eq!(period(Duration::from_secs(60)), Duration::from_secs(15));
        assert_eq!(period(Duration::from_secs(1)), Duration::from_millis(250));
    }
}
