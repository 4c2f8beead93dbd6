//! Reading model structs out of a JSON value field by field, reporting every problem.
//!
//! serde's derive stops at the first error and says neither which task nor which line, so
//! objects are walked by hand: each field is type-checked on its own, unknown keys are named
//! with their nearest valid spelling, and the walk always continues. The field lists below
//! must match the model structs; a unit test in `schema` compares them with the generated
//! JSON Schema.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::model::{
    BudgetSpec, CommandSpec, Defaults, FakeOutcome, FakeScript, PassWhen, RateSpec, Resources,
    RunSpec, RuntimeChoice, RuntimeKind, Sandbox, SummarySpec, Task,
};
use crate::report::{FieldPath, Report};

pub(crate) const DEFAULTS_FIELDS: &[&str] = &[
    "concurrency",
    "max_retries",
    "max_rate_limit_retries",
    "timeout_seconds",
    "sandbox",
    "resources",
    "harness",
    "evaluator",
    "pass_when",
    "runtime",
    "controller_url",
    "device_controller_url",
    "fake",
    "oom_auto_boost",
    "prepare_ahead",
    "priority",
    "weight",
    "heartbeat_every_seconds",
    "epochs",
    "budget",
    "rate",
    "env",
    "pass_env",
];
pub(crate) const BUDGET_FIELDS: &[&str] = &["cost_usd", "tokens"];
pub(crate) const PASS_WHEN_FIELDS: &[&str] = &["score", "at_least"];
pub(crate) const RATE_FIELDS: &[&str] = &["starts_per_minute", "rate_key"];
pub(crate) const SANDBOX_FIELDS: &[&str] = &[
    "provider", "template", "platform", "lifetime", "network", "pull", "user",
];
pub(crate) const RESOURCES_FIELDS: &[&str] = &["cpu", "memory_mb", "gpus", "log_mb"];
pub(crate) const FAKE_FIELDS: &[&str] = &[
    "duration_ms",
    "outcome",
    "infra_failures_first",
    "provision_ms",
];
pub(crate) const SUMMARY_FIELDS: &[&str] = &["fields", "write_csv"];
pub(crate) const TASK_FIELDS: &[&str] = &[
    "task_id",
    "agent_kind",
    "query",
    "url",
    "max_steps",
    "sandbox",
    "resources",
    "timeout_seconds",
    "fake",
    "epochs",
    "harness",
    "evaluator",
    "pass_when",
    "runtime",
    "inputs",
    "env",
    "pass_env",
];
pub(crate) const RUNSPEC_FIELDS: &[&str] = &[
    "agent_kind",
    "query",
    "url",
    "max_steps",
    "sandbox",
    "resources",
    "timeout_seconds",
    "fake",
    "epochs",
    "inputs",
    "harness",
    "evaluator",
    "pass_when",
    "runtime",
    "env",
    "pass_env",
];

/// A value type a single field may hold, with how to describe it to a user.
pub(crate) trait Leaf: DeserializeOwned {
    const EXPECTED: &'static str;
    /// A number: a field's own bounds, where it has some, describe it better than the type.
    const NUMBER: bool = false;
}

macro_rules! leaf {
    ($($t:ty => $e:expr),* $(,)?) => { $(impl Leaf for $t { const EXPECTED: &'static str = $e; })* };
}

macro_rules! number {
    ($($t:ty => $e:expr),* $(,)?) => { $(impl Leaf for $t {
        const EXPECTED: &'static str = $e;
        const NUMBER: bool = true;
    })* };
}

number! {
    u32 => "a whole number (0 to 4294967295)",
    u64 => "a whole number",
    f64 => "a number",
}

leaf! {
    String => "a string",
    bool => "true or false",
    Vec<String> => "a list of strings",
    BTreeMap<String, Value> => "a mapping of names to values",
    CommandSpec => "a command: a shell string or a list of argv strings",
    RuntimeKind => "`local-process`, `fake` or `agent`",
    RuntimeChoice => "a runtime name, or a list of runtime names",
    FakeOutcome => "one of `pass`, `fail`, `harness_error`, `infra_error`, `oom_killed`",
}

/// A short, user-facing description of what was found.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => {
            let mut short: String = s.chars().take(40).collect();
            if short.len() < s.len() {
                short.push('…');
            }
            format!("string {short:?}")
        }
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

/// Type-check one value. A number is described by its field's own bounds where it has some
/// (`concurrency`: 1 to 512), else by its type.
pub(crate) fn leaf<T: Leaf>(value: &Value, path: &FieldPath, r: &mut Report) -> Option<T> {
    match T::deserialize(value) {
        Ok(v) => Some(v),
        Err(_) => {
            let expected = path
                .last_key()
                .filter(|_| T::NUMBER)
                .and_then(crate::limits::expected_of_field)
                .unwrap_or_else(|| T::EXPECTED.to_string());
            let fix = match value {
                // The usual YAML surprise: `task_id: 123` is a number.
                Value::Number(_) | Value::Bool(_) if T::EXPECTED == String::EXPECTED => {
                    format!("quote the value: {path}: \"{value}\"")
                }
                _ => format!("write {path} as {expected}"),
            };
            r.at(
                path,
                format!("expected {expected}, found {}", describe(value)),
                fix,
            );
            None
        }
    }
}

/// An object being read against a known list of fields.
pub(crate) struct Obj<'v> {
    map: &'v Map<String, Value>,
    path: FieldPath,
    fields: &'static [&'static str],
}

