//! What an attempt's job is: its `sbatch` options and its batch script. The script runs the
//! harness under casebatch's wrapper (which records its identity and exit status in the
//! attempt's journal, as on a worker's host), then, when the harness finished (exit 0), the
//! evaluator in the same allocation, so the job's end covers both and its memory limit,
//! CPUs and time limit hold for both.
//!
//! The attempt's directory must be at the same path on the node as on the worker (a file
//! system every node mounts): the script checks it first and exits [`DIR_NOT_SHARED`] when
//! it is not there, which the runtime reports as a config failure naming the node.

use std::collections::BTreeMap;
use std::ffi::OsString;

use casebatch_attempt::local::wrapper::{WRAPPER, WRAPPER_NAME};
use casebatch_attempt::{Attempt, attempt_files, case_env, journal};
use casebatch_proto::{Failure, FailureCode, Stage};

use crate::Settings;
use crate::names;

/// The script's exit status when the attempt's directory is not on its node.
pub(crate) const DIR_NOT_SHARED: i32 = 97;

/// The file the evaluator's exit status is written to, in the attempt's directory.
pub(crate) const EVAL_EXIT: &str = "evaluator.exit";

/// `text` as one word of `sh`.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The batch script of `a`'s job.
pub(crate) fn script(a: &Attempt) -> Result<String, Failure> {
    let harness = a.harness()?;
    let path = |name: &str| quoted(&a.file(name).display().to_string());
    let argv = |argv: &[String]| argv.iter().map(|w| quoted(w)).collect::<Vec<_>>().join(" ");
    let dir = quoted(&a.dir.display().to_string());
    let mut s = format!(
        "#!/bin/sh\n\
         # casebatch attempt {marker}\n\
         if [ ! -d {dir} ]; then\n  \
           echo \"casebatch: the attempt directory {shown} is not on node $(hostname): \
         casebatch's output directory must be mounted at the same path on every node\" >&2\n  \
           exit {DIR_NOT_SHARED}\n\
         fi\n\
         /bin/sh -c {wrapper} {WRAPPER_NAME} {journal} {harness}\n\
         code=$?\n",
        marker = a.marker(),
        shown = a.dir.display(),
        wrapper = quoted(WRAPPER),
        journal = quoted(&journal::path(&a.dir).display().to_string()),
        harness = argv(&harness.argv),
    );
    if let Some(evaluator) = a.job.evaluator.as_ref().filter(|c| !c.argv.is_empty()) {
        s.push_str(&format!(
            "if [ \"$code\" -eq 0 ]; then\n  \
               CASEBATCH_ACTOR_RESULT={result} CASEBATCH_RESULT={eval_result} {evaluator} \
             >>{eval_out} 2>>{eval_err} </dev/null\n  \
               echo $? >{eval_exit}\n\
             fi\n",
            result = path(attempt_files::RESULT),
            eval_result = path(attempt_files::EVAL_RESULT),
            evaluator = argv(&evaluator.argv),
            eval_out = path(attempt_files::EVAL_STDOUT),
            eval_err = path(attempt_files::EVAL_STDERR),
            eval_exit = path(EVAL_EXIT),
        ));
    }
    s.push_str("exit $code\n");
    Ok(s)
}

/// Minutes of Slurm's time limit for a timeout in seconds: Slurm counts whole minutes (and
/// checks limits about every 30 s), so the limit is the timeout rounded up.
pub(crate) fn time_limit_minutes(timeout_seconds: u64) -> u64 {
    timeout_seconds.div_ceil(60).max(1)
}

/// `sbatch`'s options for `a`'s job on `settings`'s partition.
pub(crate) fn sbatch_args(a: &Attempt, settings: &Settings) -> Vec<String> {
    let file = |name: &str| a.file(name).display().to_string();
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name={}", names::job_name(a)),
        format!("--comment={}", names::comment(a)),
        format!("--chdir={}", file(attempt_files::WORKDIR)),
        format!("--output={}", file(attempt_files::STDOUT)),
        format!("--error={}", file(attempt_files::STDERR)),
        // A later start never truncates an earlier one's logs.
        "--open-mode=append".into(),
        // Slurm must never run the attempt a second time under the same job: a retry is the
        // workflow's, as a new attempt.
        "--no-requeue".into(),
        "--export=ALL".into(),
        format!(
            "--time={}",
            time_limit_minutes(a.job.timeout_seconds.max(1))
        ),
    ];
    for (flag, value) in [
        ("--partition", &settings.partition),
        ("--account", &settings.account),
        ("--qos", &settings.qos),
        ("--constraint", &settings.constraint),
    ] {
        if let Some(v) = value {
            args.push(format!("{flag}={v}"));
        }
    }
    if let Some(mb) = a.memory_mb() {
        args.push(format!("--mem={mb}"));
    }
    let resources = a.job.resources.as_ref();
    if let Some(cpu) = resources.and_then(|r| r.cpu) {
        args.push(format!("--cpus-per-task={}", cpu.ceil().max(1.0) as u64));
    }
    if let Some(gpus) = resources.and_then(|r| r.gpus) {
        args.push(format!("--gres=gpu:{gpus}"));
    }
    args.extend(settings.extra_args.iter().cloned());
    args
}

