//! `schema_version: batch_v1` manifests: an explicit list of `{label, runspec}` cases, each
//! runspec a separate single-run file inside the manifest's directory tree.
//!
//! Runspec paths are confined to the manifest's directory: `..` escapes, absolute paths
//! elsewhere and symlinks that resolve elsewhere are refused, because a batch must be
//! reproducible from its input tree alone. Sweeps (a list, or `sweep`/`matrix`/`tasks` keys)
//! are refused: each case is exactly one run.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::decl::{CaseDecl, Loaded};
use crate::error::FILE_FIELD;
use crate::model::{ManifestFormat, RunSpec};
use crate::report::{FieldPath, Report};
use crate::runtimes;
use crate::source::{self, Syntax};
use crate::validate;
use crate::walk::{self, Obj};

pub(crate) const TOP_FIELDS: &[&str] = &[
    "schema_version",
    "batch_id",
    "defaults",
    "batch",
    "runtimes",
];
pub(crate) const BATCH_FIELDS: &[&str] = &["cases", "summary"];
pub(crate) const CASE_FIELDS: &[&str] = &["label", "runspec"];
const SCHEMA_VERSION: &str = "batch_v1";
/// Keys that make a run spec a sweep (many runs) instead of a single run.
const SWEEP_KEYS: &[&str] = &["sweep", "matrix", "tasks"];

pub(crate) fn load(value: &Value, manifest: &Path, r: &mut Report) -> Option<Loaded> {
    let root = FieldPath::root();
    let o = Obj::new(value, &root, TOP_FIELDS, r)?;
    o.deny_unknown(r);
    if let Some(v) = o.opt::<String>("schema_version", r)
        && v != SCHEMA_VERSION
    {
        r.at(
            &root.key("schema_version"),
            format!("unsupported schema_version {v:?}"),
            "use `schema_version: batch_v1`, or drop schema_version for a tasks manifest",
        );
    }
    let batch_id = o
        .opt::<String>("batch_id", r)
        .map(|id| (id, root.key("batch_id")));
    let defaults = o.nested("defaults", r, walk::defaults).unwrap_or_default();
    validate::defaults(&defaults, &root.key("defaults"), r);
    let runtimes = o
        .nested("runtimes", r, |v, p, r| {
            Some(runtimes::table(v, p, &runtimes::base_dir(manifest), r))
        })
        .unwrap_or_default();

    let batch_path = root.key("batch");
    let Some(batch_value) = o.get("batch") else {
        r.at(
            &root,
            "missing required field `batch`",
            "add `batch:` with `cases:` (a list of `{label, runspec}`)",
        );
        return None;
    };
    let batch = Obj::new(batch_value, &batch_path, BATCH_FIELDS, r)?;
    batch.deny_unknown(r);
    let summary = batch
        .nested("summary", r, walk::summary)
        .unwrap_or_default();
    validate::summary(&summary, &batch_path.key("summary"), r);

    let cases_path = batch_path.key("cases");
    let cases = match batch.get("cases") {
        None => {
            r.at(
                &batch_path,
                "missing required field `cases`",
                "add `cases:` with at least one `- label: ...` / `runspec: ...` entry",
            );
            Vec::new()
        }
        Some(Value::Array(items)) if items.is_empty() => {
            r.at(
                &cases_path,
                "the case list is empty",
                "add at least one case under `batch.cases`",
            );
            Vec::new()
        }
        Some(Value::Array(items)) => cases(items, &cases_path, manifest, r),
        Some(other) => {
            r.at(
                &cases_path,
                format!("expected a list of cases, found {}", walk::describe(other)),
                "write `cases:` as a list of `- label: ...` / `runspec: ...`",
            );
            Vec::new()
        }
    };

    Some(Loaded {
        format: ManifestFormat::BatchV1,
        batch_id,
        defaults,
        summary,
        runtimes,
        cases,
    })
}

fn cases(
    items: &[Value],
    cases_path: &FieldPath,
    manifest: &Path,
    r: &mut Report,
) -> Vec<CaseDecl> {
    let dir = manifest_dir(manifest);
    let base = match dir.canonicalize() {
        Ok(b) => Some(b),
        Err(e) => {
            r.at_line(
                None,
                FILE_FIELD,
                format!(
                    "cannot resolve the manifest's directory {}: {e}",
                    dir.display()
                ),
                "run from a directory where the manifest's folder is readable",
            );
            None
        }
    };
    // Canonical runspec path → the case that first used it.
    let mut seen: HashMap<PathBuf, FieldPath> = HashMap::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = cases_path.index(i);
        let Some(o) = Obj::new(item, &path, CASE_FIELDS, r) else {
            continue;
        };
        o.deny_unknown(r);
        let label: Option<String> = o.req(
            "label",
            &format!("add a unique `label:` (the case id) to {path}"),
            r,
        );
        let raw: Option<String> = o.req(
            "runspec",
            &format!("add `runspec:` to {path} with the path of the case's run spec"),
            r,
        );
        let spec_path = path.key("runspec");
        let resolved = match (&raw, &base) {
            (Some(raw), Some(base)) => resolve(base, raw, &spec_path, r),
            _ => None,
        };
        let spec = match (&raw, &resolved) {
            (Some(raw), Some(file)) => {
                if let Some(first) = seen.get(file) {
                    let first_line = r
                        .line_of(first)
                        .map(|l| format!(" at line {l}"))
                        .unwrap_or_default();
                    r.at(
                        &spec_path,
                        format!("runspec {raw:?} is already used by {first}{first_line}"),
                        "give every case its own runspec file (copy it if two cases really share one)",
                    );
                } else {
                    seen.insert(file.clone(), spec_path.clone());
                }
                read_runspec(file, raw, &spec_path, r)
            }
            _ => None,
        };
        let id_path = path.key("label");
        let (Some(label), Some(spec), Some(file)) = (label, spec, resolved) else {
            continue;
        };
        if !validate::case_id(&label, &id_path, r) {
            continue;
        }
        out.push(CaseDecl {
            id: label,
            id_path,
            line: r.line_of(&path),
            path,
            spec_path,
            spec,
            runspec: Some(file.display().to_string()),
            epoch: None,
        });
    }
    out
}

