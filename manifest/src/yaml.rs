//! The YAML/JSON tasks manifest (`batch_id`, `defaults`, `tasks[]`, `summary`), and the
//! defaults file that can accompany a JSONL manifest.

use std::path::Path;

use serde_json::Value;

use crate::decl::{CaseDecl, FileDefaults, Loaded};
use crate::model::{Defaults, ManifestFormat};
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

/// Read `--defaults-file`: a YAML/JSON document holding one `Defaults` object. Its problems
/// are reported under `defaults.*` with the file named in the message.
pub(crate) fn load_defaults_file(file: &Path, r: &mut Report) -> Option<FileDefaults> {
    let mut sub = Report::default();
    let defaults = read_defaults(file, &mut sub).map(|defaults| FileDefaults {
        runtime_line: sub.line_of(&FieldPath::root().key("runtime")),
        harness_line: sub.line_of(&FieldPath::root().key("harness")),
        evaluator_line: sub.line_of(&FieldPath::root().key("evaluator")),
        file: file.to_path_buf(),
        defaults,
    });
    let label = format!("defaults file {}", file.display());
    r.absorb(sub, &label, &FieldPath::root().key("defaults"), None);
    defaults
}

fn read_defaults(file: &Path, r: &mut Report) -> Option<Defaults> {
    let bytes = source::read_bounded(file, "the defaults file", source::Kind::Named, r)?;
    let text = source::decode(&bytes, r)?;
    let syntax = match source::syntax_of(file, text) {
        Syntax::Jsonl => Syntax::Json,
        s => s,
    };
    let (value, locator) = source::parse_document(text, syntax, r)?;
    r.set_locator(locator);
    let root = FieldPath::root();
    let defaults = walk::defaults(&value, &root, r)?;
    validate::defaults(&defaults, &root, r);
    Some(defaults)
}
