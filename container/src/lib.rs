//! The container runtime: one OCI container per attempt (a manifest's `sandbox.provider:
//! container`), created and driven through the Docker Engine API, so it works with Docker and
//! with podman's compatible service (`DOCKER_HOST`, else the default socket).
//!
//! Durable the way the local-process runtime is, by names instead of pids:
//! - an attempt's container is named from the attempt ([`names::container_name`]) and labelled
//!   with its identity; its record (a `container` entry of the attempt's journal) is written
//!   before the create, so a container of the attempt exists only if that entry does;
//! - `submit` decides under the attempt's lock (the flock on its journal): a container it finds (or a create that
//!   meets a name conflict) is adopted, never doubled; one that was created and never started
//!   is started, since it never ran;
//! - `await` re-attaches by name from any worker process on the host, and harvests the logs
//!   from the engine, which keeps them until the container is removed;
//! - the evaluator runs in a sibling container (`<name>-eval`) from the same image, with the
//!   same mount and limits: it sees what the actor left in `/casebatch`, and cleanup removes
//!   it with the actor's;
//! - `cleanup` force-removes both with their anonymous volumes and confirms only when the
//!   engine answers that it no longer knows them; the receipt names each container's id,
//!   image id, exit code and `OOMKilled`.
//!
//! OOM: `State.OOMKilled`, and also an exit by SIGKILL (137) under a memory limit that this
//! runtime did not send, because podman on cgroup v1 reports `OOMKilled: false` for the
//! kernel's OOM kill. Either is `infra/OOM_KILLED`, so boosts raise the container's limit.

mod engine;
pub mod gc;
pub mod names;
mod spec;
mod wait;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum as Status};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, RemoveContainerOptions,
};
use casebatch_attempt::local::procfs::ProcessId;
use casebatch_attempt::local::{boot_clock, fault_point, lock_attempt};
use casebatch_attempt::{
    Attempt, CleanupReceipt, ContainerFacts, ContainerRecord, Entry, EvaluationRecord, Executor,
    Liveness, NotStarted, OnCancel, attempt_files, harness, hostname, now_ms,
};
use casebatch_proto::runtime_v1::{Command, Sandbox};
use casebatch_proto::{ActorReport, Failure, FailureCode, JobRef, Stage};
use futures::StreamExt;

use crate::names::{Role, container_name};
pub use crate::spec::MOUNT;
use crate::wait::Waited;

/// The worker's container runtime. Holds the engine connection and which containers this
/// process started (a report of any other is `adopted`).
#[derive(Default)]
pub struct ContainerRuntime {
    engine: engine::Engine,
    started: Mutex<HashSet<String>>,
}

fn new_record(a: &Attempt, provisioned: bool) -> ContainerRecord {
    ContainerRecord {
        name: container_name(a, Role::Actor),
        image: a
            .job
            .sandbox
            .as_ref()
            .map(|s| s.image.clone())
            .unwrap_or_default(),
        created_at_ms: now_ms(),
        provisioned,
        started_at_ms: None,
        started_at_boot_ms: None,
        owner: None,
    }
}

fn write_record(a: &Attempt, record: &ContainerRecord, stage: Stage) -> Result<(), Failure> {
    a.record(&[Entry::Container(record.clone())])
        .map_err(|e| Failure::infra(stage, FailureCode::SpawnFailed, e.to_string()))
}

fn read_record(a: &Attempt) -> Option<ContainerRecord> {
    a.journal().ok()?.container.clone()
}

/// `output/`, a fresh `work/` and `input.json` in the attempt directory, which its containers
/// mount (a container sees nothing of the host's scratch space).
fn mount_dirs(a: &Attempt) -> Result<(), Failure> {
    let fail = |e: String| Failure::infra(Stage::Provision, FailureCode::ProvisionIo, e);
    let input = a.job.input().map_err(fail)?;
    let work = a.file(attempt_files::WORKDIR);
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|e| fail(format!("{}: {e}", work.display())))?;
    }
    for dir in [work, a.file(attempt_files::OUTPUT)] {
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    }
    // Written again by every provision, before anything reads it.
    let bytes = serde_json::to_vec(&input).expect("inputs always serialize");
    let path = a.file(attempt_files::INPUT);
    std::fs::write(&path, bytes).map_err(|e| fail(format!("{}: {e}", path.display())))
}

