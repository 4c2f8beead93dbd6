//! `fake`: a SIMULATION. It runs nothing; each attempt sleeps for its scripted duration and
//! reports its scripted outcome. For orchestration tests and benchmarks of the engine
//! itself. Every record it produces says `simulated: true`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use casebatch_bundle::{CleanupReceipt, Entry, EvaluationRecord, RECORD_SCHEMA_VERSION};
use casebatch_manifest::model::{FakeOutcome, FakeScript};
use casebatch_proto::{ActorReport, ActorStatus, Failure, FailureCode, JobRef, Stage};

use crate::{AttemptEnv, Liveness, NotStarted, Runtime};

#[derive(Default)]
pub struct Fake;

fn script(env: &AttemptEnv) -> FakeScript {
    env.case.fake.clone().unwrap_or(FakeScript {
        duration_ms: 0,
        outcome: FakeOutcome::Pass,
        infra_failures_first: 0,
        provision_ms: 0,
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the simulated actor reports for an attempt.
pub fn simulated_report(script: &FakeScript, attempt: u32) -> ActorReport {
    let failed = |f: Failure| ActorReport {
        status: ActorStatus::Failed,
        exit_code: Some(1),
        failure: Some(f),
        adopted: false,
        memory_limit_mb: None,
        usage: None,
        retry_after_ms: None,
    };
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

impl Runtime for Fake {
    async fn provision(&self, env: &AttemptEnv) -> Result<(), Failure> {
        std::fs::create_dir_all(&env.dir).map_err(|e| {
            Failure::infra(
                Stage::Provision,
                FailureCode::ProvisionIo,
                format!("{}: {e}", env.dir.display()),
            )
        })?;
        // A slow sandbox, simulated: what `prepare_ahead` pays while other cases run.
        let wait = script(env).provision_ms;
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        Ok(())
    }

    async fn submit(&self, env: &AttemptEnv) -> Result<JobRef, NotStarted> {
        // The "job" is the time it started, kept so a re-attached await only waits the rest.
        let fail = |e: casebatch_bundle::BundleError| {
            Failure::infra(Stage::Submit, FailureCode::SpawnFailed, e.to_string())
        };
        if env.journal().map_err(fail)?.job.is_none() {
            let rec = serde_json::json!({
                "schema_version": RECORD_SCHEMA_VERSION,
                "simulated": true,
                "marker": env.marker(),
                "started_at_ms": now_ms(),
            });
            env.record(&[Entry::Job(rec)]).map_err(fail)?;
        }
        Ok(JobRef {
            marker: env.marker(),
            pid: None,
            start_ticks: None,
            host_queue: None,
            runtime: None,
        })
    }

    async fn await_job<L: Liveness>(
        &self,
        env: &AttemptEnv,
        job: &JobRef,
        live: &L,
    ) -> ActorReport {
        let script = script(env);
        let started = env
            .journal()
            .ok()
            .and_then(|j| j.job.as_ref()?["started_at_ms"].as_u64())
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
                };
            }
            live.heartbeat(job).await;
            tokio::time::sleep(Duration::from_millis((end - now).min(1000))).await;
        }
        simulated_report(&script, env.key.attempt)
    }

    /// The scripted verdict: nothing runs, whatever evaluator the case names.
    async fn evaluate<L: Liveness>(
        &self,
        env: &AttemptEnv,
        _job: &JobRef,
        _live: &L,
    ) -> EvaluationRecord {
        crate::evaluator::simulated(script(env).outcome)
    }

    fn adopt(&self, env: &AttemptEnv) -> Option<JobRef> {
        let started = env.journal().is_ok_and(|j| j.job.is_some());
        started.then(|| JobRef {
            marker: env.marker(),
            pid: None,
            start_ticks: None,
            host_queue: None,
            runtime: None,
        })
    }

    fn kill(&self, _env: &AttemptEnv) {}

    async fn cleanup(&self, env: &AttemptEnv) -> CleanupReceipt {
        CleanupReceipt {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            marker: env.marker(),
            cleanup_confirmed: true,
            killed: vec![],
            remaining: vec![],
            scans: 0,
            message: "simulated runtime: nothing ran, nothing to clean".into(),
            method: Some("simulation".into()),
            checks: Vec::new(),
            escaped: Vec::new(),
            held_job: Some(true),
            containers: Vec::new(),
        }
    }
}
