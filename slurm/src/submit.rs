//! Submitting an attempt's job exactly once across crashes and replicas, and at a pace the
//! controller takes. Slurm has no idempotent submit, so the decision is the journal's: an
//! intent is written before `sbatch` runs, under the attempt's lock, and a retried submit
//! that finds one looks for the job by name before it would submit again.
//!
//! Pace: at most [`IN_FLIGHT`] `sbatch` calls at once and [`PER_SECOND`] a second from one
//! worker process. Every `sbatch` is a process and an RPC that the controller answers under
//! its job write lock; a 512-wide batch starting at once would fork 512 of them together and
//! stall the controller for every user of the cluster. At this pace such a batch is queued in
//! Slurm in about ten seconds, a fraction of any job's run.

use std::time::{Duration, Instant};

use casebatch_attempt::local::{fault_point, lock_attempt};
use casebatch_attempt::{
    Attempt, NotStarted, RECORD_SCHEMA_VERSION, ScheduledJob, ScheduledState, now_ms,
};
use casebatch_proto::{Failure, FailureCode, Stage};

use crate::commands::{self, Unanswered};
use crate::{MIN_JOB_AGE, OnSlurm, names, record, recorded, script};

/// `sbatch` calls one worker process runs at once.
const IN_FLIGHT: usize = 4;
/// `sbatch` calls one worker process starts a second.
const PER_SECOND: u32 = 50;

/// The pace of a process's submits.
pub(crate) struct Submits {
    running: tokio::sync::Semaphore,
    next: tokio::sync::Mutex<Instant>,
}

impl Default for Submits {
    fn default() -> Self {
        Self {
            running: tokio::sync::Semaphore::new(IN_FLIGHT),
            next: tokio::sync::Mutex::new(Instant::now()),
        }
    }
}

impl Submits {
    /// Waits for this process's turn to call `sbatch`; the permit ends it.
    async fn turn(&self) -> tokio::sync::SemaphorePermit<'_> {
        let permit = self.running.acquire().await.expect("never closed");
        let mut next = self.next.lock().await;
        let now = Instant::now();
        if *next > now {
            tokio::time::sleep(*next - now).await;
        }
        *next = Instant::now().max(*next) + Duration::from_secs(1) / PER_SECOND;
        permit
    }
}

fn submit_failure(code: FailureCode, message: String) -> Failure {
    Failure::infra(Stage::Submit, code, message)
}

