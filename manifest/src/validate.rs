//! Checks on typed values that the type system cannot express: ranges, emptiness, safe names.

use crate::model::{
    CONCURRENCY_RANGE, CommandSpec, Defaults, MAX_RETRIES_RANGE, Resources, RunSpec, Sandbox,
    SummarySpec,
};
use crate::report::{FieldPath, Report};

/// Longest accepted batch id; it becomes a directory name.
pub(crate) const MAX_BATCH_ID_LEN: usize = 128;

pub(crate) fn defaults(d: &Defaults, path: &FieldPath, r: &mut Report) {
    if let Some(c) = d.concurrency
        && !CONCURRENCY_RANGE.contains(&c)
    {
        let p = path.key("concurrency");
        r.at(
            &p,
            format!(
                "concurrency {c} is outside {}..={}",
                CONCURRENCY_RANGE.start(),
                CONCURRENCY_RANGE.end()
            ),
            format!(
                "set {p} between {} and {} (start at 1-2 and raise it after a canary)",
                CONCURRENCY_RANGE.start(),
                CONCURRENCY_RANGE.end()
            ),
        );
    }
    if let Some(m) = d.max_retries
        && !MAX_RETRIES_RANGE.contains(&m)
    {
        let p = path.key("max_retries");
        r.at(
            &p,
            format!(
                "max_retries {m} is outside {}..={}",
                MAX_RETRIES_RANGE.start(),
                MAX_RETRIES_RANGE.end()
            ),
            format!(
                "set {p} between {} and {}",
                MAX_RETRIES_RANGE.start(),
                MAX_RETRIES_RANGE.end()
            ),
        );
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
}

/// Checks on one case's own settings.
pub(crate) fn spec(s: &RunSpec, path: &FieldPath, r: &mut Report) {
    timeout(s.timeout_seconds, path, r);
    if let Some(sb) = &s.sandbox {
        sandbox(sb, &path.key("sandbox"), r);
    }
    if let Some(res) = &s.resources {
        resources(res, &path.key("resources"), r);
    }
    command(s.harness.as_ref(), &path.key("harness"), r);
    command(s.evaluator.as_ref(), &path.key("evaluator"), r);
}

fn timeout(t: Option<u64>, parent: &FieldPath, r: &mut Report) {
    if t == Some(0) {
        let p = parent.key("timeout_seconds");
        r.at(
            &p,
            "timeout_seconds is 0, so every attempt would time out at once",
            format!("set {p} to a positive number of seconds or remove it (default 600)"),
        );
    }
}

fn sandbox(s: &Sandbox, path: &FieldPath, r: &mut Report) {
    // A missing provider was reported by the walk; this catches `provider: ""`.
    if s.provider.trim().is_empty() {
        let p = path.key("provider");
        r.at(
            &p,
            "sandbox provider is empty",
            format!("set {p} to a provider name"),
        );
    }
    if s.lifetime == Some(0) {
        let p = path.key("lifetime");
        r.at(
            &p,
            "sandbox lifetime is 0 seconds",
            format!("set {p} to a positive number of seconds"),
        );
    }
}

fn resources(res: &Resources, path: &FieldPath, r: &mut Report) {
    if let Some(cpu) = res.cpu
        && !(cpu.is_finite() && cpu > 0.0)
    {
        let p = path.key("cpu");
        r.at(
            &p,
            format!("cpu {cpu} is not a positive number"),
            format!("set {p} to a positive number such as 1 or 0.5"),
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
}

/// A case id (task_id or label): anything but empty. Unsafe characters are fine: the case
/// directory name is derived separately.
pub(crate) fn case_id(id: &str, path: &FieldPath, r: &mut Report) -> bool {
    if id.trim().is_empty() {
        r.at(
            path,
            "the case id is empty",
            format!("set {path} to a unique, non-empty id"),
        );
        return false;
    }
    true
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
    }

    #[test]
    fn ranges() {
        let mut r = Report::default();
        let d = Defaults {
            concurrency: Some(0),
            max_retries: Some(6),
            timeout_seconds: Some(0),
            ..Defaults::default()
        };
        defaults(&d, &FieldPath::root().key("defaults"), &mut r);
        let fields: Vec<&str> = r.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "defaults.concurrency",
                "defaults.max_retries",
                "defaults.timeout_seconds"
            ]
        );
    }
}
