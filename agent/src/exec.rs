//! What runs an agent's job: the host's processes (`LocalProcess`, in the job's cgroup), or,
//! on an agent started with `--sandbox container`, a container on this host's engine for a
//! job whose `JobSpec` asks for one (`ContainerRuntime`: named from the job, so a restarted
//! agent re-attaches to it by name, as a worker does).
//!
//! A job's executor follows from the job and the agent's setting alone, so every stage of it
//! (and every life of the agent) picks the same one.

use casebatch_container::ContainerRuntime;
use casebatch_proto::{ActorReport, Failure, JobRef};
use casebatch_runtime::local_process::LocalProcess;
use casebatch_runtime::{Attempt, CleanupReceipt, EvaluationRecord, Liveness, NotStarted};

pub(crate) enum Exec<'a> {
    Host,
    Container(&'a ContainerRuntime),
}

impl<'a> Exec<'a> {
    /// The executor of `env`'s job on an agent with `containers` (`--sandbox container`).
    pub(crate) fn of(containers: Option<&'a ContainerRuntime>, env: &Attempt) -> Self {
        match containers {
            Some(c) if env.job.sandbox.is_some() => Exec::Container(c),
            _ => Exec::Host,
        }
    }

    /// Whether a start of the job was attempted (its intent is recorded): a process's
    /// job entry, a container's record once submit stamped it.
    pub(crate) fn start_attempted(&self, env: &Attempt) -> bool {
        match self {
            // An unreadable journal: only the attempt's processes replace it, so it started.
            Exec::Host => env.journal().map_or(true, |j| j.job.is_some()),
            Exec::Container(c) => c.start_attempted(env),
        }
    }

    /// Starts recorded for the job: the wrapper counts them; a container is started once
    /// (a second start of the same name is an adoption).
    pub(crate) fn recorded_starts(&self, env: &Attempt) -> Option<u32> {
        match self {
            Exec::Host => LocalProcess::recorded_starts(env),
            Exec::Container(c) => c.start_attempted(env).then_some(1),
        }
    }

    pub(crate) async fn provision(&self, env: &Attempt) -> Result<(), Failure> {
        match self {
            Exec::Host => LocalProcess.provision(env).await,
            Exec::Container(c) => c.provision(env).await,
        }
    }

    pub(crate) async fn submit(&self, env: &Attempt) -> Result<JobRef, NotStarted> {
        match self {
            Exec::Host => LocalProcess.submit(env).await,
            Exec::Container(c) => c.submit(env).await,
        }
    }

    pub(crate) async fn await_job<L: Liveness>(
        &self,
        env: &Attempt,
        job: &JobRef,
        live: &L,
    ) -> ActorReport {
        match self {
            Exec::Host => LocalProcess.await_job(env, job, live).await,
            Exec::Container(c) => c.await_job(env, job, live).await,
        }
    }

    pub(crate) async fn evaluate<L: Liveness>(
        &self,
        env: &Attempt,
        job: &JobRef,
        live: &L,
    ) -> EvaluationRecord {
        match self {
            Exec::Host => LocalProcess.evaluate(env, job, live).await,
            Exec::Container(c) => c.evaluate(env, job, live).await,
        }
    }

    pub(crate) async fn cleanup(&self, env: &Attempt) -> CleanupReceipt {
        match self {
            Exec::Host => LocalProcess.cleanup(env).await,
            Exec::Container(c) => c.cleanup(env).await,
        }
    }
}
