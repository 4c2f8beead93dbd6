//! Checks on typed values that the type system cannot express: ranges, emptiness, safe names.

use std::collections::BTreeMap;

use crate::limits::{
    CONCURRENCY_RANGE, DEFAULT_PRIORITY, DEFAULT_WEIGHT, EPOCHS_RANGE, LOG_MB_RANGE,
    MAX_BATCH_ID_LEN, MAX_CPU, MAX_FAKE_DURATION_MS, MAX_FAKE_INFRA_FAILURES, MAX_GPUS,
    MAX_HEARTBEAT_EVERY_SECONDS, MAX_MEMORY_MB, MAX_PREPARE_AHEAD, MAX_RATE_LIMIT_RETRIES,
    MAX_RETRIES_RANGE, MAX_SANDBOX_LIFETIME_SECONDS, MAX_STARTS_PER_MINUTE, PRIORITY_RANGE,
    RESERVED_ENV_PREFIX, SANDBOX_NETWORKS, SANDBOX_PROVIDERS, SANDBOX_PULLS, TIMEOUT_SECONDS_RANGE,
    WEIGHT_RANGE,
};
use crate::model::{
    BudgetSpec, CommandSpec, Defaults, FakeScript, PassWhen, RateSpec, Resources, RunSpec, Sandbox,
    SummarySpec,
};
use crate::report::{FieldPath, Report};

/// `field` of `path`, when set, within `range`: refused otherwise, with `hint` after the fix.
fn within(
    r: &mut Report,
    path: &FieldPath,
    field: &str,
    value: Option<u32>,
    range: &std::ops::RangeInclusive<u32>,
    hint: &str,
) {
    let Some(n) = value.filter(|n| !range.contains(n)) else {
        return;
    };
    let (lo, hi) = (range.start(), range.end());
    let p = path.key(field);
    r.at(
        &p,
        format!("{field} {n} is outside {lo}..={hi}"),
        format!("set {p} between {lo} and {hi}{hint}"),
    );
}

pub(crate) fn defaults(d: &Defaults, path: &FieldPath, r: &mut Report) {
    within(
        r,
        path,
        "concurrency",
        d.concurrency,
        &CONCURRENCY_RANGE,
        " (start at 1-2 and raise it after a canary)",
    );
    within(
        r,
        path,
        "max_retries",
        d.max_retries,
        &MAX_RETRIES_RANGE,
        "",
    );
    if let Some(n) = d.prepare_ahead
        && n > MAX_PREPARE_AHEAD
    {
        let p = path.key("prepare_ahead");
        r.at(
            &p,
            format!("prepare_ahead {n} is more than the maximum of {MAX_PREPARE_AHEAD}"),
            format!(
                "set {p} between 0 and {MAX_PREPARE_AHEAD} (a few ahead keep every freed slot busy)"
            ),
        );
    }
    let hint = format!(" (higher goes first; default {DEFAULT_PRIORITY})");
    within(r, path, "priority", d.priority, &PRIORITY_RANGE, &hint);
    let hint = format!(" (default {DEFAULT_WEIGHT})");
    within(r, path, "weight", d.weight, &WEIGHT_RANGE, &hint);
    if let Some(n) = d.heartbeat_every_seconds
        && !(1..=MAX_HEARTBEAT_EVERY_SECONDS).contains(&n)
    {
        let p = path.key("heartbeat_every_seconds");
        r.at(
            &p,
            format!("heartbeat_every_seconds {n} is outside 1..={MAX_HEARTBEAT_EVERY_SECONDS}"),
            format!(
                "set {p} between 1 and {MAX_HEARTBEAT_EVERY_SECONDS} (the default, 4, takes a \
                 dead worker's stage over within 5 s)"
            ),
        );
    }
    if let Some(n) = d.max_rate_limit_retries
        && n > MAX_RATE_LIMIT_RETRIES
    {
        let p = path.key("max_rate_limit_retries");
        r.at(
            &p,
            format!(
                "max_rate_limit_retries {n} is more than the maximum of {MAX_RATE_LIMIT_RETRIES}"
            ),
            format!("set {p} between 0 and {MAX_RATE_LIMIT_RETRIES} (the default is 10)"),
        );
    }
    epochs(d.epochs, path, r);
    if let Some(b) = &d.budget {
        budget(b, &path.key("budget"), r);
    }
    if let Some(rate_spec) = &d.rate {
        rate(rate_spec, &path.key("rate"), r);
    }
    timeout(d.timeout_seconds, path, r);
    if let Some(s) = &d.sandbox {
        sandbox(s, &path.key("sandbox"), r);
    }
    if let Some(res) = &d.resources {
        resources(res, &path.key("resources"), r);
    }
    command(d.harness.as_ref(), &path.key("harness"), r);
    command(d.evaluator.as_ref(), &path.key("evaluator"), r);
    if let Some(p) = &d.pass_when {
        pass_when(p, &path.key("pass_when"), r);
    }
    if let Some(f) = &d.fake {
        fake(f, &path.key("fake"), r);
    }
    environment(d.env.as_ref(), d.pass_env.as_deref(), path, r);
}