fn sandbox(a: &Attempt, stage: Stage) -> Result<&Sandbox, Failure> {
    a.job.sandbox.as_ref().ok_or_else(|| {
        Failure::config(
            stage,
            FailureCode::SpawnFailed,
            format!("case {} has no container sandbox", a.job.case_id),
        )
    })
}

fn job_ref(a: &Attempt) -> JobRef {
    JobRef {
        marker: a.marker(),
        pid: None,
        start_ticks: None,
        // The engine is this host's: the wait and the cleanup run here.
        host_queue: Some(casebatch_proto::host_task_queue(&hostname())),
        runtime: None,
        queued: false,
    }
}

fn failed(failure: Failure, a: &Attempt) -> ActorReport {
    ActorReport {
        memory_limit_mb: a.memory_mb(),
        ..ActorReport::failed(failure, None)
    }
}

/// A kill by the memory limit: the engine says so, or SIGKILL under a limit from anyone but
/// this runtime (see the module doc).
fn oom_killed(code: i64, engine_says: bool, a: &Attempt) -> bool {
    engine_says || (code == 137 && a.memory_mb().is_some())
}

/// Makes sure the sandbox's image is on the engine's host, as `pull` says.
async fn ensure_image(docker: &Docker, s: &Sandbox) -> Result<(), Failure> {
    let present = match docker.inspect_image(&s.image).await {
        Ok(_) => true,
        Err(e) if engine::status_of(&e) == Some(404) => false,
        Err(e) => return Err(engine::unreachable(Stage::Provision, &e)),
    };
    let pull = match s.pull.as_str() {
        "always" => true,
        "never" if !present => {
            return Err(Failure::config(
                Stage::Provision,
                FailureCode::ImageUnavailable,
                format!(
                    "image `{}` is not on the container engine's host and sandbox.pull is \
                     `never`: pull or build it there, or set pull to `if-missing`",
                    s.image
                ),
            ));
        }
        _ => !present,
    };
    if !pull {
        return Ok(());
    }
    let options = CreateImageOptions {
        from_image: Some(s.image.clone()),
        platform: s.platform.clone(),
        ..CreateImageOptions::default()
    };
    let mut progress = docker.create_image(Some(options), None, None);
    while let Some(step) = progress.next().await {
        if let Err(e) = step {
            let message = format!("pulling image `{}` failed: {e}", s.image);
            // The registry's "no such image" or "not yours" does not change on a retry.
            return Err(match engine::status_of(&e) {
                Some(400..500) => {
                    Failure::config(Stage::Provision, FailureCode::ImageUnavailable, message)
                }
                _ => Failure::infra(Stage::Provision, FailureCode::ImageUnavailable, message),
            });
        }
    }
    Ok(())
}

/// A start the engine refused: a command the image does not have is the manifest's to fix.
fn start_failure(stage: Stage, name: &str, e: &bollard::errors::Error) -> Failure {
    let message = format!("the engine could not start container {name}: {e}");
    let text = e.to_string().to_lowercase();
    if text.contains("not found") || text.contains("no such file") {
        Failure::config(stage, FailureCode::SpawnFailed, message)
    } else {
        Failure::infra(stage, FailureCode::SpawnFailed, message)
    }
}

/// Creates the attempt's `role` container unless the engine has it (a conflict is a
/// container already there). Returns its state.
async fn create(
    docker: &Docker,
    a: &Attempt,
    role: Role,
    command: &Command,
    stage: Stage,
) -> Result<Option<Status>, Failure> {
    let name = container_name(a, role);
    let s = sandbox(a, stage)?;
    let found = engine::inspect(docker, &name)
        .await
        .map_err(|e| engine::unreachable(stage, &e))?;
    if let Some(c) = found {
        return Ok(c.state.and_then(|s| s.status));
    }
    let body = spec::create_body(a, s, role, command, stage)?;
    let options = CreateContainerOptions {
        name: Some(name.clone()),
        platform: s.platform.clone(),
    };
    match docker.create_container(Some(options), body).await {
        Ok(_) => Ok(Some(Status::CREATED)),
        Err(e) if engine::status_of(&e) == Some(409) => Ok(engine::inspect(docker, &name)
            .await
            .ok()
            .flatten()
            .and_then(|c| c.state.and_then(|s| s.status))),
        Err(e) => Err(Failure::infra(
            stage,
            FailureCode::SpawnFailed,
            format!("the engine could not create container {name}: {e}"),
        )),
    }
}

