//! An attempt's evaluation record: how it is made from what an evaluator wrote (untrusted
//! input, read like the harness's result, [`crate::files`]), what the workflow needs of it
//! ([`Evaluation`]: the verdict, with a fail verdict carried as an `agent` failure), and its
//! typed form on the agent's wire.

use std::collections::BTreeMap;
use std::path::Path;

use casebatch_proto::runtime_v1 as wire;
use casebatch_proto::{Evaluation, Failure, FailureCode, Stage, Verdict};
use serde::Deserialize;

use crate::files;
use crate::layout::attempt_files;
use crate::records::{EvaluationRecord, RECORD_SCHEMA_VERSION};
use crate::result_contract::check_named_scores;

/// The exit status of an evaluator that could not join the attempt's cgroup (before it ran).
pub const JOIN_FAILED: i32 = 96;

#[derive(Deserialize)]
struct EvaluatorOutput {
    verdict: String,
    #[serde(default)]
    scores: BTreeMap<String, serde_json::Value>,
}

pub(crate) fn eval_failure(message: String) -> Failure {
    Failure::harness(Stage::Evaluate, FailureCode::EvaluatorFailed, message)
}

impl EvaluationRecord {
    /// The record of a case with no evaluator.
    pub fn not_configured() -> Self {
        Self {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            configured: false,
            verdict: None,
            scores: BTreeMap::new(),
            failure: None,
            exit_code: None,
            pass_when: None,
        }
    }

    /// The verdict of a case's `pass_when`, where no evaluator runs: pass when the harness's
    /// `scores` hold `score` as a number at least `at_least`, fail (an agent outcome, as an
    /// evaluator's fail verdict) when below. Without the score as a number there is no
    /// verdict: the harness did not report what the manifest says decides the case, which is
    /// its failure (`HARNESS_BAD_RESULT`, naming the score), not the agent's.
    pub fn by_score(
        score: &str,
        at_least: f64,
        scores: &BTreeMap<String, serde_json::Value>,
    ) -> Self {
        let judged = |verdict, failure, rule: String| Self {
            configured: true,
            verdict,
            failure,
            pass_when: Some(rule),
            ..Self::not_configured()
        };
        let Some(x) = scores.get(score).and_then(serde_json::Value::as_f64) else {
            let (found, why) = match scores.get(score) {
                None => ("none".to_string(), "no such score".to_string()),
                Some(v) => (v.to_string(), format!("it as {v}, not a number")),
            };
            let failure = Failure::harness(
                Stage::Evaluate,
                FailureCode::HarnessBadResult,
                format!(
                    "pass_when decides by score `{score}`, but the harness's result has {why} \
                     (scores.{score})"
                ),
            );
            let rule = format!("score {score} = {found}, pass_when at_least {at_least}");
            return judged(None, Some(failure), rule);
        };
        let rule = format!("score {score} = {x}, pass_when at_least {at_least}");
        if x >= at_least {
            judged(Some(Verdict::Pass), None, rule)
        } else {
            let failure = Failure::agent(format!(
                "score {score} is {x}, below pass_when's at_least {at_least}"
            ));
            judged(Some(Verdict::Fail), Some(failure), rule)
        }
    }

    /// The record of an evaluation that gave no verdict.
    pub fn failed(failure: Failure) -> Self {
        Self {
            configured: true,
            failure: Some(failure),
            ..Self::not_configured()
        }
    }

