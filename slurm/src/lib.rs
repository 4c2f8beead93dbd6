//! `slurm`: cases on a Slurm cluster the team already runs. One attempt is one Slurm job,
//! submitted with `sbatch`, watched with `squeue`, stopped with `scancel`: no daemon of
//! casebatch's on the compute nodes, and the cluster's queues, fair share, accounting and
//! GPU allocation stay Slurm's.
//!
//! Durable as the other runtimes are, by names instead of pids:
//! - the job is named from the attempt ([`names::job_name`]) and its comment carries the
//!   attempt's marker and directory, so any worker replica finds it again;
//! - `submit` decides under the attempt's lock (the flock on its journal), writing its intent
//!   (`Submitting`) to the journal before `sbatch`: a retried submit looks for the job by name
//!   and adopts it. Slurm has no idempotent submit, so an intent whose job Slurm does not show
//!   is submitted again only while Slurm would still show any job it had taken
//!   ([`MIN_JOB_AGE`]); past that it is never taken as proof that no job exists;
//! - the batch script runs the harness under casebatch's wrapper, which writes its exit status
//!   into the attempt's journal on the shared file system: a job Slurm has forgotten is
//!   harvested from there, never run again;
//! - Slurm's states map to the failure taxonomy ([`outcome`]): `OUT_OF_MEMORY` is
//!   `infra/OOM_KILLED` (boosts raise `--mem`), `TIMEOUT` is `infra/TIMEOUT`, `NODE_FAIL`,
//!   `BOOT_FAIL` and `PREEMPTED` are `infra/NODE_FAILED` (retryable, a case with a runtime
//!   list moves on), a `CANCELLED` casebatch did not ask for is `infra/SCHEDULER_CANCELLED`;
//! - pending is not running: a job in Slurm's queue is waited for without a deadline (its
//!   `JobRef` says `queued`), its reason kept in the journal for `batch status`, and its
//!   time limit is Slurm's, counted from when it runs;
//! - cleanup cancels the job by name and confirms only when Slurm reports it ended (or, once
//!   Slurm forgot it, the journal shows its end) and, where this host is the job's node, no
//!   process carries the attempt's marker.
//!
//! Assumed of the cluster: `sbatch`, `squeue` and `scancel` on the worker's `PATH` (reaching
//! the cluster through `SLURM_CONF` or the host's configuration, authenticated by munge as
//! the worker's user), and the output directory at the same path on every node.

mod commands;
pub mod gc;
pub mod names;
mod outcome;
mod queue;
mod script;
mod submit;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use casebatch_attempt::local::procfs;
use casebatch_attempt::{
    Attempt, CleanupReceipt, Entry, EvaluationRecord, Executor, JobEntry, Liveness, NotStarted,
    OnCancel, ScheduledJob, ScheduledState, SchedulerFacts, attempt_files, hostname,
};
use casebatch_proto::{ActorReport, Failure, FailureCode, JobRef, Stage};

use crate::queue::{Job, Queue};
use crate::submit::Submits;

/// How long Slurm keeps a job it ended in its memory before forgetting it (its `MinJobAge`,
/// 300 s by default): an intent younger than this whose job `squeue` does not show was never
/// taken by Slurm.
pub const MIN_JOB_AGE: Duration = Duration::from_secs(300);
/// How often a wait looks at Slurm's queue (one `squeue` serves every wait of the process).
const POLL: Duration = Duration::from_secs(1);
/// How long cleanup waits for a cancelled job to end before its receipt says it did not.
const CANCEL_WAIT: Duration = Duration::from_secs(30);
/// How long cleanup waits for the processes it killed on this host to go.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// A runtimes-table entry of kind `slurm`, as the runtime needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub constraint: Option<String>,
    /// More `sbatch` options, from the manifest's safe set.
    pub extra_args: Vec<String>,
}

/// The worker's Slurm runtime: what its waits share (one `squeue` a second) and the pace of
/// its submits.
#[derive(Default)]
pub struct SlurmRuntime {
    queue: Queue,
    submits: Submits,
}

