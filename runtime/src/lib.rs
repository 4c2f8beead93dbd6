//! Where a worker's attempts run: the one place that picks an attempt's executor
//! ([`Runtimes::executor`]), the edge where a planned case becomes a job
//! ([`job_spec::from_planned`]), and the worker-side executors that need the plan: the
//! client of runtime agents ([`agent_client`]) and the simulation ([`fake`]). The executors
//! themselves implement `casebatch_attempt::Executor`; the local-process machinery lives in
//! `casebatch-attempt`, containers in `casebatch-container`.
//!
//! Knows nothing of Temporal: the stage activities (`casebatch-activities`) call it.

pub mod agent_client;
pub mod fake;
pub mod job_spec;

use std::ops::Deref;

use casebatch_attempt::local::LocalProcess;
use casebatch_bundle::Bundle;
use casebatch_container::ContainerRuntime;
use casebatch_manifest::model::{Plan, PlannedCase, RuntimeKind, RuntimeSpec};
use casebatch_proto::AttemptKey;
use casebatch_slurm::{Settings as SlurmSettings, SlurmRuntime};

pub use casebatch_attempt::{Attempt, Executor, Liveness, NotStarted, OnCancel};

/// An attempt on the worker: the [`Attempt`] an executor runs (its job built from the
/// planned case at this one edge, [`job_spec::from_planned`]), plus what only the worker
/// uses: the planned case itself (routing, the simulation's script, the bundle's records),
/// the bundle, and the runtimes-table entry the case names. Derefs to the [`Attempt`].
#[derive(Debug, Clone)]
pub struct AttemptEnv {
    pub attempt: Attempt,
    pub case: PlannedCase,
    pub bundle: Bundle,
    /// The runtimes-table entry the case names (`PlannedCase::runtime_name`), for runtimes
    /// reached through one (an agent); `None` for the built-in ones.
    pub runtime_spec: Option<RuntimeSpec>,
}

impl Deref for AttemptEnv {
    type Target = Attempt;

    fn deref(&self) -> &Attempt {
        &self.attempt
    }
}

impl AttemptEnv {
    pub fn new(key: AttemptKey, case: PlannedCase) -> Self {
        let bundle = Bundle::at(&key.bundle_dir);
        Self {
            attempt: Attempt::new(key, job_spec::from_planned(&case)),
            case,
            bundle,
            runtime_spec: None,
        }
    }

    /// The same attempt, on the runtimes-table entry `spec` (the one the case names).
    pub fn with_runtime_spec(mut self, spec: RuntimeSpec) -> Self {
        self.runtime_spec = Some(spec);
        self
    }

    /// The same attempt, reaching its runtime with `secs` of patience for an agent that does
    /// not answer (the cleanup of an attempt whose agent stopped answering for its job).
    pub fn with_unreachable_grace(mut self, secs: u64) -> Self {
        if let Some(spec) = self.runtime_spec.as_mut() {
            spec.unreachable_grace_s = Some(secs);
        }
        self
    }
}

/// A worker's runtimes: one of each, holding what outlives an attempt (children this process
/// spawned, the container engine's connection, channels to agents).
#[derive(Default)]
pub struct Runtimes {
    pub local: LocalProcess,
    pub container: ContainerRuntime,
    pub fake: fake::Fake,
    pub agents: agent_client::AgentClient,
    pub slurm: SlurmRuntime,
}

/// A `slurm` entry of the runtimes table, as the Slurm runtime takes it.
fn slurm_settings(spec: Option<&RuntimeSpec>) -> SlurmSettings {
    spec.map(|s| SlurmSettings {
        partition: s.partition.clone(),
        account: s.account.clone(),
        qos: s.qos.clone(),
        constraint: s.constraint.clone(),
        extra_args: s.extra_args.clone(),
    })
    .unwrap_or_default()
}

