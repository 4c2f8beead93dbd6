//! The result files' contract, enforced for every field: what a harness may write to
//! `$CASEBATCH_RESULT` ([`ResultFile`]) and an evaluator to its own ([`EvaluatorResultFile`]).
//!
//! A result is checked field by field, so a refusal names the field and the value
//! (`scores.acc must be a number, got "high"`), the rule `usage` always followed: a score that
//! is not a number, a `failure.class` outside the taxonomy or a wrong type anywhere is never
//! dropped or guessed at. The JSON Schema of the same shapes is what `casebatch config schema
//! --kind result` prints for harness authors; a unit test holds the check and the schema to one
//! answer on every example, so the two cannot drift.
//!
//! What is read here is untrusted input read through [`crate::files`]; `outputs` (any JSON, as
//! large as the file) is skipped while parsing, never held as a tree.

use std::collections::BTreeMap;
use std::fmt;

use casebatch_proto::{FailureClass, FailureCode, Usage};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

/// A harness's result file (`$CASEBATCH_RESULT`). Every field may be left out (or `null`);
/// fields not named here are ignored.
#[derive(Debug, JsonSchema)]
#[schemars(title = "casebatch harness result")]
pub struct ResultFile {
    /// What the harness produced: any JSON, kept in the case's `result.json` (a CSV summary
    /// reads it as `outputs.NAME`).
    pub outputs: Option<Value>,
    /// Named numbers (`{"accuracy": 0.75}`), averaged by `batch report`. Numbers only: write a
    /// yes/no as 1 or 0.
    pub scores: Option<BTreeMap<String, f64>>,
    /// What the attempt consumed (`{"input_tokens": 1200, "cost_usd": 0.02}`): names of 1 to 64
    /// characters of `a-z`, `0-9` and `_`, each a non-negative number; a budget counts
    /// `cost_usd` and `input_tokens` + `output_tokens`.
    #[serde(default)]
    #[schemars(schema_with = "usage_schema")]
    pub usage: Option<Usage>,
    /// A failure the harness declares about itself; it decides the attempt's outcome whatever
    /// the exit status.
    pub failure: Option<DeclaredFailureFile>,
    /// Where the attempt's trace can be pulled from (the collect stage fetches it).
    pub trace: Option<TraceFile>,
}

/// `failure` of a result.
#[derive(Debug, JsonSchema)]
pub struct DeclaredFailureFile {
    /// Whose fault it is: `infra` (the platform's: retried when `retryable`), `config` (setup),
    /// `harness` (the harness broke) or `agent` (a legitimate failed outcome).
    pub class: FailureClass,
    /// A stable code of the harness's own (`BROWSER_DOWN`), or one of casebatch's
    /// (`RATE_LIMITED`).
    #[schemars(length(min = 1))]
    pub code: String,
    pub message: Option<String>,
    /// Whether another attempt may succeed (honoured for `infra` only).
    pub retryable: Option<bool>,
    /// With `RATE_LIMITED`: seconds to wait before the next attempt (at most an hour is
    /// honoured; a negative value asks for no wait).
    pub retry_after_s: Option<f64>,
}

/// `trace` of a result.
#[derive(Debug, JsonSchema)]
pub struct TraceFile {
    pub url: String,
}

/// An evaluator's result file (its own `$CASEBATCH_RESULT`). Fields not named here are
/// ignored.
#[derive(Debug, JsonSchema)]
#[schemars(title = "casebatch evaluator result")]
pub struct EvaluatorResultFile {
    pub verdict: VerdictFile,
    /// Named numbers, joined to the harness's (an evaluator's score wins a shared name).
    pub scores: Option<BTreeMap<String, f64>>,
}

/// The evaluator's verdict.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerdictFile {
    Pass,
    Fail,
}

fn usage_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": ["object", "null"],
        "propertyNames": {"pattern": "^[a-z0-9_]{1,64}$"},
        "additionalProperties": {"type": "number", "minimum": 0}
    })
}

