//! The YAML/JSON tasks manifest (`batch_id`, `defaults`, `tasks[]`, `summary`), and the
//! defaults file that can accompany a JSONL manifest.

use std::path::Path;

use serde_json::Value;

use crate::decl::{CaseDecl, FileDefaults, Loaded};
use crate::model::{Defaults, ManifestFormat, SummarySpec};
use crate::report::{FieldPath, Report};
use crate::runtimes;
use crate::source::{self, Syntax};
use crate::validate;
use crate::walk::{self, Obj};

pub(crate) const MANIFEST_FIELDS: &[&str] =
    &["batch_id", "defaults", "tasks", "summary", "runtimes"];

/// Read a parsed tasks manifest. `None` when it is not even a mapping.
pub(crate) fn load(
    value: &Value,
    format: ManifestFormat,
    manifest: &Path,
    r: &mut Report,
) -> Option<Loaded> {
    let root = FieldPath::root();
    let o = Obj::new(value, &root, MANIFEST_FIELDS, r)?;
    o.deny_unknown(r);

    let batch_id = o
        .opt::<String>("batch_id", r)
        .map(|id| (id, root.key("batch_id")));
    let defaults = o.nested("defaults", r, walk::defaults).unwrap_or_default();
    validate::defaults(&defaults, &root.key("defaults"), r);
    let summary = o.nested("summary", r, walk::summary).unwrap_or_default();
    validate::summary(&summary, &root.key("summary"), r);
    let runtimes = o
        .nested("runtimes", r, |v, p, r| {
            Some(runtimes::table(v, p, &runtimes::base_dir(manifest), r))
        })
        .unwrap_or_default();

    let tasks_path = root.key("tasks");
    let mut cases = Vec::new();
    match o.get("tasks") {
        None => r.at(
            &root,
            "missing required field `tasks`",
            "add `tasks:` with at least one `- task_id: ...` entry",
        ),
        Some(Value::Array(items)) if items.is_empty() => r.at(
            &tasks_path,
            "the task list is empty",
            "add at least one task under `tasks:`",
        ),
        Some(Value::Array(items)) => {
            // Sized once: growing by doubling would hold the old and the new buffer together.
            cases.reserve_exact(items.len());
            for (i, item) in items.iter().enumerate() {
                let path = tasks_path.index(i);
                let Some(task) = walk::task(item, &path, r) else {
                    continue;
                };
                let (id, spec) = walk::split_task(task);
                validate::spec(&spec, &path, r);
                let id_path = path.key("task_id");
                if !validate::case_id(&id, &id_path, r) {
                    continue;
                }
                cases.push(CaseDecl {
                    line: r.line_of(&path),
                    id,
                    id_path,
                    spec_path: path.clone(),
                    path,
                    spec,
                    runspec: None,
                    epoch: None,
                });
            }
        }
        Some(other) => r.at(
            &tasks_path,
            format!("expected a list of tasks, found {}", walk::describe(other)),
            "write `tasks:` as a list: `- task_id: ...`",
        ),
    }

    Some(Loaded {
        format,
        batch_id,
        defaults,
        summary,
        runtimes,
        cases,
    })
}

/// The keys of a defaults file written in the manifest's own shape.
const DEFAULTS_FILE_FIELDS: &[&str] = &["defaults", "summary"];

/// Read `--defaults FILE`: a YAML/JSON document holding the defaults, written either as in a
/// manifest (a `defaults:` object, and optionally `summary:`, the way a JSONL batch sets its
/// summary) or as the defaults' fields at its top level. Its problems are reported under
/// their field (`defaults.*`, `summary.*`) with the file named in the message.
pub(crate) fn load_defaults_file(file: &Path, r: &mut Report) -> Option<FileDefaults> {
    let mut sub = Report::default();
    let read = read_defaults(file, &mut sub);
    let label = format!("defaults file {}", file.display());
    let nested = read.as_ref().is_some_and(|d| d.nested);
    // A flat file's fields are the defaults'; a nested one names its own.
    let prefix = if nested {
        FieldPath::root()
    } else {
        FieldPath::root().key("defaults")
    };
    let defaults = read.map(|d| {
        let at = |key| sub.line_of(&d.base.key(key));
        FileDefaults {
            runtime_line: at("runtime"),
            harness_line: at("harness"),
            evaluator_line: at("evaluator"),
            file: file.to_path_buf(),
            defaults: d.defaults,
            summary: d.summary,
        }
    });
    r.absorb(sub, &label, &prefix, None);
    defaults
}

/// A defaults file as read: its defaults, its summary, and where the defaults are.
struct ReadDefaults {
    defaults: Defaults,
    summary: Option<SummarySpec>,
    /// The file is written in the manifest's shape (`defaults:` and `summary:`).
    nested: bool,
    /// Where the defaults' fields are: the top level, or `defaults`.
    base: FieldPath,
}

fn read_defaults(file: &Path, r: &mut Report) -> Option<ReadDefaults> {
    let bytes = source::read_bounded(file, "the defaults file", source::Kind::Named, r)?;
    let text = source::decode(&bytes, r)?;
    let syntax = match source::syntax_of(file, text) {
        Syntax::Jsonl => Syntax::Json,
        s => s,
    };
    let (value, locator) = source::parse_document(text, syntax, r)?;
    r.set_locator(locator);
    let root = FieldPath::root();
    if value.get("defaults").is_none() {
        let defaults = walk::defaults(&value, &root, r)?;
        validate::defaults(&defaults, &root, r);
        return Some(ReadDefaults {
            defaults,
            summary: None,
            nested: false,
            base: root,
        });
    }
    let o = Obj::new(&value, &root, DEFAULTS_FILE_FIELDS, r)?;
    o.deny_unknown(r);
    let base = root.key("defaults");
    let defaults = o.nested("defaults", r, walk::defaults).unwrap_or_default();
    validate::defaults(&defaults, &base, r);
    let summary = o.nested("summary", r, walk::summary);
    if let Some(s) = &summary {
        validate::summary(s, &root.key("summary"), r);
    }
    Some(ReadDefaults {
        defaults,
        summary,
        nested: true,
        base,
    })
}
