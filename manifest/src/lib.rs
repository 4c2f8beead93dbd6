//! casebatch-manifest owns the user's batch input: it reads a manifest in any of the three
//! shapes (a YAML/JSON tasks manifest, a JSONL dataset with one task per line, or a
//! `schema_version: batch_v1` list of runspec files), checks it completely, reporting every
//! problem with its file, line, field and a fix, and resolves it into the validated model
//! and the materialized [`Plan`] that becomes `batch_plan.json`.
//!
//! It must not touch the engine: no Temporal, no workflows or activities, no processes, and
//! no writing files. It only reads the manifest (and the files it references); the caller
//! writes `batch_plan.json` and everything else in the bundle.
//!
//! Every shape may name where its cases run: `runtime: NAME` picks a built-in (`local-process`,
//! `fake`) or an entry of the runtimes table (`runtimes:` in the YAML/JSON and batch_v1
//! manifests, or [`LoadOptions::runtimes_file`]), which lands in [`Plan::runtimes`].
//!
//! Entry points: [`load_plan`] for a manifest file, [`batch_schema`] for the field
//! reference, [`case_dir_name`] for the directory naming rule the engine must share.
//!
//! The three shapes, all resolving into the same [`Plan`]:
//! - **YAML/JSON** (`.yaml`, `.yml`, `.json`; other extensions are sniffed): [`BatchManifest`]
//!   with `batch_id`, `defaults`, `tasks[]`, `summary`. Unknown fields are errors.
//! - **JSONL** (`.jsonl`, `.ndjson`): one task per line, dataset records accepted as they are:
//!   `id`/`ques`/`web` are aliases of `task_id`/`query`/`url`, known task keys are
//!   type-checked, any other key goes into the case's `inputs`. Settings come from
//!   [`LoadOptions`]; the batch id from `--batch-id` or the file stem.
//! - **batch_v1** (any YAML/JSON with `schema_version: batch_v1`): [`BatchV1Manifest`], cases
//!   `{label, runspec}` whose [`RunSpec`] files must stay inside the manifest's directory and
//!   must each be a single run, not a sweep.

pub mod limits;
pub mod model;

mod batch_v1;
mod case_dir;
mod decl;
mod error;
mod jsonl;
mod locate;
mod plan;
mod programs;
mod report;
#[cfg(test)]
mod robustness_tests;
mod runtimes;
mod schema;
mod source;
mod validate;
mod walk;
mod yaml;
mod yaml_scalar;
mod yaml_syntax;

use std::path::Path;

pub use case_dir::{MAX_CASE_DIR_LEN, case_dir_name, is_safe_case_dir};
pub use decl::LoadOptions;
pub use error::{ManifestError, Problem};
pub use model::*;
pub use schema::{batch_schema, batch_v1_schema, runspec_schema};

use error::FILE_FIELD;
use report::{FieldPath, Report};
use source::Syntax;

/// Read, check and resolve the manifest at `path` into a plan.
///
/// Every problem is collected before returning, so one run of `validate` shows them all.
pub fn load_plan(path: &Path, opts: &LoadOptions) -> Result<Plan, ManifestError> {
    let mut r = Report::default();
    match source::read_bounded(path, "the manifest", source::Kind::Named, &mut r) {
        Some(bytes) => load_plan_from_bytes(path, &bytes, opts),
        None => Err(ManifestError::new(path, r.problems)),
    }
}

/// [`load_plan`] on bytes already read; `path` still names the file (messages, provenance,
/// the directory batch_v1 runspecs resolve in).
fn load_plan_from_bytes(
    path: &Path,
    bytes: &[u8],
    opts: &LoadOptions,
) -> Result<Plan, ManifestError> {
    let mut r = Report::default();
    // Flags and the defaults file are checked even when the manifest itself is broken.
    let mut flags = Report::default();
    validate::defaults(&opts.overrides, &FieldPath::root().key("flags"), &mut flags);
    let file_defaults = opts
        .defaults_file
        .as_deref()
        .and_then(|f| yaml::load_defaults_file(f, &mut flags))
        .unwrap_or_default();
    let runtimes_file = opts
        .runtimes_file
        .as_deref()
        .map(|f| (runtimes::load_file(f, &mut flags), f));

    let loaded =
        source::decode(bytes, &mut r).and_then(|text| match source::syntax_of(path, text) {
            Syntax::Jsonl => jsonl::load(text, &mut r),
            syntax => {
                let (value, locator) = source::parse_document(text, syntax, &mut r)?;
                r.set_locator(locator);
                if value.get("schema_version").is_some() {
                    batch_v1::load(&value, path, &mut r)
                } else {
                    let format = match syntax {
                        Syntax::Json => ManifestFormat::Json,
                        _ => ManifestFormat::Yaml,
                    };
                    yaml::load(&value, format, path, &mut r)
                }
            }
        });
    let input = decl::PlanInput {
        manifest: path,
        bytes,
        opts,
        file_defaults,
        runtimes_file,
    };
    let plan = loaded.and_then(|l| plan::build(l, &input, &mut r));
    // In file order, which is how people fix them; file-wide problems (no line) first.
    r.problems.sort_by_key(|p| p.line.unwrap_or(0));
    let mut problems = flags.problems;
    problems.append(&mut r.problems);
    match plan {
        Some(plan) if problems.is_empty() => Ok(plan),
        _ => {
            // Every refusal pushes a problem; this only guards against an empty error.
            if problems.is_empty() {
                problems.push(Problem {
                    line: None,
                    field: FILE_FIELD.into(),
                    message: "the manifest could not be planned".into(),
                    fix: "run `casebatch batch validate` and report this as a bug".into(),
                });
            }
            Err(ManifestError::new(path, problems))
        }
    }
}
