//! What a Slurm job's end means for its attempt: Slurm's state first (a kill by the memory
//! limit, the time limit, a node lost, a cancel), then the harness's own exit status, which the
//! wrapper wrote into the attempt's journal, classified as on a worker's host.

use std::time::Duration;

use casebatch_attempt::{Attempt, attempt_files, harness};
use casebatch_proto::{ActorReport, Failure, FailureCode, Stage};

use crate::queue::Job;
use crate::script::{DIR_NOT_SHARED, time_limit_minutes};

/// The report of a job that ended as `job` says. A kill by the memory or time limit is
/// Slurm's to tell; otherwise, once the harness ran to its end (the wrapper wrote its exit
/// status), its own result stands, whatever Slurm did to the job afterwards (a node lost, or a
/// controller that recovered a finished job after a crash and cancelled it).
pub(crate) async fn ended(a: &Attempt, job: &Job) -> ActorReport {
    let exit = a.journal().ok().and_then(|j| j.exit);
    let named = format!("Slurm job {} on {}", job.id, display_nodes(&job.nodes));
    let infra =
        |code, message| ActorReport::failed(Failure::infra(Stage::Await, code, message), exit);
    let mut report = match (job.state.as_str(), exit) {
        ("OUT_OF_MEMORY", _) => ActorReport::failed(Failure::oom(a.memory_mb()), exit),
        ("TIMEOUT" | "DEADLINE", _) => infra(
            FailureCode::Timeout,
            format!(
                "{named} ran past its time limit of {} min (timeout_seconds {}, rounded up to \
                 Slurm's minutes)",
                time_limit_minutes(a.job.timeout_seconds.max(1)),
                a.job.timeout_seconds
            ),
        ),
        (_, Some(code)) => classify(a, code).await,
        ("NODE_FAIL" | "BOOT_FAIL" | "PREEMPTED", None) => infra(
            FailureCode::NodeFailed,
            format!("{named} ended {}: the node, not the case", job.state),
        ),
        ("CANCELLED", None) => infra(
            FailureCode::SchedulerCancelled,
            format!("{named} was cancelled in Slurm by someone other than casebatch"),
        ),
        (_, None) if job.exit_code == Some(i64::from(DIR_NOT_SHARED)) => ActorReport::failed(
            Failure::config(
                Stage::Await,
                FailureCode::SpawnFailed,
                format!(
                    "{named} could not see the attempt directory {}: casebatch's output \
                     directory must be mounted at the same path on every node (see the job's \
                     {})",
                    a.dir.display(),
                    attempt_files::STDERR
                ),
            ),
            None,
        ),
        (_, None) => infra(
            FailureCode::SpawnFailed,
            format!(
                "{named} ended {} (exit {}) before the harness ran to its end",
                job.state,
                job.exit_code.map_or("unknown".into(), |c| c.to_string())
            ),
        ),
    };
    report.memory_limit_mb = a.memory_mb();
    report.logs_capped = casebatch_attempt::logs::cap_attempt(a).map(Box::new);
    report
}

/// The report of a job Slurm has forgotten whose harness ended with `exit` (its journal).
pub(crate) async fn harvested(a: &Attempt, exit: i32) -> ActorReport {
    let mut r = classify(a, exit).await;
    r.logs_capped = casebatch_attempt::logs::cap_attempt(a).map(Box::new);
    r
}

async fn classify(a: &Attempt, exit: i32) -> ActorReport {
    let mut r = harness::classify(
        exit,
        &a.file(attempt_files::RESULT),
        &a.file(attempt_files::STDERR),
    )
    .await;
    r.memory_limit_mb = a.memory_mb();
    r
}

/// A job neither Slurm nor the journal can account for.
pub(crate) fn lost(a: &Attempt, why: &str) -> ActorReport {
    ActorReport::failed(
        Failure::infra(
            Stage::Await,
            FailureCode::JobLost,
            format!("attempt {} of case {}: {why}", a.key.attempt, a.job.case_id),
        ),
        None,
    )
}

/// Slurm did not answer for `waited`.
pub(crate) fn unreachable(why: &str, waited: Duration) -> ActorReport {
    ActorReport::failed(
        Failure::infra(
            Stage::Await,
            FailureCode::RuntimeUnreachable,
            format!("Slurm did not answer for {} s: {why}", waited.as_secs()),
        ),
        None,
    )
}

fn display_nodes(nodes: &str) -> &str {
    if nodes.is_empty() { "no node" } else { nodes }
}
