//! JSONL manifests: one task per line, typically a dataset file used as is.
//!
//! Each non-blank line is a JSON object. Dataset records rarely use casebatch's field names,
//! so three aliases are accepted: `id` for `task_id`, `ques` for `query`, `web` for `url`
//! (setting both a name and its alias is an error). Known task keys (`agent_kind`,
//! `max_steps`, `sandbox`, `resources`, `timeout_seconds`, `fake`, `inputs`, ...) are
//! type-checked as in YAML; every other key (e.g. WebVoyager's `web_name`) is handed to the
//! harness unchanged in `inputs`. Settings come from `LoadOptions` (flags and the defaults
//! file), and the batch id from `--batch-id` or the file stem.

use serde_json::Value;

use crate::decl::{CaseDecl, Loaded};
use crate::error::{FILE_FIELD, SYNTAX_FIELD, too_deep_problem};
use crate::limits::MAX_NESTING_DEPTH;
use crate::model::{ManifestFormat, RunSpec, SummarySpec};
use crate::report::{FieldPath, Locator, Report};
use crate::walk::{self, Leaf, Obj, TASK_FIELDS};
use crate::{locate, validate};

/// Task fields plus the dataset aliases.
const RECORD_FIELDS: &[&str] = &[
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
    "id",
    "ques",
    "web",
];

pub(crate) fn load(text: &str, r: &mut Report) -> Option<Loaded> {
    debug_assert!(TASK_FIELDS.iter().all(|f| RECORD_FIELDS.contains(f)));
    // Sized once: growing by doubling would hold the old and the new buffer together.
    let mut cases = Vec::with_capacity(text.lines().filter(|l| !l.trim().is_empty()).count());
    let mut records = 0usize;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        records += 1;
        let lineno = i + 1;
        let mut sub = Report::new(Locator::Fixed(lineno));
        if let Some(case) = record(line, lineno, &mut sub) {
            cases.push(case);
        }
        r.problems.append(&mut sub.problems);
    }
    if records == 0 {
        r.at_line(
            None,
            FILE_FIELD,
            "the JSONL file has no records",
            "add one JSON object per line, e.g. {\"id\": \"case-1\", \"ques\": \"...\"}",
        );
    }
    Some(Loaded {
        format: ManifestFormat::Jsonl,
        batch_id: None,
        defaults: Default::default(),
        summary: SummarySpec::default(),
        runtimes: Default::default(),
        cases,
    })
}

/// One line as a case; `None` when it cannot become one (problems are in `r`).
fn record(line: &str, lineno: usize, r: &mut Report) -> Option<CaseDecl> {
    if locate::json_too_deep(line, MAX_NESTING_DEPTH).is_some() {
        r.problems.push(too_deep_problem(lineno));
        return None;
    }
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            // serde_json counts lines within this one line; only the column is meaningful.
            let msg = e.to_string();
            let msg = msg
                .rsplit_once(" at line ")
                .map_or(msg.as_str(), |(m, _)| m);
            r.at_line(
                Some(lineno),
                SYNTAX_FIELD,
                format!("malformed JSON at column {}: {msg}", e.column()),
                "make the line one complete JSON object",
            );
            return None;
        }
    };
    for (path, _, _) in locate::index_json(line).duplicates {
        r.at(
            &path,
            "duplicate key in this record",
            "keep only one of them",
        );
    }

    let root = FieldPath::root();
    let o = Obj::new(&value, &root, RECORD_FIELDS, r)?;
    let id = aliased::<String>(&o, "task_id", "id", r);
    let mut spec = RunSpec {
        harness: o.opt("harness", r),
        evaluator: o.opt("evaluator", r),
        runtime: o.opt("runtime", r),
        ..walk::task_body(&o, r)
    };
    // `task_body` read `query` and `url`; fall back to their aliases.
    alias_into(&o, "query", "ques", &mut spec.query, r);
    alias_into(&o, "url", "web", &mut spec.url, r);
    for (key, v) in o.extra() {
        if spec.inputs.contains_key(key) {
            r.at(
                &root.key(key),
                format!("`{key}` is both a record key and an entry of `inputs`"),
                "keep only one of them",
            );
        } else {
            spec.inputs.insert(key.clone(), v.clone());
        }
    }
    validate::spec(&spec, &root, r);

    let Some((id, key)) = id else {
        if o.get("task_id").is_none() && o.get("id").is_none() {
            r.at(
                &root.key("task_id"),
                "the record has no `task_id` (or `id`)",
                "add a unique \"id\": \"...\" to the record",
            );
        }
        return None;
    };
    let id_path = root.key(key);
    if !validate::case_id(&id, &id_path, r) {
        return None;
    }
    Some(CaseDecl {
        id,
        id_path,
        path: root.clone(),
        spec_path: root,
        line: Some(lineno),
        spec,
        runspec: None,
        epoch: None,
    })
}

fn conflict(o: &Obj<'_>, name: &str, alias: &str, r: &mut Report) -> bool {
    let both = o.get(name).is_some() && o.get(alias).is_some();
    if both {
        r.at(
            &o.path().key(alias),
            format!("both `{name}` and its alias `{alias}` are set"),
            format!("keep only one of `{name}` and `{alias}`"),
        );
    }
    both
}

/// Fill `slot` from `alias` when `name` (already read into `slot`) is absent.
fn alias_into<T: Leaf>(o: &Obj<'_>, name: &str, alias: &str, slot: &mut Option<T>, r: &mut Report) {
    if !conflict(o, name, alias, r) && o.get(name).is_none() {
        *slot = o.opt(alias, r);
    }
}

/// A field that may be spelled two ways; returns the value and the key that held it.
fn aliased<T: Leaf>(
    o: &Obj<'_>,
    name: &'static str,
    alias: &'static str,
    r: &mut Report,
) -> Option<(T, &'static str)> {
    conflict(o, name, alias, r);
    match o.opt::<T>(name, r) {
        Some(v) => Some((v, name)),
        None if o.get(name).is_some() => None,
        None => o.opt::<T>(alias, r).map(|v| (v, alias)),
    }
}