impl<'v> Obj<'v> {
    /// `None` (with a problem) when `value` is not a mapping.
    pub(crate) fn new(
        value: &'v Value,
        path: &FieldPath,
        fields: &'static [&'static str],
        r: &mut Report,
    ) -> Option<Self> {
        match value {
            Value::Object(map) => Some(Obj {
                map,
                path: path.clone(),
                fields,
            }),
            other => {
                let what = if path.is_root() {
                    "make it a mapping (a JSON object)".to_string()
                } else {
                    format!("write {path} as a mapping")
                };
                r.at(
                    path,
                    format!("expected a mapping, found {}", describe(other)),
                    format!("{what} with fields: {}", fields.join(", ")),
                );
                None
            }
        }
    }

    pub(crate) fn path(&self) -> &FieldPath {
        &self.path
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The value of a known field; `null` counts as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn opt<T: Leaf>(&self, key: &str, r: &mut Report) -> Option<T> {
        self.get(key).and_then(|v| leaf(v, &self.path.key(key), r))
    }

    /// A required field; `fix` says what to write when it is missing.
    pub(crate) fn req<T: Leaf>(&self, key: &str, fix: &str, r: &mut Report) -> Option<T> {
        if self.get(key).is_none() {
            r.at(&self.path, format!("missing required field `{key}`"), fix);
            return None;
        }
        self.opt(key, r)
    }

    /// A field holding a nested struct, read by `read`.
    pub(crate) fn nested<T>(
        &self,
        key: &str,
        r: &mut Report,
        read: impl FnOnce(&'v Value, &FieldPath, &mut Report) -> Option<T>,
    ) -> Option<T> {
        self.get(key).and_then(|v| read(v, &self.path.key(key), r))
    }

    /// Keys that are not fields of this struct.
    pub(crate) fn extra(&self) -> impl Iterator<Item = (&'v String, &'v Value)> + '_ {
        self.map
            .iter()
            .filter(|(k, _)| !self.fields.contains(&k.as_str()))
    }

    /// Report every key that is not a field of this struct.
    pub(crate) fn deny_unknown(&self, r: &mut Report) {
        for (key, _) in self.extra() {
            let fix = match nearest(key, self.fields) {
                Some(near) => format!("rename it to `{near}`"),
                None => format!("remove it; allowed here: {}", self.fields.join(", ")),
            };
            r.at(&self.path.key(key), format!("unknown field `{key}`"), fix);
        }
    }
}

/// The closest allowed name within a small edit distance, for "did you mean" fixes.
pub(crate) fn nearest<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let budget = (key.chars().count() / 3).max(2);
    allowed
        .iter()
        .map(|a| (strsim::levenshtein(&key.to_ascii_lowercase(), a), *a))
        .filter(|(d, _)| *d <= budget)
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

pub(crate) fn defaults(value: &Value, path: &FieldPath, r: &mut Report) -> Option<Defaults> {
    let o = Obj::new(value, path, DEFAULTS_FIELDS, r)?;
    o.deny_unknown(r);
    Some(Defaults {
        concurrency: o.opt("concurrency", r),
        max_retries: o.opt("max_retries", r),
        max_rate_limit_retries: o.opt("max_rate_limit_retries", r),
        timeout_seconds: o.opt("timeout_seconds", r),
        sandbox: o.nested("sandbox", r, sandbox),
        resources: o.nested("resources", r, resources),
        harness: o.opt("harness", r),
        evaluator: o.opt("evaluator", r),
        pass_when: o.nested("pass_when", r, pass_when),
        runtime: o.opt("runtime", r),
        controller_url: o.opt("controller_url", r),
        device_controller_url: o.opt("device_controller_url", r),
        fake: o.nested("fake", r, fake),
        oom_auto_boost: o.opt("oom_auto_boost", r),
        prepare_ahead: o.opt("prepare_ahead", r),
        priority: o.opt("priority", r),
        weight: o.opt("weight", r),
        heartbeat_every_seconds: o.opt("heartbeat_every_seconds", r),
        epochs: o.opt("epochs", r),
        budget: o.nested("budget", r, budget),
        rate: o.nested("rate", r, rate),
        env: o.nested("env", r, env),
        pass_env: o.opt("pass_env", r),
    })
}

