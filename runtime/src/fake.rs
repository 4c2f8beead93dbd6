//! `fake`: a SIMULATION. It runs nothing; each attempt sleeps for its scripted duration and
//! reports its scripted outcome. For orchestration tests and benchmarks of the engine
//! itself. Every record it produces says `simulated: true`.

use std::time::Duration;

use async_trait::async_trait;
use casebatch_attempt::{
    Attempt, CleanupReceipt, Entry, EvaluationRecord, Executor, JobEntry, Liveness, NotStarted,
    RECORD_SCHEMA_VERSION, SimulatedJob, now_ms,
};
use casebatch_manifest::model::{FakeOutcome, FakeScript, PlannedCase};
use casebatch_proto::{ActorReport, ActorStatus, Failure, FailureCode, JobRef, Stage, Verdict};

#[derive(Default)]
pub struct Fake;

impl Fake {
    /// The simulation of `case`'s attempts, as its `fake:` script says.
    pub fn scripted(&self, case: &PlannedCase) -> Scripted {
        Scripted(case.fake.clone().unwrap_or(FakeScript {
            duration_ms: 0,
            outcome: FakeOutcome::Pass,
            infra_failures_first: 0,
            provision_ms: 0,
        }))
    }
}

/// The executor of one case's simulated attempts.
pub struct Scripted(FakeScript);

/// What the simulated actor reports for an attempt.
pub fn simulated_report(script: &FakeScript, attempt: u32) -> ActorReport {
    let failed = |f: Failure| ActorReport::failed(f, Some(1));
    if attempt <= script.infra_failures_first {
        return failed(Failure::infra(
            Stage::Await,
            FailureCode::SimulatedInfra,
            format!("simulated infra failure on attempt {attempt}"),
        ));
    }
    match script.outcome {
        // A verdict of fail is the evaluator's to give; the actor itself finished.
        FakeOutcome::Pass | FakeOutcome::Fail => ActorReport {
            status: ActorStatus::Finished,
            exit_code: Some(0),
            failure: None,
            adopted: false,
            memory_limit_mb: None,
            usage: None,
            retry_after_ms: None,
            logs_capped: None,
        },
        FakeOutcome::HarnessError => failed(Failure::harness(
            Stage::Await,
            FailureCode::HarnessExitNonzero,
            "simulated harness crash",
        )),
        FakeOutcome::InfraError => failed(Failure::infra(
            Stage::Await,
            FailureCode::SimulatedInfra,
            "simulated infra failure",
        )),
        FakeOutcome::OomKilled => failed(Failure::oom(None)),
    }
}

#[async_trait]
impl Executor for Scripted {
    async fn provision(&self, env: &Attempt) -> Result<(), Failure> {
        std::fs::create_dir_all(&env.dir).map_err(|e| {
            Failure::infra(
                Stage::Provision,
                FailureCode::ProvisionIo,
                format!("{}: {e}", env.dir.display()),
            )
        })?;
        // A slow sandbox, simulated: what `prepare_ahead` pays while other cases run.
        let wait = self.0.provision_ms;
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        Ok(())
    }

    async fn submit(&self, env: &Attempt) -> Result<JobRef, NotStarted> {
        // The "job" is the time it started, kept so a re-attached await only waits the rest.
        let fail = |e: casebatch_attempt::JournalError| {
            Failure::infra(Stage::Submit, FailureCode::SpawnFailed, e.to_string())
        };
        if env.journal().map_err(fail)?.job.is_none() {
            let rec = SimulatedJob {
                schema_version: RECORD_SCHEMA_VERSION.into(),
                simulated: true,
                marker: env.marker(),
                started_at_ms: now_ms(),
            };
            env.record(&[Entry::Job(JobEntry::Simulated(rec))])
                .map_err(fail)?;
        }
        Ok(JobRef {
            marker: env.marker(),
            pid: None,
            start_ticks: None,
            host_queue: None,
            runtime: None,
            queued: false,
        })
    }

    async fn await_job(&self, env: &Attempt, job: &JobRef, live: &dyn Liveness) -> ActorReport {
        let script = &self.0;
        let started = env
            .journal()
            .ok()
            .and_then(|j| match j.job.as_ref()? {
                JobEntry::Simulated(job) => Some(job.started_at_ms),
                JobEntry::Process(job) => Some(job.started_at_ms),
                JobEntry::Scheduled(job) => Some(job.submitted_at_ms),
            })
            .unwrap_or_else(now_ms);
        let end = started + script.duration_ms;
        loop {
            let now = now_ms();
            if now >= end {
                break;
            }
            if live.is_cancelled() {
                return ActorReport {
                    status: ActorStatus::Cancelled,
                    exit_code: None,
                    failure: None,
                    adopted: false,
                    memory_limit_mb: None,
                    usage: None,
                    retry_after_ms: None,
                    logs_capped: None,
                };
            }
            live.heartbeat(job).await;
            tokio::time::sleep(Duration::from_millis((end - now).min(1000))).await;
        }
        simulated_report(script, env.key.attempt)
    }

    /// The scripted verdict: nothing runs, whatever evaluator the case names.
    async fn evaluate(&self, _: &Attempt, _: &JobRef, _: &dyn Liveness) -> EvaluationRecord {
        EvaluationRecord {
            configured: true,
            verdict: Some(if self.0.outcome == FakeOutcome::Fail {
                Verdict::Fail
            } else {
                Verdict::Pass
            }),
            ..EvaluationRecord::not_configured()
        }
    }

    fn adopt(&self, env: &Attempt) -> Option<JobRef> {
        let started = env.journal().is_ok_and(|j| j.job.is_some());
        started.then(|| JobRef {
            marker: env.marker(),
            pid: None,
            start_ticks: None,
            host_queue: None,
            runtime: None,
            queued: false,
        })
    }

    fn kill(&self, _env: &Attempt) {}

    async fn cleanup(&self, env: &Attempt) -> CleanupReceipt {
        CleanupReceipt {
            cleanup_confirmed: true,
            message: "simulated runtime: nothing ran, nothing to clean".into(),
            held_job: Some(true),
            ..CleanupReceipt::begun(env.marker(), "simulation")
        }
    }

    /// Nothing runs, so a watch of it can end whenever it likes.
    fn settles_at_start(&self, _: &Attempt) -> bool {
        true
    }

    fn host_queue(&self) -> Option<String> {
        None
    }

    fn job_starts(&self, _: &Attempt) -> Option<u32> {
        None
    }

    fn start_attempted(&self, env: &Attempt) -> bool {
        env.journal().is_ok_and(|j| j.job.is_some())
    }

    fn is_remote(&self) -> bool {
        false
    }

    /// A retried wait stands for re-attaching: there is no process to tell.
    fn tells_adoption(&self) -> bool {
        false
    }
}