impl SlurmRuntime {
    /// The executor of attempts on the partition (and account, ...) of `settings`.
    pub fn on(&self, settings: Settings) -> OnSlurm<'_> {
        OnSlurm { rt: self, settings }
    }

    /// Cancels every job of batch `batch_id` whose attempts live under `bundle_dir` (a
    /// supersede's sweep): the names of the jobs cancelled, or why Slurm could not be asked.
    pub async fn kill_batch(
        &self,
        batch_id: &str,
        bundle_dir: &str,
    ) -> Result<Vec<String>, String> {
        gc::kill_batch(&self.queue, batch_id, bundle_dir).await
    }
}

/// An attempt's executor on a Slurm partition.
pub struct OnSlurm<'a> {
    rt: &'a SlurmRuntime,
    settings: Settings,
}

/// The attempt's scheduled job, as its journal has it.
fn recorded(a: &Attempt) -> Option<ScheduledJob> {
    a.journal().ok()?.job.as_ref()?.scheduled().cloned()
}

fn record(a: &Attempt, job: &ScheduledJob) -> Result<(), Failure> {
    a.record(&[Entry::Job(JobEntry::Scheduled(job.clone()))])
        .map_err(|e| Failure::infra(Stage::Submit, FailureCode::SpawnFailed, e.to_string()))
}

fn job_ref(a: &Attempt) -> JobRef {
    JobRef {
        marker: a.marker(),
        pid: None,
        start_ticks: None,
        // Slurm answers any worker.
        host_queue: None,
        runtime: None,
        queued: true,
    }
}

fn provision_failure(e: impl std::fmt::Display) -> Failure {
    Failure::infra(Stage::Provision, FailureCode::ProvisionIo, e.to_string())
}

impl OnSlurm<'_> {
    /// The job as Slurm showed it to a call made at `not_before` or later, or why Slurm could
    /// not be asked.
    async fn job(&self, rec: &ScheduledJob, not_before: Instant) -> Result<Option<Job>, String> {
        let jobs = self.rt.queue.snapshot(not_before).await?;
        Ok(jobs.find(&rec.name, rec.job_id.as_deref()).cloned())
    }

    /// Keeps the journal's record in step with what Slurm said (a new state, reason or node).
    fn follow(a: &Attempt, rec: &mut ScheduledJob, job: &Job) {
        let state = if job.is_pending() {
            ScheduledState::Pending
        } else if job.has_ended() {
            ScheduledState::Ended
        } else {
            ScheduledState::Running
        };
        let reason = job.is_pending().then(|| job.reason.clone());
        let node = (!job.nodes.is_empty()).then(|| job.nodes.clone());
        let id = Some(job.id.clone());
        if (state, &reason, &id) != (rec.state, &rec.reason, &rec.job_id)
            || (node.is_some() && node != rec.node)
        {
            rec.state = state;
            rec.reason = reason;
            rec.job_id = id;
            rec.node = node.or(rec.node.take());
            if let Err(e) = record(a, rec) {
                tracing::warn!(job = %rec.name, "the job's state was not recorded: {}", e.message);
            }
        }
    }
}

