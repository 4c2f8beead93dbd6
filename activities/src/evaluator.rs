//! Running the evaluator command: it observes the actor's effect and writes
//! `{"verdict": "pass"|"fail", "scores": {...}}` to `CASEBATCH_RESULT`.

use std::collections::BTreeMap;
use std::fs;
use std::process::Stdio;
use std::time::Duration;

use casebatch_bundle::{EvaluationRecord, RECORD_SCHEMA_VERSION, layout::attempt_files};
use casebatch_manifest::model::{CommandSpec, FakeOutcome};
use casebatch_proto::{Evaluation, Failure, FailureClass, Stage, Verdict, codes};
use serde::Deserialize;
use tokio::process::Command;

use crate::runtime::AttemptEnv;

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
        codes::EVALUATOR_FAILED,
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
    let open = |name: &str| fs::File::create(env.file(name));
    let (Ok(out), Ok(err)) = (
        open(attempt_files::EVAL_STDOUT),
        open(attempt_files::EVAL_STDERR),
    ) else {
        record.failure = Some(eval_failure("failed to create evaluator log files".into()));
        return record;
    };
    let case_env = match crate::case_env::for_attempt(env) {
        Ok(e) => e,
        Err(m) => {
            record.failure = Some(Failure::config(
                Stage::Evaluate,
                crate::case_env::PASS_ENV_UNSET,
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
    cmd.current_dir(env.file(attempt_files::WORKDIR))
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
    let parsed = fs::read(&result_path)
        .map_err(|e| format!("it wrote no result at {}: {e}", result_path.display()))
        .and_then(|b| {
            serde_json::from_slice::<EvaluatorOutput>(&b)
                .map_err(|e| format!("its result is not {{\"verdict\": ...}}: {e}"))
        });
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