/// Checks on one case's own settings.
pub(crate) fn spec(s: &RunSpec, path: &FieldPath, r: &mut Report) {
    epochs(s.epochs, path, r);
    timeout(s.timeout_seconds, path, r);
    if let Some(sb) = &s.sandbox {
        sandbox(sb, &path.key("sandbox"), r);
    }
    if let Some(res) = &s.resources {
        resources(res, &path.key("resources"), r);
    }
    command(s.harness.as_ref(), &path.key("harness"), r);
    command(s.evaluator.as_ref(), &path.key("evaluator"), r);
    if let Some(p) = &s.pass_when {
        pass_when(p, &path.key("pass_when"), r);
    }
    if let Some(f) = &s.fake {
        fake(f, &path.key("fake"), r);
    }
    environment(s.env.as_ref(), s.pass_env.as_deref(), path, r);
}

/// A score named, and a threshold a score can be compared with.
fn pass_when(p: &PassWhen, path: &FieldPath, r: &mut Report) {
    if p.score.trim().is_empty() {
        r.at(
            &path.key("score"),
            "the score's name is empty",
            format!(
                "name a score the harness reports in its result's `scores`, e.g. {path}: \
                 {{score: match, at_least: 1}}"
            ),
        );
    }
    if !p.at_least.is_finite() {
        r.at(
            &path.key("at_least"),
            format!("at_least {} is not a finite number", p.at_least),
            format!("set {} to the least passing value", path.key("at_least")),
        );
    }
}

/// A pace within its range; a shared key a workflow id can carry.
fn rate(spec: &RateSpec, path: &FieldPath, r: &mut Report) {
    let n = spec.starts_per_minute;
    if !(1..=MAX_STARTS_PER_MINUTE).contains(&n) {
        let p = path.key("starts_per_minute");
        r.at(
            &p,
            format!("starts_per_minute {n} is outside 1..={MAX_STARTS_PER_MINUTE}"),
            format!("set {p} to how many cases may start per minute"),
        );
    }
    if let Some(key) = &spec.rate_key {
        let ok = (1..=64).contains(&key.len())
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !ok {
            let p = path.key("rate_key");
            r.at(
                &p,
                format!("rate_key {key:?} is not 1 to 64 of A-Z a-z 0-9 . _ -"),
                format!("name the shared pace in {p} with those characters, e.g. team-openai"),
            );
        }
    }
}

