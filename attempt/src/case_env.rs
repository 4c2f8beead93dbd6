//! The environment every process of a case starts with (the harness, its wrapper, the
//! evaluator): an empty one plus an explicit allowlist, so nothing of the runner's own
//! environment (`TEMPORAL_API_KEY`, cloud credentials, tokens) reaches a harness or the bundle
//! unless the manifest asks for it by name.
//!
//! What a process sees, later entries winning:
//! 1. [`INHERITED`]: `PATH`, `HOME`, `LANG`, `LC_ALL`, `LC_CTYPE`, `TZ`, `TMPDIR`, `USER`,
//!    copied from the worker when set there, with `TMPDIR` then pointed at the attempt's own
//!    temporary directory where it has one (local processes: [`crate::scratch`]);
//! 2. the job's `pass_env` names, copied from the worker when the attempt starts (an unset
//!    name fails the attempt as `config`; values are never written anywhere by casebatch);
//! 3. the job's `env` literals;
//! 4. the harness contract's `CASEBATCH_*` variables ([`AttemptEnv::contract_env`], including
//!    the allocation marker that cleanup finds processes by), which the manifest cannot set.
//!
//! The caller then adds its own `CASEBATCH_*` extras (exit file, cgroup, actor result).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use casebatch_proto::runtime_v1::JobSpec;

use crate::Attempt;
use crate::scratch::Scratch;

/// Variables copied from the worker's environment into every case process, when set.
pub const INHERITED: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER",
];

/// A case process's complete environment, reading the worker's variables through `lookup`.
/// `Err` names the `pass_env` variables that `lookup` does not have.
pub fn build(
    job: &JobSpec,
    contract: BTreeMap<String, String>,
    tmpdir: Option<&Path>,
    lookup: impl Fn(&str) -> Option<OsString>,
) -> Result<BTreeMap<OsString, OsString>, String> {
    let mut env: BTreeMap<OsString, OsString> = BTreeMap::new();
    for name in INHERITED {
        if let Some(value) = lookup(name) {
            env.insert((*name).into(), value);
        }
    }
    // Not the host's: what a process leaves in its temporary directory (a killed browser's
    // profile lock) goes with the attempt's cleanup. A manifest that passes or sets it wins.
    if let Some(dir) = tmpdir {
        env.insert("TMPDIR".into(), dir.into());
    }
    let mut unset = Vec::new();
    for name in &job.pass_env {
        match lookup(name) {
            Some(value) => {
                env.insert(name.into(), value);
            }
            None => unset.push(name.as_str()),
        }
    }
    if !unset.is_empty() {
        return Err(format!(
            "pass_env names {}, which the worker's environment does not set: export it where \
             every worker runs, or remove it from pass_env",
            unset.join(", ")
        ));
    }
    for (name, value) in &job.env {
        env.insert(name.into(), value.into());
    }
    for (name, value) in contract {
        env.insert(name.into(), value.into());
    }
    Ok(env)
}

/// [`build`] for a local process of an attempt with its scratch space there, from this
/// worker's environment as it is now.
pub fn for_attempt(
    attempt: &Attempt,
    scratch: &Scratch,
) -> Result<BTreeMap<OsString, OsString>, String> {
    build(
        &attempt.job,
        attempt.contract_env(),
        Some(&scratch.tmp),
        |name| std::env::var_os(name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(env: &[(&str, &str)], pass_env: &[&str]) -> JobSpec {
        JobSpec {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            pass_env: pass_env.iter().map(|n| n.to_string()).collect(),
            ..JobSpec::default()
        }
    }

    fn worker(name: &str) -> Option<OsString> {
        let value = match name {
            "PATH" => "/usr/bin:/bin",
            "HOME" => "/home/w",
            "TEMPORAL_API_KEY" => "sekrit-api-key",
            "AWS_SECRET_ACCESS_KEY" => "sekrit-aws",
            "MY_TOKEN" => "passed-on-purpose",
            "CASEBATCH_ALLOC_MARKER" => "the-workers-own-marker",
            _ => return None,
        };
        Some(value.into())
    }

    fn get<'a>(env: &'a BTreeMap<OsString, OsString>, name: &str) -> Option<&'a str> {
        env.get(&OsString::from(name)).and_then(|v| v.to_str())
    }

    #[test]
    fn only_the_allowlist_the_contract_and_the_manifests_choices_get_through() {
        let contract = BTreeMap::from([
            ("CASEBATCH_RESULT".to_string(), "/b/result.json".to_string()),
            ("CASEBATCH_ALLOC_MARKER".to_string(), "b/0/1".to_string()),
        ]);
        let c = case(&[("MODE", "fast"), ("PATH", "/opt/bin")], &["MY_TOKEN"]);
        let env = build(&c, contract, None, worker).unwrap();
        let names: Vec<&str> = env.keys().filter_map(|k| k.to_str()).collect();
        assert_eq!(
            names,
            [
                "CASEBATCH_ALLOC_MARKER",
                "CASEBATCH_RESULT",
                "HOME",
                "MODE",
                "MY_TOKEN",
                "PATH"
            ]
        );
        assert_eq!(get(&env, "HOME"), Some("/home/w"));
        assert_eq!(get(&env, "MY_TOKEN"), Some("passed-on-purpose"));
        // A literal wins over the inherited value; the contract wins over the worker's own.
        assert_eq!(get(&env, "PATH"), Some("/opt/bin"));
        assert_eq!(get(&env, "CASEBATCH_ALLOC_MARKER"), Some("b/0/1"));
        assert!(
            env.values()
                .all(|v| !v.to_string_lossy().contains("sekrit"))
        );
    }

    #[test]
    fn the_attempts_own_tmpdir_replaces_the_hosts_and_a_manifests_choice_wins() {
        let host = |name: &str| (name == "TMPDIR").then(|| OsString::from("/tmp"));
        let tmp = Some(Path::new("/scratch/a.tmp"));
        let tmpdir = |c: JobSpec, tmp| {
            let env = build(&c, BTreeMap::new(), tmp, host).unwrap();
            get(&env, "TMPDIR").map(str::to_owned)
        };
        assert_eq!(
            tmpdir(case(&[], &[]), tmp).as_deref(),
            Some("/scratch/a.tmp")
        );
        let set = case(&[("TMPDIR", "/big/disk")], &[]);
        assert_eq!(tmpdir(set, tmp).as_deref(), Some("/big/disk"));
        let passed = case(&[], &["TMPDIR"]);
        assert_eq!(tmpdir(passed, tmp).as_deref(), Some("/tmp"));
        // Without one of its own (a container has its own /tmp): the host's, as before.
        assert_eq!(tmpdir(case(&[], &[]), None).as_deref(), Some("/tmp"));
    }

    #[test]
    fn an_unset_pass_env_name_is_an_error_naming_it() {
        let err = build(&case(&[], &["NOT_THERE"]), BTreeMap::new(), None, worker).unwrap_err();
        assert!(err.contains("NOT_THERE"), "{err}");
    }
}