/// A failure the harness declared, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredFailure {
    pub class: FailureClass,
    pub code: FailureCode,
    pub message: String,
    pub retryable: bool,
    /// With `RATE_LIMITED`: how long to wait before the next attempt (the API's
    /// `Retry-After`), in seconds.
    pub retry_after_s: Option<f64>,
}

/// The parts of a harness's result the contract checks, as read: `outputs` and unknown fields
/// skipped, the rest kept as JSON for [`RawResult::check`]. Anything but a JSON object is
/// refused as it is parsed.
#[derive(Debug, Default)]
pub struct RawResult {
    scores: Option<Value>,
    usage: Option<Value>,
    failure: Option<Value>,
    trace: Option<Value>,
}

impl<'de> Deserialize<'de> for RawResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = RawResult;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object ({\"outputs\": ..., \"scores\": {...}, ...})")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawResult, A::Error> {
                let mut raw = RawResult::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let slot = match key.as_ref() {
                        "scores" => &mut raw.scores,
                        "usage" => &mut raw.usage,
                        "failure" => &mut raw.failure,
                        "trace" => &mut raw.trace,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = map.next_value::<Option<Value>>()?;
                }
                Ok(raw)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A result checked against the contract: each part usable, or why not.
#[derive(Debug)]
pub struct Checked {
    /// The declared failure; `Err` says what of it breaks the contract.
    pub failure: Result<Option<DeclaredFailure>, String>,
    /// What the attempt consumed; `Err` names the field at fault.
    pub usage: Result<Option<Usage>, String>,
    /// What else breaks the contract (`scores`, `trace`), each naming its field and value.
    pub others: Vec<String>,
}

impl Checked {
    /// Every way the result breaks the contract, the declared failure's first.
    pub fn violations(&self) -> Vec<&str> {
        let mut all = Vec::new();
        if let Err(why) = &self.failure {
            all.push(why.as_str());
        }
        if let Err(why) = &self.usage {
            all.push(why.as_str());
        }
        all.extend(self.others.iter().map(String::as_str));
        all
    }
}

impl RawResult {
    /// Checks every field it holds (see the module doc).
    pub fn check(&self) -> Checked {
        let mut others = Vec::new();
        if let Some(scores) = &self.scores
            && let Err(why) = check_scores(scores)
        {
            others.push(why);
        }
        if let Some(trace) = &self.trace
            && let Err(why) = check_trace(trace)
        {
            others.push(why);
        }
        Checked {
            failure: self.failure.as_ref().map(declared_failure).transpose(),
            usage: self.usage.as_ref().map(Usage::parse).transpose(),
            others,
        }
    }
}

/// JSON as a refusal quotes it: whole when short, else its start.
fn quoted(v: &Value) -> String {
    const MOST: usize = 80;
    let text = v.to_string();
    match text.char_indices().nth(MOST) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// `scores`: an object of numbers. Every bad score is named.
pub fn check_scores(scores: &Value) -> Result<(), String> {
    let Value::Object(map) = scores else {
        return Err(format!(
            "scores must be an object of numbers (e.g. {{\"accuracy\": 0.75}}), got {}",
            quoted(scores)
        ));
    };
    check_named_scores(map.iter())
}

/// Scores by name: each must be a number. Every bad one is named.
pub fn check_named_scores<'a>(
    scores: impl Iterator<Item = (&'a String, &'a Value)>,
) -> Result<(), String> {
    let bad: Vec<String> = scores
        .filter(|(_, v)| !v.is_number())
        .map(|(name, v)| format!("scores.{name} must be a number, got {}", quoted(v)))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

fn check_trace(trace: &Value) -> Result<(), String> {
    match trace.get("url") {
        Some(Value::String(_)) => Ok(()),
        Some(url) => Err(format!("trace.url must be a string, got {}", quoted(url))),
        None => Err(format!(
            "trace must be an object with a `url` string, got {}",
            quoted(trace)
        )),
    }
}

/// Every class a harness may declare, as a refusal lists them.
fn class_names() -> String {
    [
        FailureClass::Infra,
        FailureClass::Config,
        FailureClass::Harness,
        FailureClass::Agent,
    ]
    .map(FailureClass::as_str)
    .join(", ")
}

fn declared_failure(v: &Value) -> Result<DeclaredFailure, String> {
    let Value::Object(f) = v else {
        return Err(format!(
            "failure must be an object {{\"class\": ..., \"code\": ...}}, got {}",
            quoted(v)
        ));
    };
    // Absent and `null` are the same: not given.
    let field = |name: &str| f.get(name).filter(|v| !v.is_null());
    let class = match field("class") {
        Some(Value::String(s)) => FailureClass::parse(s).ok_or_else(|| {
            format!(
                "failure.class must be one of {}, got {}",
                class_names(),
                quoted(&Value::String(s.clone()))
            )
        })?,
        Some(other) => {
            return Err(format!(
                "failure.class must be one of {}, got {}",
                class_names(),
                quoted(other)
            ));
        }
        None => {
            return Err(format!(
                "failure.class is missing (one of {})",
                class_names()
            ));
        }
    };
    let code = match field("code") {
        Some(Value::String(s)) if !s.is_empty() => FailureCode::parse(s),
        Some(other) => {
            return Err(format!(
                "failure.code must be a non-empty string, got {}",
                quoted(other)
            ));
        }
        None => return Err("failure.code is missing (a string such as \"BROWSER_DOWN\")".into()),
    };
    let message = match field("message") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(format!(
                "failure.message must be a string, got {}",
                quoted(other)
            ));
        }
    };
    let retryable = match field("retryable") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(format!(
                "failure.retryable must be true or false, got {}",
                quoted(other)
            ));
        }
    };
    let retry_after_s = match field("retry_after_s") {
        None => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(other) => {
            return Err(format!(
                "failure.retry_after_s must be a number of seconds, got {}",
                quoted(other)
            ));
        }
    };
    Ok(DeclaredFailure {
        class,
        code,
        message,
        retryable,
        retry_after_s,
    })
}