fn manifest_dir(manifest: &Path) -> PathBuf {
    match manifest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The canonical path of a runspec, if it exists and stays inside `base` (canonical).
fn resolve(base: &Path, raw: &str, path: &FieldPath, r: &mut Report) -> Option<PathBuf> {
    let outside_fix = format!(
        "move the runspec under {} and reference it with a relative path inside that directory",
        base.display()
    );
    if raw.trim().is_empty() {
        r.at(
            path,
            "the runspec path is empty",
            "set it to a file path relative to the manifest",
        );
        return None;
    }
    let rel = Path::new(raw);
    let candidate = if rel.is_absolute() {
        if !rel.starts_with(base) {
            r.at(
                path,
                format!("absolute path {raw:?} is outside the manifest's directory"),
                outside_fix,
            );
            return None;
        }
        rel.to_path_buf()
    } else {
        if escapes(rel) {
            r.at(
                path,
                format!("{raw:?} escapes the manifest's directory through `..`"),
                outside_fix,
            );
            return None;
        }
        base.join(rel)
    };
    let canonical = match candidate.canonicalize() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            r.at(
                path,
                format!(
                    "runspec file {raw:?} does not exist ({})",
                    candidate.display()
                ),
                format!(
                    "check the path; it is resolved relative to {}",
                    base.display()
                ),
            );
            return None;
        }
        Err(e) => {
            r.at(
                path,
                format!("cannot resolve runspec {raw:?}: {e}"),
                "check the path and its permissions",
            );
            return None;
        }
    };
    // Lexically inside but really elsewhere: a symlink points out of the tree.
    if !canonical.starts_with(base) {
        r.at(
            path,
            format!(
                "{raw:?} resolves through a symlink to {}, outside the manifest's directory",
                canonical.display()
            ),
            "copy the file into the manifest's directory instead of linking to it",
        );
        return None;
    }
    if canonical.is_dir() {
        r.at(
            path,
            format!("{raw:?} is a directory"),
            "point runspec at a YAML or JSON file",
        );
        return None;
    }
    Some(canonical)
}

/// Whether a relative path climbs above its starting directory at any point.
fn escapes(rel: &Path) -> bool {
    let mut depth: usize = 0;
    for c in rel.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return true,
        }
    }
    false
}

/// Read and check one runspec; its problems are reported against `spec_path` naming the file.
fn read_runspec(file: &Path, raw: &str, spec_path: &FieldPath, r: &mut Report) -> Option<RunSpec> {
    let mut sub = Report::default();
    let outcome = parse_runspec(file, &mut sub);
    let anchor = r.line_of(spec_path);
    r.absorb(sub, raw, spec_path, anchor);
    match outcome {
        Parsed::Spec(spec) => spec.map(|s| *s),
        Parsed::Sweep(why) => {
            r.at(
                spec_path,
                format!("{raw:?} is a sweep ({why}); batch_v1 needs a single-run spec per case"),
                "split the sweep into one runspec file per case, each listed under batch.cases",
            );
            None
        }
    }
}

enum Parsed {
    /// Boxed: a run spec is large next to the sweep's reason.
    Spec(Option<Box<RunSpec>>),
    Sweep(String),
}

fn parse_runspec(file: &Path, r: &mut Report) -> Parsed {
    // A regular file only, checked before opening: opening a FIFO would block for ever.
    let Some(bytes) = source::read_bounded(file, "the runspec", source::Kind::Referenced, r) else {
        return Parsed::Spec(None);
    };
    let Some(text) = source::decode(&bytes, r) else {
        return Parsed::Spec(None);
    };
    let syntax = source::syntax_of(file, text);
    if syntax == Syntax::Jsonl {
        return Parsed::Sweep("a JSONL file of many tasks".into());
    }
    let Some((value, locator)) = source::parse_document(text, syntax, r) else {
        return Parsed::Spec(None);
    };
    r.set_locator(locator);
    match &value {
        Value::Array(_) => return Parsed::Sweep("a list of runs".into()),
        Value::Object(map) => {
            if let Some(key) = SWEEP_KEYS.iter().find(|k| map.contains_key(**k)) {
                return Parsed::Sweep(format!("it has a `{key}` key"));
            }
        }
        _ => {}
    }
    let root = FieldPath::root();
    let spec = walk::runspec(&value, &root, r);
    if let Some(spec) = &spec {
        validate::spec(spec, &root, r);
    }
    Parsed::Spec(spec.map(Box::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_escapes() {
        assert!(escapes(Path::new("../x.yaml")));
        assert!(escapes(Path::new("a/../../x.yaml")));
        assert!(!escapes(Path::new("a/../x.yaml")));
        assert!(!escapes(Path::new("./cases/x.yaml")));
    }
}