pub(crate) fn budget(value: &Value, path: &FieldPath, r: &mut Report) -> Option<BudgetSpec> {
    let o = Obj::new(value, path, BUDGET_FIELDS, r)?;
    o.deny_unknown(r);
    Some(BudgetSpec {
        cost_usd: o.opt("cost_usd", r),
        tokens: o.opt("tokens", r),
    })
}

pub(crate) fn pass_when(value: &Value, path: &FieldPath, r: &mut Report) -> Option<PassWhen> {
    let o = Obj::new(value, path, PASS_WHEN_FIELDS, r)?;
    o.deny_unknown(r);
    let score = o.req(
        "score",
        &format!("name the score that decides, e.g. {path}: {{score: match, at_least: 1}}"),
        r,
    );
    let at_least = o.req(
        "at_least",
        &format!("set the least passing value, e.g. {path}: {{score: match, at_least: 1}}"),
        r,
    );
    Some(PassWhen {
        score: score?,
        at_least: at_least?,
    })
}

pub(crate) fn rate(value: &Value, path: &FieldPath, r: &mut Report) -> Option<RateSpec> {
    let o = Obj::new(value, path, RATE_FIELDS, r)?;
    o.deny_unknown(r);
    Some(RateSpec {
        starts_per_minute: o.req(
            "starts_per_minute",
            "set how many cases may start per minute, e.g. starts_per_minute: 60",
            r,
        )?,
        rate_key: o.opt("rate_key", r),
    })
}

/// `env:`, a mapping of variable names to string values; each value is type-checked on its
/// own so a number names its own line.
pub(crate) fn env(
    value: &Value,
    path: &FieldPath,
    r: &mut Report,
) -> Option<BTreeMap<String, String>> {
    let Value::Object(map) = value else {
        r.at(
            path,
            format!(
                "expected a mapping of names to values, found {}",
                describe(value)
            ),
            format!("write {path} as a mapping such as `{{LOG_LEVEL: debug}}`"),
        );
        return None;
    };
    let mut out = BTreeMap::new();
    for (name, v) in map {
        if let Some(v) = leaf::<String>(v, &path.key(name), r) {
            out.insert(name.clone(), v);
        }
    }
    Some(out)
}

pub(crate) fn sandbox(value: &Value, path: &FieldPath, r: &mut Report) -> Option<Sandbox> {
    let o = Obj::new(value, path, SANDBOX_FIELDS, r)?;
    o.deny_unknown(r);
    let provider = o.req(
        "provider",
        &format!("add `provider:` to {path} (a task's sandbox replaces the default whole, so it must be complete)"),
        r,
    );
    // Read the other fields even without a provider, so their problems are reported too.
    let template = o.opt("template", r);
    let platform = o.opt("platform", r);
    let lifetime = o.opt("lifetime", r);
    let network = o.opt("network", r);
    let pull = o.opt("pull", r);
    let user = o.opt("user", r);
    Some(Sandbox {
        provider: provider?,
        template,
        platform,
        lifetime,
        network,
        pull,
        user,
    })
}

pub(crate) fn resources(value: &Value, path: &FieldPath, r: &mut Report) -> Option<Resources> {
    let o = Obj::new(value, path, RESOURCES_FIELDS, r)?;
    o.deny_unknown(r);
    Some(Resources {
        cpu: o.opt("cpu", r),
        memory_mb: o.opt("memory_mb", r),
        gpus: o.opt("gpus", r),
        log_mb: o.opt("log_mb", r),
    })
}

pub(crate) fn fake(value: &Value, path: &FieldPath, r: &mut Report) -> Option<FakeScript> {
    let o = Obj::new(value, path, FAKE_FIELDS, r)?;
    o.deny_unknown(r);
    Some(FakeScript {
        duration_ms: o.opt("duration_ms", r).unwrap_or_default(),
        outcome: o.opt("outcome", r).unwrap_or_default(),
        infra_failures_first: o.opt("infra_failures_first", r).unwrap_or_default(),
        provision_ms: o.opt("provision_ms", r).unwrap_or_default(),
    })
}

pub(crate) fn summary(value: &Value, path: &FieldPath, r: &mut Report) -> Option<SummarySpec> {
    let o = Obj::new(value, path, SUMMARY_FIELDS, r)?;
    o.deny_unknown(r);
    Some(SummarySpec {
        fields: o.opt("fields", r).unwrap_or_default(),
        write_csv: o.opt("write_csv", r).unwrap_or_default(),
    })
}