/// The environment `sbatch` runs with, which the job inherits (`--export=ALL`): the harness
/// contract's with the attempt's own files (the node's scratch space is its own: `TMPDIR` is
/// left to it), and where the cluster is (`SLURM_CONF`), nothing else of the worker's.
pub(crate) fn environment(a: &Attempt) -> Result<BTreeMap<OsString, OsString>, Failure> {
    let mut contract = a.contract_env();
    contract.insert(
        "CASEBATCH_INPUT".into(),
        a.file(attempt_files::INPUT).display().to_string(),
    );
    let lookup = |name: &str| (name != "TMPDIR").then(|| std::env::var_os(name)).flatten();
    let mut env = case_env::build(&a.job, contract, None, lookup)
        .map_err(|m| Failure::config(Stage::Submit, FailureCode::PassEnvUnset, m))?;
    if let Some(conf) = std::env::var_os("SLURM_CONF") {
        env.insert("SLURM_CONF".into(), conf);
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_attempt::JobSpec;
    use casebatch_proto::runtime_v1::{Command, Resources};

    fn attempt(evaluator: Option<&str>) -> Attempt {
        let key = casebatch_proto::AttemptKey {
            batch_id: "b".into(),
            bundle_dir: "/out/b's".into(),
            case_index: 3,
            attempt: 2,
            memory_boost_mb: Some(256),
            runtime: None,
        };
        let job = JobSpec {
            case_id: "c".into(),
            case_dir: "c".into(),
            harness: Some(Command::shell("echo 'hi'")),
            evaluator: evaluator.map(Command::shell),
            timeout_seconds: 61,
            resources: Some(Resources {
                memory_mb: Some(64),
                cpu: Some(1.5),
                gpus: Some(2),
                log_mb: None,
            }),
            ..JobSpec::default()
        };
        Attempt::new(key, job)
    }

    #[test]
    fn the_script_checks_the_directory_runs_the_wrapper_and_then_the_evaluator() {
        let plain = script(&attempt(None)).unwrap();
        assert!(
            plain.contains("if [ ! -d '/out/b'\\''s/cases/c/attempts/2' ]"),
            "{plain}"
        );
        assert!(plain.contains(&format!("exit {DIR_NOT_SHARED}")));
        assert!(plain.contains("'sh' '-c' 'echo '\\''hi'\\'''"), "{plain}");
        assert!(!plain.contains("CASEBATCH_ACTOR_RESULT"));
        let judged = script(&attempt(Some("true"))).unwrap();
        let run = judged.find(WRAPPER_NAME).unwrap();
        let eval = judged.find("CASEBATCH_ACTOR_RESULT").unwrap();
        assert!(run < eval, "the evaluator runs after the harness");
        assert!(judged.contains("if [ \"$code\" -eq 0 ]"));
        assert!(judged.trim_end().ends_with("exit $code"));
    }

    #[test]
    fn sbatch_is_told_the_limits_and_never_to_requeue() {
        let settings = Settings {
            partition: Some("debug".into()),
            extra_args: vec!["--nice=10".into()],
            ..Settings::default()
        };
        let args = sbatch_args(&attempt(None), &settings);
        for expected in [
            "--partition=debug",
            "--mem=256",
            "--cpus-per-task=2",
            "--gres=gpu:2",
            "--time=2",
            "--no-requeue",
            "--nice=10",
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
        }
        assert_eq!(time_limit_minutes(1), 1);
        assert_eq!(time_limit_minutes(60), 1);
        assert_eq!(time_limit_minutes(61), 2);
    }
}