#[async_trait]
impl Executor for OnSlurm<'_> {
    /// The attempt's directory with `output/`, a fresh `work/` (the job's working directory)
    /// and `input.json`: the node reads them from the shared file system.
    async fn provision(&self, a: &Attempt) -> Result<(), Failure> {
        let work = a.file(attempt_files::WORKDIR);
        if work.exists() {
            std::fs::remove_dir_all(&work).map_err(provision_failure)?;
        }
        for dir in [&work, &a.file(attempt_files::OUTPUT)] {
            std::fs::create_dir_all(dir).map_err(provision_failure)?;
        }
        let input = a.job.input().map_err(provision_failure)?;
        let bytes = serde_json::to_vec(&input).expect("inputs always serialize");
        std::fs::write(a.file(attempt_files::INPUT), bytes).map_err(provision_failure)
    }

    async fn submit(&self, a: &Attempt) -> Result<JobRef, NotStarted> {
        submit::submit(self, a).await?;
        Ok(job_ref(a))
    }

    async fn await_job(&self, a: &Attempt, job: &JobRef, live: &dyn Liveness) -> ActorReport {
        let Some(mut rec) = recorded(a) else {
            return outcome::lost(a, "its job record is missing: it was never submitted");
        };
        let mut looked_away = None;
        // Every look is at Slurm as it was after the wait began, so after the submit: a job
        // it took is there, unless it has since forgotten it.
        let began = Instant::now();
        loop {
            if live.is_cancelled() {
                if live.on_cancel() == OnCancel::Kill {
                    gc::cancel(&rec.name).await;
                }
                return ActorReport::cancelled();
            }
            let not_before = began.max(Instant::now().checked_sub(POLL).unwrap_or(began));
            match self.job(&rec, not_before).await {
                Ok(Some(seen)) => {
                    looked_away = None;
                    Self::follow(a, &mut rec, &seen);
                    if seen.has_ended() {
                        return outcome::ended(a, &seen).await;
                    }
                }
                // Forgotten (past MinJobAge), or not yet shown: its journal tells whether it
                // ran to its end.
                Ok(None) => {
                    if let Some(exit) = a.journal().ok().and_then(|j| j.exit) {
                        return outcome::harvested(a, exit).await;
                    }
                    if rec.job_id.is_some() {
                        return outcome::lost(
                            a,
                            &format!(
                                "Slurm no longer knows job {} and its journal has no exit \
                                 status",
                                rec.job_id.as_deref().unwrap_or_default()
                            ),
                        );
                    }
                }
                Err(why) => {
                    // Slurm does not answer: wait, as long as it is within the grace.
                    let since = *looked_away.get_or_insert_with(Instant::now);
                    if since.elapsed() > UNANSWERED_GRACE {
                        return outcome::unreachable(&why, since.elapsed());
                    }
                    tracing::warn!(job = %rec.name, "Slurm did not answer: {why}");
                }
            }
            live.heartbeat(job).await;
            tokio::time::sleep(POLL).await;
        }
    }

    /// The evaluator ran in the job after the harness: its result is read here.
    async fn evaluate(&self, a: &Attempt, _: &JobRef, _: &dyn Liveness) -> EvaluationRecord {
        if !a.has_evaluator() {
            return EvaluationRecord::not_configured();
        }
        let exit = std::fs::read_to_string(a.file(script::EVAL_EXIT))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        if exit.is_none() {
            return EvaluationRecord::failed(Failure::infra(
                Stage::Evaluate,
                FailureCode::EvaluatorFailed,
                "the evaluator did not run in the job (it ended before the evaluator could)",
            ));
        }
        casebatch_attempt::evaluation::read_result(&a.file(attempt_files::EVAL_RESULT), exit).await
    }

    fn adopt(&self, a: &Attempt) -> Option<JobRef> {
        recorded(a).map(|_| job_ref(a))
    }

    fn kill(&self, a: &Attempt) {
        let name = names::job_name(a);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { gc::cancel(&name).await });
        }
    }

    async fn cleanup(&self, a: &Attempt) -> CleanupReceipt {
        cleanup(self, a).await
    }

    /// Short jobs settle in `start`: the wait ends when asked, leaving the job be, and the
    /// evaluator has already run inside the job.
    fn settles_at_start(&self, _: &Attempt) -> bool {
        true
    }

    fn host_queue(&self) -> Option<String> {
        None
    }

    fn job_starts(&self, a: &Attempt) -> Option<u32> {
        recorded(a).map(|r| r.starts)
    }

    fn start_attempted(&self, a: &Attempt) -> bool {
        recorded(a).is_some()
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn tells_adoption(&self) -> bool {
        false
    }
}

/// How long a wait rides out a Slurm that does not answer (`squeue` failing or hanging).
const UNANSWERED_GRACE: Duration = Duration::from_secs(120);