    /// What the workflow needs of an evaluation record.
    pub fn to_evaluation(&self) -> Evaluation {
        let r = self;
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

    /// The record as the agent sends it.
    pub fn to_wire(&self, job_key: &str) -> wire::Evaluation {
        let r = self;
        wire::Evaluation {
            job_key: job_key.to_string(),
            configured: r.configured,
            verdict: match r.verdict {
                None => wire::Verdict::Unspecified,
                Some(Verdict::Pass) => wire::Verdict::Pass,
                Some(Verdict::Fail) => wire::Verdict::Fail,
            } as i32,
            // A score is any JSON value the evaluator chose: kept as its own JSON text, so `1`
            // stays `1` (not `1.0`) in the bundle.
            scores_json: r
                .scores
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
            failure: r.failure.as_ref().map(Into::into),
            exit_code: r.exit_code,
        }
    }

    /// The record an agent sent; `Err` says what of it is unusable.
    pub fn from_wire(e: wire::Evaluation) -> Result<Self, String> {
        let verdict = match wire::Verdict::try_from(e.verdict) {
            Ok(wire::Verdict::Unspecified) => None,
            Ok(wire::Verdict::Pass) => Some(Verdict::Pass),
            Ok(wire::Verdict::Fail) => Some(Verdict::Fail),
            Err(_) => return Err(format!("unknown verdict {}", e.verdict)),
        };
        let scores = e
            .scores_json
            .into_iter()
            .map(|(k, v)| match serde_json::from_str(&v) {
                Ok(value) => Ok((k, value)),
                Err(err) => Err(format!("score {k:?} is not JSON: {err}")),
            })
            .collect::<Result<_, _>>()?;
        Ok(EvaluationRecord {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            configured: e.configured,
            verdict,
            scores,
            failure: e.failure.map(TryInto::try_into).transpose()?,
            exit_code: e.exit_code,
            // An agent runs evaluators only; a `pass_when` verdict is made on the worker.
            pass_when: None,
        })
    }
}

/// The record of an evaluator that exited with `exit_code`, from the result it wrote at
/// `path` (same rules as the harness's result: regular file, size limit, off the async
/// threads).
pub async fn read_result(path: &Path, exit_code: Option<i32>) -> EvaluationRecord {
    let judged = |verdict, scores, failure| EvaluationRecord {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        configured: true,
        verdict,
        scores,
        failure,
        exit_code,
        pass_when: None,
    };
    let no_verdict = |failure| judged(None, BTreeMap::new(), Some(failure));
    let parsed =
        match files::read_json::<EvaluatorOutput>(path.to_path_buf(), files::max_result_bytes())
            .await
        {
            Ok(Some(o)) => Ok(o),
            Ok(None) if exit_code == Some(JOIN_FAILED) => Err(format!(
                "wrote no result at {} (exit {JOIN_FAILED}: it may not have joined the attempt's \
             cgroup; see {})",
                path.display(),
                attempt_files::EVAL_STDERR
            )),
            Ok(None) => Err(format!("it wrote no result at {}", path.display())),
            Err(e) if e.is_too_large() => {
                return no_verdict(Failure::harness(
                    Stage::Evaluate,
                    FailureCode::ResultTooLarge,
                    format!("the evaluator's result was not read: {e}"),
                ));
            }
            Err(e @ files::FileError::Parse { .. }) => {
                Err(format!("its result is not {{\"verdict\": ...}}: {e}"))
            }
            Err(e) => Err(format!("its result is unusable: {e}")),
        };
    // The scores are held to the contract as the harness's are (`result_contract`): one
    // that is not a number is never kept or dropped in silence.
    let parsed = parsed.and_then(|o| match check_named_scores(o.scores.iter()) {
        Ok(()) => Ok(o),
        Err(why) => Err(format!(
            "its result breaks the contract: {why} (`casebatch config schema --kind \
             evaluator-result` prints it)"
        )),
    });
    match parsed {
        Ok(o) if o.verdict == "pass" => judged(Some(Verdict::Pass), o.scores, None),
        Ok(o) if o.verdict == "fail" => judged(Some(Verdict::Fail), o.scores, None),
        Ok(o) => no_verdict(eval_failure(format!(
            "verdict must be \"pass\" or \"fail\", got {:?}",
            o.verdict
        ))),
        Err(why) => no_verdict(eval_failure(format!(
            "the evaluator exited with {exit_code:?} and {why}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::FailureClass;

    fn pass() -> EvaluationRecord {
        EvaluationRecord {
            configured: true,
            verdict: Some(Verdict::Pass),
            ..EvaluationRecord::not_configured()
        }
    }

    #[test]
    fn pass_when_gives_a_verdict_from_a_score() {
        let scores = |v: serde_json::Value| BTreeMap::from([("match".to_string(), v)]);
        let pass = EvaluationRecord::by_score("match", 1.0, &scores(serde_json::json!(1)));
        assert_eq!(
            (pass.configured, pass.verdict, &pass.failure),
            (true, Some(Verdict::Pass), &None)
        );
        assert_eq!(pass.to_evaluation().failure, None);
        assert_eq!(
            pass.pass_when.as_deref(),
            Some("score match = 1, pass_when at_least 1")
        );
        // Below: a fail verdict, the agent's, saying by how much.
        let fail =
            EvaluationRecord::by_score("match", 1.0, &scores(serde_json::json!(0))).to_evaluation();
        assert_eq!(fail.verdict, Some(Verdict::Fail));
        let f = fail.failure.unwrap();
        assert_eq!(
            (f.class, f.code.clone()),
            (FailureClass::Agent, FailureCode::VerdictFail)
        );
        assert!(
            f.message
                .contains("score match is 0, below pass_when's at_least 1"),
            "{f}"
        );
        // Missing or not a number: no verdict, the harness's failure, naming the score.
        for (scores, says) in [
            (BTreeMap::new(), "no such score"),
            (scores(serde_json::json!("high")), "\"high\""),
        ] {
            let e = EvaluationRecord::by_score("match", 1.0, &scores).to_evaluation();
            assert_eq!(e.verdict, None);
            let f = e.failure.unwrap();
            assert_eq!(
                (f.class, f.code.clone()),
                (FailureClass::Harness, FailureCode::HarnessBadResult)
            );
            assert!(
                f.message.contains("`match`") && f.message.contains(says),
                "{f}"
            );
        }
    }

    #[test]
    fn a_record_survives_the_wire_scores_and_all() {
        let record = EvaluationRecord {
            scores: BTreeMap::from([
                ("accuracy".to_string(), serde_json::json!(1)),
                ("f1".to_string(), serde_json::json!(0.5)),
                ("notes".to_string(), serde_json::json!({"a": [1, "x"]})),
            ]),
            verdict: Some(Verdict::Pass),
            exit_code: Some(0),
            ..EvaluationRecord::failed(eval_failure("x".into()))
        };
        let sent = record.to_wire("b/0/1");
        assert_eq!(sent.scores_json["accuracy"], "1");
        assert_eq!(EvaluationRecord::from_wire(sent).unwrap(), record);
        assert_eq!(
            EvaluationRecord::from_wire(EvaluationRecord::not_configured().to_wire("b/0/1"))
                .unwrap(),
            EvaluationRecord::not_configured()
        );
    }

    #[tokio::test]
    async fn a_score_that_is_not_a_number_fails_the_evaluation_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evaluation.json");
        std::fs::write(&path, r#"{"verdict": "pass", "scores": {"acc": "high"}}"#).unwrap();
        let r = read_result(&path, Some(0)).await;
        let f = r.failure.unwrap();
        assert_eq!((r.verdict, f.code), (None, FailureCode::EvaluatorFailed));
        assert!(
            f.message
                .contains(r#"scores.acc must be a number, got "high""#),
            "{}",
            f.message
        );
        std::fs::write(&path, r#"{"verdict": "pass", "scores": {"acc": 1}}"#).unwrap();
        let r = read_result(&path, Some(0)).await;
        assert_eq!(
            (r.verdict, r.scores["acc"].clone()),
            (Some(Verdict::Pass), serde_json::json!(1))
        );
    }

    #[test]
    fn an_unusable_record_from_the_wire_says_what_is_wrong() {
        let mut sent = pass().to_wire("b/0/1");
        sent.scores_json.insert("x".into(), "{not json".into());
        assert!(
            EvaluationRecord::from_wire(sent)
                .unwrap_err()
                .contains("score \"x\"")
        );
        let mut sent = pass().to_wire("b/0/1");
        sent.verdict = 9;
        assert!(
            EvaluationRecord::from_wire(sent)
                .unwrap_err()
                .contains("verdict 9")
        );
    }
}
