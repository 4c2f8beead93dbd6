//! The container an attempt's job becomes: its image and command, the attempt directory
//! mounted at [`MOUNT`], the harness contract's environment with container paths, its limits.

use std::collections::BTreeMap;
use std::ffi::OsString;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, ResourcesUlimits};
use casebatch_attempt::{Attempt, attempt_files, case_env};
use casebatch_proto::runtime_v1::{Command, Sandbox};
use casebatch_proto::{Failure, FailureCode, Stage};

use crate::engine;
use crate::names::{Role, labels};

/// Where the attempt directory is mounted in its containers. The harness contract's paths:
/// `CASEBATCH_INPUT=/casebatch/input.json`, `CASEBATCH_OUTPUT_DIR=/casebatch/output`,
/// `CASEBATCH_RESULT=/casebatch/result.json`; the working directory is `/casebatch/work`.
pub const MOUNT: &str = "/casebatch";

/// Inherited variables that describe the worker's host, not the image: the image's own
/// `PATH`, `HOME`, `TMPDIR` and `USER` stay in force.
const HOST_ONLY: &[&str] = &["PATH", "HOME", "TMPDIR", "USER"];

fn inside(name: &str) -> String {
    format!("{MOUNT}/{name}")
}

/// The contract's variables as a process in the container sees them.
fn contract_env(attempt: &Attempt, role: Role) -> BTreeMap<String, String> {
    let mut env = attempt.contract_env();
    env.insert("CASEBATCH_INPUT".into(), inside(attempt_files::INPUT));
    env.insert("CASEBATCH_OUTPUT_DIR".into(), inside(attempt_files::OUTPUT));
    match role {
        Role::Actor => {
            env.insert("CASEBATCH_RESULT".into(), inside(attempt_files::RESULT));
        }
        Role::Evaluator => {
            env.insert(
                "CASEBATCH_ACTOR_RESULT".into(),
                inside(attempt_files::RESULT),
            );
            env.insert(
                "CASEBATCH_RESULT".into(),
                inside(attempt_files::EVAL_RESULT),
            );
        }
    }
    env
}

/// `NAME=value` lines of the container's environment (the allowlist rules of
/// [`case_env::build`], read from this worker's environment).
fn environment(attempt: &Attempt, role: Role, stage: Stage) -> Result<Vec<String>, Failure> {
    let lookup = |name: &str| -> Option<OsString> {
        if HOST_ONLY.contains(&name) {
            None
        } else {
            std::env::var_os(name)
        }
    };
    let env = case_env::build(&attempt.job, contract_env(attempt, role), None, lookup)
        .map_err(|m| Failure::config(stage, FailureCode::PassEnvUnset, m))?;
    Ok(env
        .into_iter()
        .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
        .collect())
}

/// One limit (`soft hard`) from a `/proc/<pid>/limits` text; unlimited is `u64::MAX`.
fn limit_of(text: &str, row: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with(row))?;
    let mut fields = line[row.len()..].split_whitespace();
    let value = |v: &str| match v {
        "unlimited" => Some(u64::MAX),
        v => v.parse().ok(),
    };
    Some((value(fields.next()?)?, value(fields.next()?)?))
}

/// Limits on open files and processes, set on each container explicitly: no more than the
/// worker has, nor than the engine itself has when it serves a socket on this host (runc runs
/// under it and may not raise them: podman's defaults exceed them on these machines, and the
/// container then fails to start).
fn ulimits() -> Vec<ResourcesUlimits> {
    let own = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let engine = engine::process_limits().unwrap_or_default();
    let as_api = |v: u64| i64::try_from(v).unwrap_or(-1);
    [("Max open files", "nofile"), ("Max processes", "nproc")]
        .into_iter()
        .filter_map(|(row, name)| {
            let (mut soft, mut hard) = limit_of(&own, row)?;
            if let Some((s, h)) = limit_of(&engine, row) {
                (soft, hard) = (soft.min(s), hard.min(h));
            }
            Some(ResourcesUlimits {
                name: Some(name.into()),
                soft: Some(as_api(soft.min(hard))),
                hard: Some(as_api(hard)),
            })
        })
        .collect()
}