/// Submits `a`'s job unless it was submitted already (then it is adopted).
pub(crate) async fn submit(on: &OnSlurm<'_>, a: &Attempt) -> Result<(), NotStarted> {
    let _lock = lock_attempt(a).await?;
    let starts = match recorded(a) {
        Some(rec) if rec.job_id.is_some() => return Ok(()),
        None => 1,
        // An intent: the job may have been taken.
        Some(mut rec) => {
            match on.job(&rec, Instant::now()).await {
                Ok(Some(job)) => {
                    OnSlurm::follow(a, &mut rec, &job);
                    return Ok(());
                }
                Ok(None) => {}
                Err(why) => {
                    return Err(NotStarted {
                        failure: submit_failure(FailureCode::RuntimeUnreachable, why),
                        job_may_exist: true,
                    });
                }
            }
            let journal = a.journal().ok();
            if journal.is_some_and(|j| j.wrapper.is_some() || j.exit.is_some()) {
                // It ran, and Slurm has forgotten it: the wait harvests it.
                return Ok(());
            }
            let age = Duration::from_millis(now_ms().saturating_sub(rec.submitted_at_ms));
            if age >= MIN_JOB_AGE {
                return Err(NotStarted {
                    failure: submit_failure(
                        FailureCode::JobLost,
                        format!(
                            "job {} was being submitted {} s ago and Slurm shows no job of that \
                             name: it may have run and been forgotten, so it is not submitted \
                             again",
                            rec.name,
                            age.as_secs()
                        ),
                    ),
                    job_may_exist: true,
                });
            }
            a.event(
                "job_restarted",
                format!(
                    "submit {} of attempt {}: Slurm never took submit {} (no job named {} {} s \
                     after its intent, and nothing of it ran)",
                    rec.starts + 1,
                    a.key.attempt,
                    rec.starts,
                    rec.name,
                    age.as_secs()
                ),
            );
            rec.starts + 1
        }
    };
    let script = script::script(a)?;
    let env = script::environment(a)?;
    let mut rec = ScheduledJob {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        scheduler: "slurm".into(),
        marker: a.marker(),
        name: names::job_name(a),
        job_id: None,
        state: ScheduledState::Submitting,
        reason: None,
        node: None,
        submitted_at_ms: now_ms(),
        starts,
    };
    record(a, &rec)?;
    fault_point("before-spawn").await;
    let args = script::sbatch_args(a, &on.settings);
    let said = {
        let _turn = on.rt.submits.turn().await;
        commands::run("sbatch", &args, Some(&env), Some(&script)).await
    };
    fault_point("after-spawn").await;
    match said {
        Ok(said) if said.ok => {
            // `--parsable`: `ID` or `ID;CLUSTER`.
            let id = said.stdout.trim().split(';').next().unwrap_or_default();
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
                return Err(NotStarted {
                    failure: submit_failure(
                        FailureCode::SpawnFailed,
                        format!("sbatch answered {:?}, not a job id", said.stdout.trim()),
                    ),
                    job_may_exist: true,
                });
            }
            rec.job_id = Some(id.to_string());
            rec.state = ScheduledState::Pending;
            record(a, &rec)?;
            Ok(())
        }
        Ok(said) => Err(refused(&said.complaint())),
        Err(Unanswered::NotRun(why)) => Err(NotStarted {
            failure: Failure::config(Stage::Submit, FailureCode::SpawnFailed, why),
            job_may_exist: false,
        }),
        Err(Unanswered::TimedOut) => Err(NotStarted {
            failure: submit_failure(
                FailureCode::RuntimeUnreachable,
                format!(
                    "sbatch did not answer within {} s: the job may have been taken",
                    commands::CALL_TIMEOUT.as_secs()
                ),
            ),
            job_may_exist: true,
        }),
    }
}

/// An `sbatch` that failed saying `why`: the controller out of reach (retryable; it took
/// nothing), or a refusal of the job itself (config: the same job is refused again).
fn refused(why: &str) -> NotStarted {
    let unreachable = [
        "Unable to contact slurm controller",
        "Unable to establish",
        "Connection refused",
        "temporarily unavailable",
    ];
    let failure = if unreachable.iter().any(|u| why.contains(u)) {
        submit_failure(
            FailureCode::RuntimeUnreachable,
            format!("Slurm's controller could not be reached: {why}"),
        )
    } else {
        Failure::config(
            Stage::Submit,
            FailureCode::SchedulerRefused,
            format!("Slurm refused the job: {why}"),
        )
    };
    NotStarted {
        failure,
        job_may_exist: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_config_and_an_absent_controller_is_retryable_infra() {
        let bad =
            refused("sbatch: error: Batch job submission failed: Invalid partition name specified");
        assert_eq!(bad.failure.code, FailureCode::SchedulerRefused);
        assert!(!bad.failure.retryable && !bad.job_may_exist);
        let down = refused(
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
        );
        assert_eq!(down.failure.code, FailureCode::RuntimeUnreachable);
        assert!(down.failure.retryable && !down.job_may_exist);
    }

    #[tokio::test]
    async fn submits_are_paced() {
        let submits = Submits::default();
        let start = Instant::now();
        for _ in 0..11 {
            drop(submits.turn().await);
        }
        // Ten gaps of 1/50 s between eleven turns.
        assert!(
            start.elapsed() >= Duration::from_millis(190),
            "{:?}",
            start.elapsed()
        );
    }
}