/// A budget names at least one limit, each positive.
fn budget(b: &BudgetSpec, path: &FieldPath, r: &mut Report) {
    if b.cost_usd.is_none() && b.tokens.is_none() {
        r.at(
            path,
            "a budget without a limit".to_string(),
            format!("set {path}.cost_usd (dollars) or {path}.tokens, or remove {path}"),
        );
    }
    if let Some(c) = b.cost_usd
        && !(c.is_finite() && c > 0.0)
    {
        let p = path.key("cost_usd");
        r.at(
            &p,
            format!("cost_usd {c} is not a positive number"),
            format!("set {p} to the dollars the batch may spend, e.g. 25.0"),
        );
    }
    if b.tokens == Some(0) {
        let p = path.key("tokens");
        r.at(
            &p,
            "tokens 0 would start no case".to_string(),
            format!("set {p} to the tokens the batch may spend, e.g. 2000000"),
        );
    }
}

fn epochs(n: Option<u32>, parent: &FieldPath, r: &mut Report) {
    let Some(n) = n.filter(|n| !EPOCHS_RANGE.contains(n)) else {
        return;
    };
    let p = parent.key("epochs");
    r.at(
        &p,
        format!(
            "epochs {n} is outside {}..={}",
            EPOCHS_RANGE.start(),
            EPOCHS_RANGE.end()
        ),
        format!(
            "set {p} between {} and {} (each epoch runs the task once more)",
            EPOCHS_RANGE.start(),
            EPOCHS_RANGE.end()
        ),
    );
}

fn timeout(t: Option<u64>, parent: &FieldPath, r: &mut Report) {
    let Some(t) = t else { return };
    let p = parent.key("timeout_seconds");
    if t == 0 {
        r.at(
            &p,
            "timeout_seconds is 0, so every attempt would time out at once",
            format!("set {p} to a positive number of seconds or remove it (default 600)"),
        );
    } else if !TIMEOUT_SECONDS_RANGE.contains(&t) {
        r.at(
            &p,
            format!(
                "timeout_seconds {t} is more than the maximum of {} (7 days)",
                TIMEOUT_SECONDS_RANGE.end()
            ),
            format!(
                "set {p} between {} and {} seconds; split longer work into several cases",
                TIMEOUT_SECONDS_RANGE.start(),
                TIMEOUT_SECONDS_RANGE.end()
            ),
        );
    }
}

fn fake(f: &FakeScript, path: &FieldPath, r: &mut Report) {
    if f.duration_ms > MAX_FAKE_DURATION_MS {
        let p = path.key("duration_ms");
        r.at(
            &p,
            format!(
                "duration_ms {} is more than the maximum of {MAX_FAKE_DURATION_MS} (7 days)",
                f.duration_ms
            ),
            format!("set {p} between 0 and {MAX_FAKE_DURATION_MS}"),
        );
    }
    if f.provision_ms > MAX_FAKE_DURATION_MS {
        let p = path.key("provision_ms");
        r.at(
            &p,
            format!(
                "provision_ms {} is more than the maximum of {MAX_FAKE_DURATION_MS} (7 days)",
                f.provision_ms
            ),
            format!("set {p} between 0 and {MAX_FAKE_DURATION_MS}"),
        );
    }
    if f.infra_failures_first > MAX_FAKE_INFRA_FAILURES {
        let p = path.key("infra_failures_first");
        r.at(
            &p,
            format!(
                "infra_failures_first {} is more than the maximum of {MAX_FAKE_INFRA_FAILURES}",
                f.infra_failures_first
            ),
            format!("set {p} between 0 and {MAX_FAKE_INFRA_FAILURES}"),
        );
    }
}