impl Runtimes {
    /// The executor of `env`'s job: the one place that picks it. A new runtime is one arm.
    pub fn executor<'a>(&'a self, env: &'a AttemptEnv) -> Picked<'a> {
        match env.case.runtime {
            // A container sandbox is a local runtime too: the engine is this host's.
            RuntimeKind::LocalProcess if env.job.sandbox.is_some() => Picked::Held(&self.container),
            RuntimeKind::LocalProcess => Picked::Held(&self.local),
            RuntimeKind::Fake => Picked::Bound(Box::new(self.fake.scripted(&env.case))),
            RuntimeKind::Agent => Picked::Bound(Box::new(self.agents.on(
                &env.case.case_id,
                env.case.runtime_name.as_deref(),
                env.runtime_spec.as_ref(),
            ))),
            RuntimeKind::Slurm => Picked::Bound(Box::new(
                self.slurm.on(slurm_settings(env.runtime_spec.as_ref())),
            )),
        }
    }
}

impl Runtimes {
    /// The slots of the agent of runtimes-table entry `name`: what its fair share divides.
    pub async fn agent_capacity(&self, name: &str, spec: &RuntimeSpec) -> Result<u32, String> {
        (self.agents.capacity(name, spec).await).map_err(|e| e.to_string())
    }

    /// Kills every job of batch `batch_id` (bundle `bundle_dir`) that the runtimes of its
    /// `plan` hold: each agent of its runtimes table, its Slurm cluster, and this host's
    /// container engine when a case runs in a container (containers elsewhere end with their cases' cleanup, which
    /// runs on their host; local processes live with a worker and end likewise).
    pub async fn kill_batch(&self, plan: &Plan, batch_id: &str, bundle_dir: &str) -> Swept {
        let mut swept = Swept::default();
        let agents: Vec<_> = plan
            .runtimes
            .iter()
            .filter(|(_, spec)| spec.kind == RuntimeKind::Agent)
            .collect();
        if !agents.is_empty() {
            swept.places.push("the agents");
        }
        for (name, spec) in agents {
            match self.agents.kill_batch(name, spec, batch_id).await {
                Ok(keys) => swept
                    .killed
                    .extend(keys.into_iter().map(|k| format!("{name}: {k}"))),
                Err(why) => swept.unreachable.push(format!("{name}: {why}")),
            }
        }
        if plan
            .runtimes
            .values()
            .any(|spec| spec.kind == RuntimeKind::Slurm)
        {
            swept.places.push("Slurm");
            match self.slurm.kill_batch(batch_id, bundle_dir).await {
                Ok(names) => swept
                    .killed
                    .extend(names.into_iter().map(|n| format!("slurm: {n}"))),
                Err(why) => swept.unreachable.push(format!("slurm: {why}")),
            }
        }
        let boxed = plan
            .cases
            .iter()
            .any(|c| c.sandbox.as_ref().is_some_and(|s| s.is_container()));
        if boxed {
            swept.places.push("this host's container engine");
            match casebatch_container::gc::kill_batch(batch_id, bundle_dir).await {
                Ok(names) => swept
                    .killed
                    .extend(names.into_iter().map(|n| format!("container: {n}"))),
                Err(why) => swept.unreachable.push(format!("container engine: {why}")),
            }
        }
        swept
    }
}

/// What a sweep of a batch's jobs did.
#[derive(Debug, Default)]
pub struct Swept {
    /// The jobs killed, each named with where it ran.
    pub killed: Vec<String>,
    /// Runtimes that could not be asked, and why.
    pub unreachable: Vec<String>,
    /// Where it looked (for the timeline).
    pub places: Vec<&'static str>,
}

/// An attempt's executor: one the worker holds, or one bound to the attempt's case (the
/// agent its entry names, the simulation's script).
pub enum Picked<'a> {
    Held(&'a dyn Executor),
    Bound(Box<dyn Executor + 'a>),
}

impl<'a> Deref for Picked<'a> {
    type Target = dyn Executor + 'a;

    fn deref(&self) -> &Self::Target {
        match self {
            Picked::Held(e) => *e,
            Picked::Bound(e) => e.as_ref(),
        }
    }
}
