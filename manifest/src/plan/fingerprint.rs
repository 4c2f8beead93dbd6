//! The plan's fingerprint: what a batch id is bound to. A batch is resumed only when its
//! manifest plans to the fingerprint its bundle recorded, so for the same cases the value may
//! never change between versions (`tests/plan.rs` pins one recorded by an earlier build).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::model::{
    CommandSpec, FakeScript, Inputs, PassWhen, PlannedCase, Resources, RuntimeKind, Sandbox,
};

/// What the fingerprint covers for one case: its identity and everything that decides how it
/// runs, but not where it was written (lines, absolute paths) or batch-wide knobs
/// (concurrency, retries), so reformatting or moving a manifest keeps resume possible. Whether
/// the case really runs is covered (a simulation is not a run), but not where: `agent` counts
/// as `local-process` (both run the harness as a process), and the table name and the table
/// are left out, so a batch may move onto agents, and an agent may move or be renamed.
#[derive(Serialize)]
struct FingerprintCase<'a> {
    case_id: &'a str,
    runtime: RuntimeKind,
    harness: &'a Option<CommandSpec>,
    evaluator: &'a Option<CommandSpec>,
    /// It decides the verdict as an evaluator does. Skipped when absent, so plans that do not
    /// use it keep the fingerprint they had before it existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pass_when: &'a Option<PassWhen>,
    sandbox: &'a Option<Sandbox>,
    resources: &'a Resources,
    timeout_seconds: u64,
    fake: &'a Option<FakeScript>,
    input: &'a Inputs,
    /// Skipped when empty, so plans made before `env` existed keep their fingerprint.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pass_env: &'a [String],
}

/// sha256 over the canonical JSON (sorted keys, no whitespace) of the cases, in order.
/// Hashed case by case: the same bytes as the canonical JSON of the whole list, without
/// holding every case as a JSON tree at once (250 MB for 100,000 cases), and as each case is
/// planned, so its commands as written need not be kept beside the resolved ones.
pub(super) struct Fingerprint {
    hash: Sha256,
    text: String,
    first: bool,
}

impl Fingerprint {
    pub(super) fn new() -> Self {
        let mut hash = Sha256::new();
        hash.update(b"casebatch-fingerprint-v1\n[");
        Self {
            hash,
            text: String::new(),
            first: true,
        }
    }

    /// Adds the next case, with its commands as written.
    pub(super) fn add(&mut self, c: &PlannedCase) {
        if !std::mem::take(&mut self.first) {
            self.text.push(',');
        }
        let view = FingerprintCase {
            case_id: &c.case_id,
            runtime: match c.runtime {
                // Each runs the harness as a process: a batch may move between them.
                RuntimeKind::Agent | RuntimeKind::Slurm => RuntimeKind::LocalProcess,
                kind => kind,
            },
            harness: &c.harness,
            evaluator: &c.evaluator,
            pass_when: &c.pass_when,
            sandbox: &c.sandbox,
            resources: &c.resources,
            timeout_seconds: c.timeout_seconds,
            fake: &c.fake,
            input: &c.input,
            env: &c.env,
            pass_env: &c.pass_env,
        };
        canonical_json(
            &serde_json::to_value(view).unwrap_or(Value::Null),
            &mut self.text,
        );
        self.hash.update(self.text.as_bytes());
        self.text.clear();
    }

    pub(super) fn finish(mut self) -> String {
        self.hash.update(b"]");
        hex::encode(self.hash.finalize())
    }
}

/// JSON with object keys sorted, whatever map type serde_json was built with.
fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                canonical_json(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys() {
        let v: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"d": [1, "x"], "c": null}}"#).unwrap();
        let mut out = String::new();
        canonical_json(&v, &mut out);
        assert_eq!(out, r#"{"a":{"c":null,"d":[1,"x"]},"b":1}"#);
    }
}