impl ContainerRuntime {
    /// Creates the `role` container unless the engine has it, then starts it if it never
    /// was. Returns whether this call started it.
    async fn create_and_start(
        &self,
        docker: &Docker,
        a: &Attempt,
        role: Role,
        command: &Command,
        stage: Stage,
    ) -> Result<bool, Failure> {
        let name = container_name(a, role);
        if create(docker, a, role, command, stage).await? != Some(Status::CREATED) {
            return Ok(false);
        }
        docker
            .start_container(&name, None)
            .await
            .map_err(|e| start_failure(stage, &name, &e))?;
        self.started.lock().expect("lock").insert(name);
        Ok(true)
    }

    async fn submit_job(&self, a: &Attempt) -> Result<JobRef, Failure> {
        let harness = a.harness()?.clone();
        let docker = self.engine.get(Stage::Submit).await?;
        let _lock = lock_attempt(a).await?;
        let record = read_record(a).unwrap_or_else(|| new_record(a, false));
        if record.started_at_ms.is_none() {
            let started = ContainerRecord {
                started_at_ms: Some(now_ms()),
                started_at_boot_ms: boot_clock::now_ms(),
                owner: ProcessId::this(),
                ..record
            };
            write_record(a, &started, Stage::Submit)?;
        }
        fault_point("before-spawn").await;
        self.create_and_start(docker, a, Role::Actor, &harness, Stage::Submit)
            .await?;
        fault_point("after-spawn").await;
        Ok(job_ref(a))
    }
}

/// One OCI container per attempt (see the module doc), on a worker's host or an agent's.
#[async_trait]
impl Executor for ContainerRuntime {
    /// The attempt's directories and input, inside the attempt directory the containers
    /// mount; then the image, and the actor's container, created and not started (so
    /// `prepare_ahead` readies containers of the next cases while others run; `submit`
    /// starts it).
    async fn provision(&self, a: &Attempt) -> Result<(), Failure> {
        mount_dirs(a)?;
        let harness = a.harness()?.clone();
        let s = sandbox(a, Stage::Provision)?;
        let docker = self.engine.get(Stage::Provision).await?;
        ensure_image(docker, s).await?;
        let _lock = lock_attempt(a).await?;
        if read_record(a).is_none() {
            write_record(a, &new_record(a, true), Stage::Provision)?;
        }
        create(docker, a, Role::Actor, &harness, Stage::Provision).await?;
        Ok(())
    }

    async fn submit(&self, a: &Attempt) -> Result<JobRef, NotStarted> {
        Ok(self.submit_job(a).await?)
    }