/// Cancels the attempt's job, waits until Slurm reports it ended, and checks this host for
/// processes of the attempt when this host is its node.
async fn cleanup(on: &OnSlurm<'_>, a: &Attempt) -> CleanupReceipt {
    let mut receipt = CleanupReceipt {
        held_job: Some(false),
        ..CleanupReceipt::begun(a.marker(), "slurm")
    };
    let Some(rec) = recorded(a) else {
        receipt.cleanup_confirmed = true;
        receipt.checks.push("not_submitted".into());
        receipt.message = "no Slurm job was submitted for this attempt".into();
        return receipt;
    };
    receipt.held_job = Some(true);
    let started = Instant::now();
    let mut cancelled = false;
    let seen = loop {
        match on.job(&rec, Instant::now()).await {
            Ok(Some(job)) if job.has_ended() => break Ok(Some(job)),
            Ok(Some(job)) => {
                if !cancelled {
                    gc::cancel(&rec.name).await;
                    cancelled = true;
                }
                if started.elapsed() > CANCEL_WAIT {
                    break Err(format!(
                        "job {} is still {} {} s after it was cancelled",
                        job.id,
                        job.state,
                        CANCEL_WAIT.as_secs()
                    ));
                }
            }
            Ok(None) => break Ok(None),
            Err(why) if started.elapsed() > CANCEL_WAIT => break Err(why),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let journal = a.journal().ok();
    let ended = match &seen {
        Ok(Some(job)) => {
            receipt.scheduler_job = Some(SchedulerFacts {
                scheduler: "slurm".into(),
                job_id: job.id.clone(),
                node: (!job.nodes.is_empty()).then(|| job.nodes.clone()),
                state: job.state.clone(),
                exit_code: job.exit_code,
            });
            receipt.checks.push("slurm_ended".into());
            Ok(())
        }
        // Forgotten by Slurm: its end is in the journal, or it never ran (an intent Slurm
        // never took, or a job cancelled before it started).
        Ok(None) => {
            let ran = journal.as_ref().is_some_and(|j| j.wrapper.is_some());
            let exited = journal.as_ref().is_some_and(|j| j.exit.is_some());
            if ran && !exited {
                Err(format!(
                    "Slurm no longer knows job {} and its journal shows it started but not \
                     that it ended",
                    rec.job_id.as_deref().unwrap_or(&rec.name)
                ))
            } else {
                receipt.checks.push("slurm_forgotten_journal_ended".into());
                Ok(())
            }
        }
        Err(why) => Err(why.clone()),
    };
    // Where this host is the job's node, no process may carry the attempt's marker.
    let node = receipt
        .scheduler_job
        .as_ref()
        .and_then(|j| j.node.clone())
        .or(rec.node.clone());
    if node.as_deref().is_some_and(|n| n == hostname()) {
        let scan = procfs::scan_marker(&a.process_marker());
        receipt.scans = 1;
        for pid in &scan.marked {
            procfs::kill_pid(*pid);
        }
        // A killed process takes a moment to leave.
        let deadline = Instant::now() + KILL_WAIT;
        let alive = || -> Vec<u32> {
            scan.marked
                .iter()
                .copied()
                .filter(|p| procfs::is_alive(*p))
                .collect()
        };
        while !alive().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        receipt.killed = scan.marked.clone();
        receipt.remaining = alive().into_iter().chain(scan.unreadable).collect();
        receipt.checks.push("marker_scan".into());
    }
    let facts = receipt.scheduler_job.as_ref().map_or_else(
        || format!("job {}", rec.job_id.as_deref().unwrap_or(&rec.name)),
        |j| {
            format!(
                "job {} on {} ended {} (exit {})",
                j.job_id,
                j.node.as_deref().unwrap_or("no node"),
                j.state,
                j.exit_code.map_or("unknown".into(), |c| c.to_string())
            )
        },
    );
    receipt.cleanup_confirmed = ended.is_ok() && receipt.remaining.is_empty();
    receipt.message = match (ended, receipt.remaining.is_empty()) {
        (Ok(()), true) => format!("Slurm {facts}; no process of the attempt is left"),
        (Ok(()), false) => format!(
            "Slurm {facts}, but processes of the attempt are still alive: {:?}",
            receipt.remaining
        ),
        (Err(why), _) => format!("not confirmed: {why}"),
    };
    receipt
}