fn sandbox(s: &Sandbox, path: &FieldPath, r: &mut Report) {
    // A missing provider was reported by the walk; this catches `provider: ""` and names
    // nothing provides: such a sandbox would be ignored and the harness run on the host.
    match s.provider.as_str() {
        "local" => local_sandbox(s, path, r),
        "container" => container_sandbox(s, path, r),
        other => {
            let p = path.key("provider");
            let accepted = accepted(SANDBOX_PROVIDERS);
            let found = if other.trim().is_empty() {
                "sandbox provider is empty".to_string()
            } else {
                format!(
                    "sandbox provider `{other}` is not supported (accepted: {accepted}): no \
                     runtime provides it, so the harness would run on the host, outside any sandbox"
                )
            };
            r.at(
                &p,
                found,
                format!("set {p} to {accepted}, or remove the sandbox"),
            );
        }
    }
    if s.lifetime == Some(0) {
        let p = path.key("lifetime");
        r.at(
            &p,
            "sandbox lifetime is 0 seconds",
            format!("set {p} to a positive number of seconds"),
        );
    }
    if let Some(l) = s.lifetime
        && l > MAX_SANDBOX_LIFETIME_SECONDS
    {
        let p = path.key("lifetime");
        r.at(
            &p,
            format!(
                "sandbox lifetime {l} is more than the maximum of {MAX_SANDBOX_LIFETIME_SECONDS} seconds (7 days)"
            ),
            format!("set {p} between 1 and {MAX_SANDBOX_LIFETIME_SECONDS}"),
        );
    }
}