    async fn await_job(&self, a: &Attempt, job: &JobRef, live: &dyn Liveness) -> ActorReport {
        let docker = match self.engine.get(Stage::Await).await {
            Ok(d) => d,
            Err(f) => return failed(f, a),
        };
        let Some(record) = read_record(a) else {
            return failed(lost(a, "its container record is missing"), a);
        };
        let name = container_name(a, Role::Actor);
        // Adopted: started by another worker process that is gone (not this one, which
        // started it, and not a live replica's on this host).
        let adopted = match record.owner {
            Some(owner) => !owner.is_alive(),
            None => !self.started.lock().expect("lock").contains(&name),
        };
        let timeout_ms = a.job.timeout_seconds.max(1) * 1000;
        // Measured on the boot clock where the record has it: a wall-clock step moves no
        // deadline.
        let elapsed_ms = match (record.started_at_boot_ms, boot_clock::now_ms()) {
            (Some(at), Some(now)) => now.saturating_sub(at),
            _ => now_ms().saturating_sub(record.started_at_ms.unwrap_or(record.created_at_ms)),
        };
        let deadline =
            Instant::now() + Duration::from_millis(timeout_ms.saturating_sub(elapsed_ms));
        let waited = wait::wait(docker, &name, deadline, job, live).await;
        let ended = matches!(waited, Waited::Exited { .. } | Waited::TimedOut);
        if ended {
            let logs = (a.file(attempt_files::STDOUT), a.file(attempt_files::STDERR));
            if let Err(e) = wait::harvest_logs(docker, &name, &logs.0, &logs.1).await {
                tracing::warn!(container = %name, "the container's logs could not be harvested: {e}");
            }
        }
        let mut report = match waited {
            Waited::Exited {
                code,
                oom_killed: oom,
            } if oom_killed(code, oom, a) => ActorReport {
                exit_code: Some(code as i32),
                ..failed(Failure::oom(a.memory_mb()), a)
            },
            Waited::Exited { code, .. } => {
                let (result, stderr) =
                    (a.file(attempt_files::RESULT), a.file(attempt_files::STDERR));
                harness::classify(code as i32, &result, &stderr).await
            }
            Waited::TimedOut => failed(
                Failure::infra(
                    Stage::Await,
                    FailureCode::Timeout,
                    format!(
                        "the harness ran past its deadline ({} s after its container was started)",
                        a.job.timeout_seconds
                    ),
                ),
                a,
            ),
            Waited::Cancelled => ActorReport::cancelled(),
            Waited::Gone => failed(lost(a, "its container is gone from the engine"), a),
            Waited::NotStarted => failed(lost(a, "its container was created but never started"), a),
            Waited::Unreachable(m) => failed(
                Failure::infra(
                    Stage::Await,
                    FailureCode::ContainerEngineUnreachable,
                    format!(
                        "the container engine at {} stopped answering: {m}",
                        engine::address()
                    ),
                ),
                a,
            ),
        };
        report.adopted = adopted;
        report.memory_limit_mb = a.memory_mb();
        if ended {
            report.logs_capped = casebatch_attempt::logs::cap_attempt(a).map(Box::new);
        }
        report
    }

    async fn evaluate(&self, a: &Attempt, job: &JobRef, live: &dyn Liveness) -> EvaluationRecord {
        let Some(command) = a.job.evaluator.clone().filter(|c| !c.argv.is_empty()) else {
            return EvaluationRecord::not_configured();
        };
        if live.on_cancel() == OnCancel::Kill && live.is_cancelled() {
            return EvaluationRecord::failed(eval_failure(
                "the attempt's cleanup stopped the evaluator before it gave a verdict".into(),
            ));
        }
        let docker = match self.engine.get(Stage::Evaluate).await {
            Ok(d) => d,
            Err(f) => return EvaluationRecord::failed(f),
        };
        let name = container_name(a, Role::Evaluator);
        let result_path = a.file(attempt_files::EVAL_RESULT);
        // A result left from before is the harness's doing unless this evaluator ran.
        if matches!(engine::inspect(docker, &name).await, Ok(None)) {
            let _ = std::fs::remove_file(&result_path);
        }
        if let Err(f) = self
            .create_and_start(docker, a, Role::Evaluator, &command, Stage::Evaluate)
            .await
        {
            return EvaluationRecord::failed(f);
        }
        let timeout = Duration::from_secs(a.job.timeout_seconds.max(1));
        let waited = wait::wait(docker, &name, Instant::now() + timeout, job, live).await;
        if matches!(waited, Waited::Exited { .. } | Waited::TimedOut) {
            let logs = (
                a.file(attempt_files::EVAL_STDOUT),
                a.file(attempt_files::EVAL_STDERR),
            );
            let _ = wait::harvest_logs(docker, &name, &logs.0, &logs.1).await;
        }
        match waited {
            Waited::Exited {
                code,
                oom_killed: oom,
            } if oom_killed(code, oom, a) => EvaluationRecord {
                exit_code: Some(code as i32),
                ..EvaluationRecord::failed(Failure {
                    stage: Stage::Evaluate,
                    ..Failure::oom(a.memory_mb())
                })
            },
            Waited::Exited { code, .. } => {
                casebatch_attempt::evaluation::read_result(&result_path, Some(code as i32)).await
            }
            Waited::TimedOut => EvaluationRecord::failed(eval_failure(format!(
                "the evaluator ran past {}s",
                timeout.as_secs()
            ))),
            other => EvaluationRecord::failed(eval_failure(format!(
                "the evaluator's container ended without a verdict: {other:?}"
            ))),
        }
    }

    fn adopt(&self, a: &Attempt) -> Option<JobRef> {
        // Read-only: the record precedes any container; await resolves the rest. A container
        // only provisioned holds no job yet: its submit starts it.
        read_record(a)
            .filter(ContainerRecord::start_attempted)
            .map(|_| job_ref(a))
    }