/// The task fields shared by every shape (everything but the id and the commands).
pub(crate) fn task_body(o: &Obj<'_>, r: &mut Report) -> RunSpec {
    RunSpec {
        agent_kind: o.opt("agent_kind", r),
        query: o.opt("query", r),
        url: o.opt("url", r),
        max_steps: o.opt("max_steps", r),
        sandbox: o.nested("sandbox", r, sandbox),
        resources: o.nested("resources", r, resources),
        timeout_seconds: o.opt("timeout_seconds", r),
        fake: o.nested("fake", r, fake),
        epochs: o.opt("epochs", r),
        inputs: o.opt("inputs", r).unwrap_or_default(),
        harness: None,
        evaluator: None,
        pass_when: o.nested("pass_when", r, pass_when),
        runtime: None,
        env: o.nested("env", r, env),
        pass_env: o.opt("pass_env", r),
    }
}

/// One `tasks[]` entry. `None` when it has no usable `task_id` (already reported).
pub(crate) fn task(value: &Value, path: &FieldPath, r: &mut Report) -> Option<Task> {
    let o = Obj::new(value, path, TASK_FIELDS, r)?;
    o.deny_unknown(r);
    let task_id: Option<String> =
        o.req("task_id", &format!("add a unique `task_id:` to {path}"), r);
    let body = RunSpec {
        harness: o.opt("harness", r),
        evaluator: o.opt("evaluator", r),
        runtime: o.opt("runtime", r),
        ..task_body(&o, r)
    };
    Some(Task {
        task_id: task_id?,
        agent_kind: body.agent_kind,
        query: body.query,
        url: body.url,
        max_steps: body.max_steps,
        sandbox: body.sandbox,
        resources: body.resources,
        timeout_seconds: body.timeout_seconds,
        fake: body.fake,
        epochs: body.epochs,
        harness: body.harness,
        evaluator: body.evaluator,
        pass_when: body.pass_when,
        runtime: body.runtime,
        inputs: body.inputs,
        env: body.env,
        pass_env: body.pass_env,
    })
}

/// A task as a run spec plus its id.
pub(crate) fn split_task(task: Task) -> (String, RunSpec) {
    // Exhaustive on purpose: a new Task field must be decided on here.
    let Task {
        task_id,
        agent_kind,
        query,
        url,
        max_steps,
        sandbox,
        resources,
        timeout_seconds,
        fake,
        epochs,
        harness,
        evaluator,
        pass_when,
        runtime,
        inputs,
        env,
        pass_env,
    } = task;
    let spec = RunSpec {
        agent_kind,
        query,
        url,
        max_steps,
        sandbox,
        resources,
        timeout_seconds,
        fake,
        epochs,
        inputs,
        harness,
        evaluator,
        pass_when,
        runtime,
        env,
        pass_env,
    };
    (task_id, spec)
}

/// A batch_v1 runspec document (already known not to be a sweep).
pub(crate) fn runspec(value: &Value, path: &FieldPath, r: &mut Report) -> Option<RunSpec> {
    let o = Obj::new(value, path, RUNSPEC_FIELDS, r)?;
    if o.has("task_id") {
        r.at(
            &path.key("task_id"),
            "a runspec has no `task_id`: the case's `label` in the batch manifest is its id",
            "remove `task_id` from the runspec and set the case label instead",
        );
    }
    for (key, _) in o.extra().filter(|(k, _)| k.as_str() != "task_id") {
        let fix = match nearest(key, RUNSPEC_FIELDS) {
            Some(near) => format!("rename it to `{near}`"),
            None => format!("remove it; allowed here: {}", RUNSPEC_FIELDS.join(", ")),
        };
        r.at(&path.key(key), format!("unknown field `{key}`"), fix);
    }
    Some(RunSpec {
        harness: o.opt("harness", r),
        evaluator: o.opt("evaluator", r),
        runtime: o.opt("runtime", r),
        ..task_body(&o, r)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_suggests_typos_only() {
        assert_eq!(nearest("qurey", TASK_FIELDS), Some("query"));
        assert_eq!(nearest("taskid", TASK_FIELDS), Some("task_id"));
        assert_eq!(nearest("banana", TASK_FIELDS), None);
    }

    #[test]
    fn a_task_reports_every_bad_field() {
        let v = serde_json::json!({
            "task_id": 7, "qurey": "x", "max_steps": "ten", "sandbox": {"template": "t"}
        });
        let mut r = Report::default();
        assert!(task(&v, &FieldPath::root().key("tasks").index(0), &mut r).is_none());
        let fields: Vec<&str> = r.problems.iter().map(|p| p.field.as_str()).collect();
        assert!(fields.contains(&"tasks[0].qurey"), "{fields:?}");
        assert!(fields.contains(&"tasks[0].task_id"), "{fields:?}");
        assert!(fields.contains(&"tasks[0].max_steps"), "{fields:?}");
        assert!(fields.contains(&"tasks[0].sandbox"), "{fields:?}");
        assert!(r.problems.iter().any(|p| p.fix.contains("quote")));
    }
}