/// `a`, `b`: accepted values as a message lists them.
fn accepted(values: &[&str]) -> String {
    values
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The host's processes have no image, network or user to choose: a field that only a
/// container reads would be accepted and ignored, so it is refused.
fn local_sandbox(s: &Sandbox, path: &FieldPath, r: &mut Report) {
    let container_only = [
        ("template", s.template.is_some()),
        ("platform", s.platform.is_some()),
        ("network", s.network.is_some()),
        ("pull", s.pull.is_some()),
        ("user", s.user.is_some()),
    ];
    for (field, set) in container_only {
        if set {
            let p = path.key(field);
            r.at(
                &p,
                format!(
                    "{field} is read by sandbox provider `container` only: with provider \
                     `local` the harness runs on the host and it would be ignored"
                ),
                format!("set {} to `container`, or remove {p}", path.key("provider")),
            );
        }
    }
}

fn container_sandbox(s: &Sandbox, path: &FieldPath, r: &mut Report) {
    if s.template.as_deref().is_none_or(|t| t.trim().is_empty()) {
        let p = path.key("template");
        r.at(
            &p,
            "sandbox provider `container` needs an image, and template names none",
            format!("set {p} to the image each attempt runs in, such as `python:3.12-slim`"),
        );
    }
    let choices = [
        ("network", s.network.as_deref(), SANDBOX_NETWORKS),
        ("pull", s.pull.as_deref(), SANDBOX_PULLS),
    ];
    for (field, value, values) in choices {
        let Some(value) = value else { continue };
        if !values.contains(&value) {
            let p = path.key(field);
            let accepted = accepted(values);
            r.at(
                &p,
                format!("sandbox {field} `{value}` is not one of {accepted}"),
                format!("set {p} to one of {accepted}, or remove it for the default"),
            );
        }
    }
    if s.user.as_deref().is_some_and(|u| u.trim().is_empty()) {
        let p = path.key("user");
        r.at(
            &p,
            "sandbox user is empty",
            format!("set {p} to a user the image knows (`1000`, `1000:1000`), or remove it"),
        );
    }
}

fn resources(res: &Resources, path: &FieldPath, r: &mut Report) {
    if let Some(cpu) = res.cpu
        && !(cpu.is_finite() && cpu > 0.0 && cpu <= MAX_CPU)
    {
        let p = path.key("cpu");
        r.at(
            &p,
            format!("cpu {cpu} is not a positive number up to {MAX_CPU}"),
            format!("set {p} to a positive number such as 1 or 0.5 (at most {MAX_CPU})"),
        );
    }
    if res.memory_mb == Some(0) {
        let p = path.key("memory_mb");
        r.at(
            &p,
            "memory_mb is 0",
            format!("set {p} to a positive number of MiB or remove it"),
        );
    }
    if let Some(mb) = res.log_mb
        && !LOG_MB_RANGE.contains(&mb)
    {
        let p = path.key("log_mb");
        r.at(
            &p,
            format!(
                "log_mb {mb} is outside {}..={}",
                LOG_MB_RANGE.start(),
                LOG_MB_RANGE.end()
            ),
            format!("set {p} to the MiB each of an attempt's logs may keep, or remove it for 64"),
        );
    }
    if let Some(gpus) = res.gpus
        && !(1..=MAX_GPUS).contains(&gpus)
    {
        let p = path.key("gpus");
        r.at(
            &p,
            format!("gpus {gpus} is outside 1..={MAX_GPUS}"),
            format!("set {p} to how many GPUs one case needs, or remove it"),
        );
    }
    if let Some(mb) = res.memory_mb
        && mb > MAX_MEMORY_MB
    {
        let p = path.key("memory_mb");
        r.at(
            &p,
            format!("memory_mb {mb} is more than the maximum of {MAX_MEMORY_MB} (1 TiB)"),
            format!("set {p} between 1 and {MAX_MEMORY_MB}, or remove it for no limit"),
        );
    }
}

fn command(c: Option<&CommandSpec>, path: &FieldPath, r: &mut Report) {
    let empty = match c {
        None => false,
        Some(CommandSpec::Shell(s)) => s.trim().is_empty(),
        Some(CommandSpec::Argv(argv)) => argv.first().is_none_or(|a| a.is_empty()),
    };
    if empty {
        r.at(
            path,
            "the command is empty",
            format!("set {path} to a shell string such as `./run_case.sh` or an argv list"),
        );
    }
    // A NUL cannot be passed to exec: the command would fail on every attempt.
    let nul = match c {
        Some(CommandSpec::Shell(s)) => s.contains('\0'),
        Some(CommandSpec::Argv(argv)) => argv.iter().any(|a| a.contains('\0')),
        None => false,
    };
    if nul {
        r.at(
            path,
            "the command contains a NUL character, which no process can be started with",
            format!("remove the NUL (\\0) from {path}"),
        );
    }
}

/// The first control character (NUL, newline, tab, DEL, C1 controls) in `s`.
fn control_char(s: &str) -> Option<char> {
    s.chars().find(|c| c.is_control())
}

/// A case id (task_id or label): not empty, no control characters. Other unsafe characters
/// (spaces, slashes) are fine: the case directory name is derived separately.
pub(crate) fn case_id(id: &str, path: &FieldPath, r: &mut Report) -> bool {
    if id.trim().is_empty() {
        r.at(
            path,
            "the case id is empty",
            format!("set {path} to a unique, non-empty id"),
        );
        return false;
    }
    if let Some(c) = control_char(id) {
        r.at(
            path,
            format!(
                "the case id {id:?} contains the control character {c:?}; ids travel in \
                 environment variables, logs and reports, where it breaks or hides text"
            ),
            format!("remove the control character from {path} (use spaces or `-` instead)"),
        );
        return false;
    }
    true
}

/// Why `name` cannot be an environment variable name at all, if it cannot.
pub(crate) fn env_name_syntax_error(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    (!valid).then(|| {
        format!(
            "{name:?} is not a valid environment variable name (letters, digits and `_`, \
             not starting with a digit)"
        )
    })
}

/// Why `name` cannot be an environment variable set by the manifest, if it cannot.
pub(crate) fn env_name_error(name: &str) -> Option<String> {
    if let Some(why) = env_name_syntax_error(name) {
        return Some(why);
    }
    if name.to_ascii_uppercase().starts_with(RESERVED_ENV_PREFIX) {
        return Some(format!(
            "{name:?} would override the harness contract's {RESERVED_ENV_PREFIX}* variables"
        ));
    }
    None
}

/// `env` (literal values) and `pass_env` (names copied from the worker) of one layer.
fn environment(
    env: Option<&BTreeMap<String, String>>,
    pass_env: Option<&[String]>,
    parent: &FieldPath,
    r: &mut Report,
) {
    let env_path = parent.key("env");
    for (name, value) in env.into_iter().flatten() {
        let p = env_path.key(name);
        if let Some(why) = env_name_error(name) {
            r.at(
                &p,
                why,
                format!(
                    "rename it to letters, digits and `_` (not starting with a digit or {RESERVED_ENV_PREFIX})"
                ),
            );
        }
        if value.contains('\0') {
            r.at(
                &p,
                "the value contains a NUL character, which an environment variable cannot hold",
                format!("remove the NUL (\\0) from {p}"),
            );
        }
    }
    let pass_path = parent.key("pass_env");
    for (i, name) in pass_env.into_iter().flatten().enumerate() {
        let p = pass_path.index(i);
        if let Some(why) = env_name_error(name) {
            r.at(
                &p,
                why,
                format!(
                    "list the name of a variable of the worker's environment (letters, digits and `_`, not {RESERVED_ENV_PREFIX}*)"
                ),
            );
        } else if env.is_some_and(|e| e.contains_key(name)) {
            r.at(
                &p,
                format!("{name} is both in `env` and in `pass_env` here"),
                "keep it in one of them: `env` for a literal value, `pass_env` to copy it from the worker",
            );
        } else if pass_env.is_some_and(|l| l[..i].contains(name)) {
            r.at(&p, format!("{name} is listed twice"), "list it once");
        }
    }
}

/// Why a batch id cannot be a directory name, if it cannot.
pub(crate) fn batch_id_error(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("batch_id is empty".into());
    }
    if id.len() > MAX_BATCH_ID_LEN {
        return Some(format!(
            "batch_id is longer than {MAX_BATCH_ID_LEN} characters"
        ));
    }
    if let Some(c) = control_char(id) {
        return Some(format!(
            "batch_id {id:?} contains the control character {c:?}"
        ));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "batch_id {id:?} contains {bad:?}, which is not safe in a directory name"
        ));
    }
    if id.starts_with('.') {
        return Some(format!("batch_id {id:?} starts with '.'"));
    }
    None
}