    /// Whether the attempt's actor was ever started, or a start attempted (an agent's
    /// restart submits a job only if not).
    fn start_attempted(&self, a: &Attempt) -> bool {
        read_record(a).is_some_and(|r| r.start_attempted())
    }

    fn kill(&self, a: &Attempt) {
        let names = [
            container_name(a, Role::Actor),
            container_name(a, Role::Evaluator),
        ];
        engine::blocking(|docker| async move {
            for name in &names {
                wait::kill(&docker, name).await;
            }
        });
    }

    async fn cleanup(&self, a: &Attempt) -> CleanupReceipt {
        let held_job = Some(self.start_attempted(a));
        let mut receipt = CleanupReceipt {
            scans: 1,
            held_job,
            ..CleanupReceipt::begun(a.marker(), "container")
        };
        let docker = match self.engine.get(Stage::Cleanup).await {
            Ok(d) => d,
            Err(f) => {
                receipt.message = f.message;
                return receipt;
            }
        };
        let mut unanswered = Vec::new();
        for role in [Role::Actor, Role::Evaluator] {
            let name = container_name(a, role);
            match remove(docker, &name).await {
                Ok(Some(facts)) => receipt.containers.push(ContainerFacts {
                    role: role.as_str().into(),
                    ..facts
                }),
                Ok(None) => {}
                Err(e) => unanswered.push(format!("{name}: {e}")),
            }
        }
        let left: Vec<&str> = receipt
            .containers
            .iter()
            .filter(|c| !c.removed)
            .map(|c| c.name.as_str())
            .collect();
        receipt.cleanup_confirmed = unanswered.is_empty() && left.is_empty();
        receipt.checks.push("container_removed".into());
        receipt.message = if receipt.cleanup_confirmed {
            "the engine no longer knows any container of the attempt".into()
        } else {
            format!("containers still known to the engine: {left:?}; unanswered: {unanswered:?}")
        };
        receipt
    }

    /// The evaluator runs in a container of its own after the actor: `start`'s watch would
    /// cut its timeout.
    fn settles_at_start(&self, _: &Attempt) -> bool {
        false
    }

    /// The engine is this host's.
    fn host_queue(&self) -> Option<String> {
        Some(casebatch_proto::host_task_queue(&hostname()))
    }

    /// A container is started once: a second start of the same name is an adoption.
    fn job_starts(&self, a: &Attempt) -> Option<u32> {
        self.start_attempted(a).then_some(1)
    }

    fn is_remote(&self) -> bool {
        false
    }

    /// Its report says whether this process started the container.
    fn tells_adoption(&self) -> bool {
        true
    }
}

/// Force-removes `name` with its anonymous volumes: what the engine knew of it, `removed`
/// once it answers that it no longer knows it; `None` when there was no such container.
async fn remove(
    docker: &Docker,
    name: &str,
) -> Result<Option<ContainerFacts>, bollard::errors::Error> {
    let Some(c) = engine::inspect(docker, name).await? else {
        return Ok(None);
    };
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..RemoveContainerOptions::default()
    };
    match docker.remove_container(name, Some(options)).await {
        Err(e) if engine::status_of(&e) != Some(404) => return Err(e),
        _ => {}
    }
    let removed = engine::inspect(docker, name).await?.is_none();
    Ok(Some(facts(name, c, removed)))
}

fn facts(name: &str, c: ContainerInspectResponse, removed: bool) -> ContainerFacts {
    let state = c.state.unwrap_or_default();
    ContainerFacts {
        role: String::new(),
        name: name.into(),
        id: c.id.unwrap_or_default(),
        image: c.config.and_then(|c| c.image).unwrap_or_default(),
        image_id: c.image.unwrap_or_default(),
        exit_code: state.exit_code,
        oom_killed: state.oom_killed.unwrap_or(false),
        removed,
    }
}

fn eval_failure(message: String) -> Failure {
    Failure::harness(Stage::Evaluate, FailureCode::EvaluatorFailed, message)
}

fn lost(a: &Attempt, why: &str) -> Failure {
    Failure::infra(
        Stage::Await,
        FailureCode::JobLost,
        format!("attempt {} of case {}: {why}", a.key.attempt, a.job.case_id),
    )
}