fn limits(attempt: &Attempt, sandbox: &Sandbox) -> HostConfig {
    // Memory and swap alike: a limit the container could page past would not be one.
    let memory = attempt
        .memory_mb()
        .map(|mb| i64::try_from(mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX));
    let cpu = attempt.job.resources.as_ref().and_then(|r| r.cpu);
    HostConfig {
        memory,
        memory_swap: memory,
        nano_cpus: cpu.map(|c| (c * 1e9) as i64),
        network_mode: (sandbox.network == "none").then(|| "none".into()),
        ulimits: Some(ulimits()),
        mounts: Some(vec![Mount {
            target: Some(MOUNT.into()),
            source: Some(attempt.dir.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            ..Mount::default()
        }]),
        ..HostConfig::default()
    }
}

/// The create request of the attempt's container in `role`, running `command` as is (the
/// image's entrypoint does not wrap it, as a local harness is not wrapped by a shell).
pub fn create_body(
    attempt: &Attempt,
    sandbox: &Sandbox,
    role: Role,
    command: &Command,
    stage: Stage,
) -> Result<ContainerCreateBody, Failure> {
    Ok(ContainerCreateBody {
        image: Some(sandbox.image.clone()),
        entrypoint: Some(command.argv.clone()),
        cmd: Some(Vec::new()),
        env: Some(environment(attempt, role, stage)?),
        working_dir: Some(inside(attempt_files::WORKDIR)),
        user: Some(sandbox.user.clone()).filter(|u| !u.is_empty()),
        labels: Some(labels(attempt, role)),
        host_config: Some(limits(attempt, sandbox)),
        ..ContainerCreateBody::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::AttemptKey;
    use casebatch_proto::runtime_v1::{JobSpec, Resources};

    fn attempt() -> Attempt {
        let key = AttemptKey {
            batch_id: "b".into(),
            bundle_dir: "/bundles/b".into(),
            case_index: 0,
            attempt: 1,
            memory_boost_mb: Some(512),
            runtime: None,
        };
        let job = JobSpec {
            case_id: "c".into(),
            case_dir: "0000-c".into(),
            env: [("MODEL".to_string(), "m1".to_string())].into(),
            resources: Some(Resources {
                memory_mb: Some(256),
                cpu: Some(1.5),
                gpus: None,
                log_mb: None,
            }),
            ..JobSpec::default()
        };
        Attempt::new(key, job)
    }

    #[test]
    fn the_container_sees_the_contract_at_its_mount_under_the_attempts_limits() {
        let sandbox = Sandbox {
            image: "busybox".into(),
            network: "none".into(),
            ..Sandbox::default()
        };
        let command = Command {
            argv: vec!["sh".into(), "-c".into(), "true".into()],
        };
        let body = create_body(
            &attempt(),
            &sandbox,
            Role::Evaluator,
            &command,
            Stage::Evaluate,
        )
        .unwrap();
        let env = body.env.unwrap();
        for line in [
            "CASEBATCH_INPUT=/casebatch/input.json",
            "CASEBATCH_ACTOR_RESULT=/casebatch/result.json",
            "CASEBATCH_RESULT=/casebatch/evaluator_result.json",
            "MODEL=m1",
        ] {
            assert!(env.iter().any(|l| l == line), "{line} missing from {env:?}");
        }
        assert!(
            !env.iter().any(|l| l.starts_with("PATH=")),
            "the image keeps its own PATH: {env:?}"
        );
        assert_eq!(body.working_dir.as_deref(), Some("/casebatch/work"));
        assert_eq!(body.entrypoint, Some(command.argv));
        let host = body.host_config.unwrap();
        // The boost replaces the declared 256 MiB, and swap is held to the same.
        assert_eq!(host.memory, Some(512 * 1024 * 1024));
        assert_eq!(host.memory_swap, host.memory);
        assert_eq!(host.nano_cpus, Some(1_500_000_000));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        let ulimits = host.ulimits.unwrap();
        let text = "Limit  Soft  Hard  Units\nMax processes  32768  unlimited  processes\n";
        assert_eq!(limit_of(text, "Max processes"), Some((32768, u64::MAX)));
        let nofile = ulimits.iter().find(|u| u.name.as_deref() == Some("nofile"));
        assert!(
            nofile.is_some_and(|u| u.soft.is_some() && u.hard.is_some()),
            "{ulimits:?}"
        );
        let mount = &host.mounts.unwrap()[0];
        assert_eq!(
            mount.source.as_deref(),
            Some("/bundles/b/cases/0000-c/attempts/1")
        );
    }
}