pub(crate) fn summary(s: &SummarySpec, path: &FieldPath, r: &mut Report) {
    for (i, field) in s.fields.iter().enumerate() {
        if field.trim().is_empty() || field.split('.').any(str::is_empty) {
            let p = path.key("fields").index(i);
            r.at(
                &p,
                format!("summary field path {field:?} is empty or has an empty segment"),
                format!("set {p} to a dotted path into the result, such as `scores.accuracy`"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids() {
        assert_eq!(batch_id_error("web-example_1.2"), None);
        assert!(batch_id_error("").is_some());
        assert!(batch_id_error(".hidden").is_some());
        assert!(batch_id_error("a/b").is_some());
        assert!(batch_id_error("a b").is_some());
        assert!(batch_id_error(&"x".repeat(200)).is_some());
        assert!(
            batch_id_error("a\0b")
                .unwrap()
                .contains("control character")
        );
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name_error("MY_VAR_2"), None);
        assert_eq!(env_name_error("_x"), None);
        for bad in [
            "",
            "2X",
            "A-B",
            "A=B",
            "A B",
            "CASEBATCH_RESULT",
            "casebatch_x",
            "É",
        ] {
            assert!(env_name_error(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn ranges() {
        let mut r = Report::default();
        let d = Defaults {
            concurrency: Some(0),
            max_retries: Some(6),
            prepare_ahead: Some(65),
            timeout_seconds: Some(0),
            epochs: Some(101),
            budget: Some(BudgetSpec {
                cost_usd: Some(-1.0),
                tokens: Some(0),
            }),
            rate: Some(RateSpec {
                starts_per_minute: 0,
                rate_key: Some("team a/../b".into()),
            }),
            ..Defaults::default()
        };
        defaults(&d, &FieldPath::root().key("defaults"), &mut r);
        let fields: Vec<&str> = r.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "defaults.concurrency",
                "defaults.max_retries",
                "defaults.prepare_ahead",
                "defaults.epochs",
                "defaults.budget.cost_usd",
                "defaults.budget.tokens",
                "defaults.rate.starts_per_minute",
                "defaults.rate.rate_key",
                "defaults.timeout_seconds"
            ]
        );
    }
}
