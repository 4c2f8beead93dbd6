//! Running the evaluator command: it observes the actor's effect and writes
//! `{"verdict": "pass"|"fail", "scores": {...}}` to `CASEBATCH_RESULT`.

use std::collections::BTreeMap;
use std::fs;
use std::process::Stdio;
use std::time::Duration;

use casebatch_bundle::{EvaluationRecord, RECORD_SCHEMA_VERSION, layout::attempt_files};
use casebatch_manifest::model::{CommandSpec, FakeOutcome};
use casebatch_proto::{Evaluation, Failure, FailureClass, FailureCode, Stage, Verdict};
use serde::Deserialize;
use tokio::process::Command;

use casebatch_runtime::AttemptEnv;
use casebatch_runtime::attempt_io;

#[derive(Deserialize)]
struct EvaluatorOutput {
    verdict: String,
    #[serde(default)]
    scores: BTreeMap<String, serde_json::Value>,
}

fn eval_failure(message: String) -> Failure {
    Failure::new(
        Stage::Evaluate,
        FailureClass::Harness,
        FailureCode::EvaluatorFailed,
        message,
        false,
    )
}

/// Runs the configured evaluator for the attempt and returns the record to write.
pub async fn run(env: &AttemptEnv, command: &CommandSpec) -> EvaluationRecord {
    let mut record = EvaluationRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        configured: true,
        verdict: None,
        scores: BTreeMap::new(),
        failure: None,
        exit_code: None,
    };
    // Appended, and only as regular files: the harness ran before and could have planted a
    // FIFO or a symlink at these paths.
    let open = |name: &str| attempt_io::open_log(&env.file(name));
    let (out, err) = match (
        open(attempt_files::EVAL_STDOUT),
        open(attempt_files::EVAL_STDERR),
    ) {
        (Ok(out), Ok(err)) => (out, err),
        (Err(e), _) | (_, Err(e)) => {
            record.failure = Some(eval_failure(format!(
                "failed to open the evaluator's log files: {e}"
            )));
            return record;
        }
    };
    let case_env = match casebatch_runtime::case_env::for_attempt(env) {
        Ok(e) => e,
        Err(m) => {
            record.failure = Some(Failure::config(
                Stage::Evaluate,
                FailureCode::PassEnvUnset,
                m,
            ));
            return record;
        }
    };
    let result_path = env.file(attempt_files::EVAL_RESULT);
    let _ = fs::remove_file(&result_path);
    let mut cmd = match command {
        CommandSpec::Shell(s) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(s);
            c
        }
        CommandSpec::Argv(argv) => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    // The evaluator runs on the worker. A job that ran elsewhere (on an agent) left no
    // working directory here, so the evaluator gets an empty one.
    let workdir = env.file(attempt_files::WORKDIR);
    if let Err(e) = fs::create_dir_all(&workdir) {
        record.failure = Some(eval_failure(format!(
            "cannot create the evaluator's working directory {}: {e}",
            workdir.display()
        )));
        return record;
    }
    cmd.current_dir(workdir)
        .env_clear()
        .envs(case_env)
        .env("CASEBATCH_ACTOR_RESULT", env.file(attempt_files::RESULT))
        .env("CASEBATCH_RESULT", &result_path)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    let timeout = Duration::from_secs(env.case.timeout_seconds.max(1));
    let status = match cmd.spawn() {
        Ok(mut child) => match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                record.failure = Some(eval_failure(format!(
                    "failed to wait for the evaluator: {e}"
                )));
                return record;
            }
            Err(_) => {
                record.failure = Some(eval_failure(format!(
                    "the evaluator ran past {}s",
                    timeout.as_secs()
                )));
                return record;
            }
        },
        Err(e) => {
            record.failure = Some(eval_failure(format!("failed to start the evaluator: {e}")));
            return record;
        }
    };
    record.exit_code = status.code();
    // Same rules as the harness's result: regular file, size limit, off the async threads.
    let parsed = match attempt_io::read_json::<EvaluatorOutput>(
        result_path.clone(),
        attempt_io::max_result_bytes(),
    )
    .await
    {
        Ok(Some(o)) => Ok(o),
        Ok(None) => Err(format!("it wrote no result at {}", result_path.display())),
        Err(e) if e.is_too_large() => {
            record.failure = Some(Failure::new(
                Stage::Evaluate,
                FailureClass::Harness,
                FailureCode::ResultTooLarge,
                format!("the evaluator's result was not read: {e}"),
                false,
            ));
            return record;
        }
        Err(e @ attempt_io::FileError::Parse { .. }) => {
            Err(format!("its result is not {{\"verdict\": ...}}: {e}"))
        }
        Err(e) => Err(format!("its result is unusable: {e}")),
    };
    match parsed {
        Ok(o) if o.verdict == "pass" || o.verdict == "fail" => {
            record.verdict = Some(if o.verdict == "pass" {
                Verdict::Pass
            } else {
                Verdict::Fail
            });
            record.scores = o.scores;
        }
        Ok(o) => {
            record.failure = Some(eval_failure(format!(
                "verdict must be \"pass\" or \"fail\", got {:?}",
                o.verdict
            )))
        }
        Err(why) => {
            record.failure = Some(eval_failure(format!(
                "the evaluator exited with {:?} and {why}",
                status.code()
            )))
        }
    }
    record
}

/// The simulated evaluator of the `fake` runtime.
pub fn simulated(outcome: FakeOutcome) -> EvaluationRecord {
    EvaluationRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        configured: true,
        verdict: Some(if outcome == FakeOutcome::Fail {
            Verdict::Fail
        } else {
            Verdict::Pass
        }),
        scores: BTreeMap::new(),
        failure: None,
        exit_code: None,
    }
}

/// What the workflow needs of an evaluation record.
pub fn to_evaluation(r: &EvaluationRecord) -> Evaluation {
    {
        // A fail verdict is an agent outcome, carried as a failure so reports break it down.
        let failure = r.failure.clone().or_else(|| {
            (r.verdict == Some(Verdict::Fail))
                .then(|| Failure::agent("the evaluator's verdict is fail"))
        });
        Evaluation {
            configured: r.configured,
            verdict: r.verdict,
            failure,
        }
    }
}