/// The JSON Schema (draft 2020-12) of a harness's result file.
pub fn result_schema() -> Value {
    schema_of::<ResultFile>("result.json")
}

/// The JSON Schema (draft 2020-12) of an evaluator's result file.
pub fn evaluator_result_schema() -> Value {
    schema_of::<EvaluatorResultFile>("evaluator-result.json")
}

fn schema_of<T: JsonSchema>(file: &str) -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let mut value = generator.into_root_schema_for::<T>().to_value();
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "$id".into(),
            Value::String(format!("https://casebatch.dev/schemas/{file}")),
        );
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Checked {
        serde_json::from_value::<RawResult>(v).unwrap().check()
    }

    #[test]
    fn a_bad_field_is_named_with_its_value() {
        let c = check(json!({"scores": {"acc": "high", "f1": 0.5, "n": null}}));
        assert_eq!(
            c.others,
            vec![r#"scores.acc must be a number, got "high"; scores.n must be a number, got null"#]
        );
        let c = check(json!({"failure": {"class": "cosmic", "code": "X", "retryable": true}}));
        assert_eq!(
            c.failure.unwrap_err(),
            r#"failure.class must be one of infra, config, harness, agent, got "cosmic""#
        );
        let c = check(json!({"failure": {"class": "infra", "code": 7}}));
        assert!(c.failure.unwrap_err().contains("failure.code"));
        let c = check(json!({"failure": {"class": "infra", "code": "X", "retryable": "yes"}}));
        assert!(
            c.failure
                .unwrap_err()
                .contains(r#"failure.retryable must be true or false, got "yes""#)
        );
        let c = check(json!({"usage": {"cost_usd": "free"}}));
        assert!(c.usage.unwrap_err().contains("usage.cost_usd"));
        let c = check(json!({"trace": "http://x"}));
        assert!(
            c.others[0].contains("trace must be an object"),
            "{:?}",
            c.others
        );
        let c = check(json!({"scores": [1]}));
        assert!(
            c.others[0].starts_with("scores must be an object"),
            "{:?}",
            c.others
        );
    }

    #[test]
    fn a_long_value_is_quoted_by_its_start() {
        let c = check(json!({"scores": {"acc": "x".repeat(500)}}));
        assert!(c.others[0].len() < 150, "{}", c.others[0]);
        assert!(c.others[0].ends_with("..."), "{}", c.others[0]);
    }

    #[test]
    fn a_good_result_passes_and_null_is_absent() {
        let c = check(json!({
            "outputs": {"anything": [1, "x", null]},
            "scores": {"acc": 1, "f1": 0.5},
            "usage": {"cost_usd": 0.1},
            "failure": {"class": "infra", "code": "RATE_LIMITED", "retryable": true,
                        "retry_after_s": 2, "message": null},
            "trace": {"url": "http://127.0.0.1/t"},
            "extra": "ignored"
        }));
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        let f = c.failure.unwrap().unwrap();
        assert_eq!(
            (f.class, f.code.as_str(), f.retryable, f.retry_after_s),
            (FailureClass::Infra, "RATE_LIMITED", true, Some(2.0))
        );
        let c = check(json!({"scores": null, "usage": null, "failure": null, "trace": null}));
        assert!(c.violations().is_empty());
        assert!(matches!(c.failure, Ok(None)));
    }

    #[test]
    fn only_an_object_is_a_result() {
        for text in ["[1, 2]", "\"x\"", "3", "null"] {
            let err = serde_json::from_str::<RawResult>(text).unwrap_err();
            assert!(
                err.to_string().contains("expected a JSON object"),
                "{text}: {err}"
            );
        }
    }

    /// The schema a harness author checks against and the check casebatch runs agree on
    /// every example: valid under one exactly when valid under the other.
    #[test]
    fn the_schema_and_the_check_agree() {
        let schema = result_schema();
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        let examples = [
            json!({}),
            json!({"outputs": "anything", "extra": 1}),
            json!({"scores": {"acc": 1, "f1": 0.25}}),
            json!({"scores": {"acc": "high"}}),
            json!({"scores": {"acc": true}}),
            json!({"scores": {"acc": null}}),
            json!({"scores": [1]}),
            json!({"scores": null}),
            json!({"usage": {"cost_usd": 0.5, "input_tokens": 3}}),
            json!({"usage": {"cost_usd": -1}}),
            json!({"usage": {"Cost": 1}}),
            json!({"usage": {"cost_usd": "free"}}),
            json!({"usage": 3}),
            json!({"failure": {"class": "agent", "code": "GAVE_UP"}}),
            json!({"failure": {"class": "cosmic", "code": "X"}}),
            json!({"failure": {"class": "infra"}}),
            json!({"failure": {"code": "X"}}),
            json!({"failure": {"class": "infra", "code": ""}}),
            json!({"failure": {"class": "infra", "code": "X", "retryable": "yes"}}),
            json!({"failure": {"class": "infra", "code": "X", "retry_after_s": "2"}}),
            json!({"failure": {"class": "infra", "code": "X", "message": 3}}),
            json!({"failure": "broke"}),
            json!({"trace": {"url": "http://x"}}),
            json!({"trace": {"url": 1}}),
            json!({"trace": "http://x"}),
        ];
        for example in examples {
            let by_schema = validator.is_valid(&example);
            let by_check = check(example.clone()).violations().is_empty();
            assert_eq!(by_schema, by_check, "{example}");
        }
    }

    #[test]
    fn the_evaluators_schema_takes_a_verdict_and_numbers() {
        let schema = evaluator_result_schema();
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        assert!(validator.is_valid(&json!({"verdict": "pass", "scores": {"n": 1}})));
        assert!(!validator.is_valid(&json!({"verdict": "maybe"})));
        assert!(!validator.is_valid(&json!({"verdict": "fail", "scores": {"n": "x"}})));
        assert!(!validator.is_valid(&json!({"scores": {}})));
    }
}
