//! The entry of planning: a shape's declarations and the flags in, a [`Plan`] out (or `None`,
//! with every problem in the report). The batch-wide steps are taken here (the batch id, the
//! runtimes tables merged, the layers below the cases, epochs expanded, ids checked, the
//! warnings); each case is then resolved in order and added to the fingerprint as it is.

use std::collections::{BTreeMap, HashMap};

use crate::decl::{CaseDecl, Loaded, PlanInput};
use crate::limits::EPOCHS_RANGE;
use crate::model::{
    BatchSettings, DEFAULT_CONCURRENCY, DEFAULT_MAX_RETRIES, Defaults, Epoch, ManifestFormat,
    PLAN_SCHEMA_VERSION, Plan, Provenance, SummarySpec,
};
use crate::report::{FieldPath, Report};
use crate::runtimes;
use crate::source::sha256_hex;
use crate::validate::batch_id_error;

use super::case::{Earlier, resolve_case};
use super::fingerprint::Fingerprint;
use super::layers::overlay;
use super::program_origins::Origins;
use super::runtime_choice::check_layer_runtimes;

/// Resolve into a plan; `None` if any problem was found (here or earlier in `r`).
pub(crate) fn build(loaded: Loaded, input: &PlanInput<'_>, r: &mut Report) -> Option<Plan> {
    let batch_id = resolve_batch_id(&loaded, input, r);
    let runtimes = runtimes::merge(
        loaded.runtimes,
        input.runtimes_file.as_ref(),
        input.manifest,
        r,
    );
    check_layer_runtimes(&runtimes, &loaded.defaults, input, r);
    let origins = Origins::of(&loaded.defaults, input, r);
    let defaults = overlay(
        overlay(input.file_defaults.defaults.clone(), &loaded.defaults),
        &input.opts.overrides,
    );
    let decls = expand_epochs(loaded.cases, &defaults);
    check_duplicate_ids(&decls, r);

    let mut earlier = Earlier::default();
    let mut cases = Vec::with_capacity(decls.len());
    // The fingerprint covers the commands as written, so a manifest moved with its scripts
    // keeps its batch resumable; the plan records the programs they resolved to.
    let mut fingerprint = Fingerprint::new();
    for (index, decl) in decls.into_iter().enumerate() {
        let index = match u32::try_from(index) {
            Ok(index) if index < casebatch_proto::MAX_BATCH_CASES => index,
            _ => {
                r.at_line(
                    decl.line,
                    decl.path.to_string(),
                    format!(
                        "too many cases: a batch holds at most {} (what its workflow's state is \
                         proven to carry)",
                        casebatch_proto::MAX_BATCH_CASES
                    ),
                    "split the task list into several batches",
                );
                break;
            }
        };
        let resolved = resolve_case(index, decl, &defaults, &origins, &runtimes, &mut earlier, r);
        if let Some((mut case, [harness, evaluator])) = resolved {
            fingerprint.add(&case);
            case.harness = harness;
            case.evaluator = evaluator;
            cases.push(case);
        }
    }

    let mut warnings = Vec::new();
    if let Some(max) = input.opts.max_cases
        && cases.len() > max
    {
        warnings.push(format!(
            "the batch has {} cases, more than the --max-cases threshold of {max}",
            cases.len()
        ));
    }

    let prepare_ahead = defaults.prepare_ahead.unwrap_or(0);
    if prepare_ahead > 0 && cases.iter().any(|c| !c.runtime_spread.is_empty()) {
        warnings.push(format!(
            "prepare_ahead {prepare_ahead} is off: some cases are dealt from a runtime list, and \
             a case's runtime is picked only when it is dispatched"
        ));
    }

    let batch_id = batch_id?;
    if !r.is_clean() {
        return None;
    }
    let manifest_path = input
        .manifest
        .canonicalize()
        .or_else(|_| std::path::absolute(input.manifest))
        .unwrap_or_else(|_| input.manifest.to_path_buf());
    let fingerprint = fingerprint.finish();
    // The manifest's own summary; else the defaults file's (a JSONL task list's only place).
    let summary = match input.file_defaults.summary.clone() {
        Some(file) if loaded.summary == SummarySpec::default() => file,
        _ => loaded.summary,
    };
    Some(Plan {
        schema_version: PLAN_SCHEMA_VERSION.to_string(),
        batch_id,
        provenance: Provenance {
            manifest_path: manifest_path.display().to_string(),
            manifest_sha256: sha256_hex(input.bytes),
            format: loaded.format,
        },
        settings: BatchSettings {
            concurrency: defaults.concurrency.unwrap_or(DEFAULT_CONCURRENCY),
            max_retries: defaults.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            controller_url: defaults.controller_url,
            device_controller_url: defaults.device_controller_url,
            oom_auto_boost: defaults.oom_auto_boost.unwrap_or(false),
            prepare_ahead,
            heartbeat_every_seconds: defaults.heartbeat_every_seconds,
            budget: defaults.budget,
            max_rate_limit_retries: defaults.max_rate_limit_retries,
            rate: defaults.rate,
            priority: defaults.priority,
            weight: defaults.weight,
        },
        fingerprint,
        spread: None,
        summary,
        runtimes: runtimes.specs(),
        cases,
        warnings,
    })
}

/// `--batch-id` wins; then the manifest's own; JSONL and batch_v1 fall back to the file stem.
fn resolve_batch_id(loaded: &Loaded, input: &PlanInput<'_>, r: &mut Report) -> Option<String> {
    const SAFE: &str = "letters, digits, '.', '_' and '-', not starting with '.'";
    let (id, field, line, fix) = if let Some(id) = &input.opts.batch_id {
        (
            id.clone(),
            "batch_id (--batch-id)".to_string(),
            None,
            format!("pass a --batch-id made of {SAFE}"),
        )
    } else if let Some((id, path)) = &loaded.batch_id {
        (
            id.clone(),
            path.to_string(),
            r.line_of(path),
            format!("set batch_id to {SAFE}"),
        )
    } else if matches!(
        loaded.format,
        ManifestFormat::Jsonl | ManifestFormat::BatchV1
    ) {
        let stem = input
            .manifest
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let fix = format!("pass --batch-id (the default is the file name {stem:?}); use {SAFE}");
        (stem, "batch_id".to_string(), None, fix)
    } else {
        r.at(
            &FieldPath::root(),
            "missing required field `batch_id`",
            "add `batch_id: my-batch` (stable per workload) or pass --batch-id",
        );
        return None;
    };
    match batch_id_error(&id) {
        Some(message) => {
            r.at_line(line, field, message, fix);
            None
        }
        None => Some(id),
    }
}

/// A task that runs several times (`epochs`) becomes one case per run, `<task_id>#<epoch>`,
/// each told its task and run in `CASEBATCH_TASK_ID` and `CASEBATCH_EPOCH`. A task that runs
/// once keeps its id, so a batch without epochs plans as it always did. An out-of-range
/// count is reported by validation; it plans as one run here.
fn expand_epochs(decls: Vec<CaseDecl>, defaults: &Defaults) -> Vec<CaseDecl> {
    let runs = |decl: &CaseDecl| {
        let of = decl.spec.epochs.or(defaults.epochs).unwrap_or(1);
        if EPOCHS_RANGE.contains(&of) { of } else { 1 }
    };
    // The common case keeps its list: a copy would hold two of them at once.
    if decls.iter().all(|d| runs(d) == 1) {
        return decls;
    }
    let mut out = Vec::with_capacity(decls.iter().map(|d| runs(d) as usize).sum());
    for decl in decls {
        let of = runs(&decl);
        if of == 1 {
            out.push(decl);
            continue;
        }
        for epoch in 1..=of {
            let mut run = decl.clone();
            run.id = format!("{}#{epoch}", decl.id);
            let env = run.spec.env.get_or_insert_with(BTreeMap::new);
            env.insert("CASEBATCH_TASK_ID".into(), decl.id.clone());
            env.insert("CASEBATCH_EPOCH".into(), epoch.to_string());
            run.epoch = Some(Epoch {
                task_id: decl.id.clone(),
                epoch,
                of,
            });
            out.push(run);
        }
    }
    out
}

fn case_line(decl: &CaseDecl, r: &Report) -> Option<usize> {
    r.line_of(&decl.id_path).or(decl.line)
}

/// Ids are how resume recognises a case, so two cases may never share one.
fn check_duplicate_ids(cases: &[CaseDecl], r: &mut Report) {
    let mut first: HashMap<&str, &CaseDecl> = HashMap::new();
    for decl in cases {
        let Some(prev) = first.get(decl.id.as_str()) else {
            first.insert(&decl.id, decl);
            continue;
        };
        let prev_at = match case_line(prev, r) {
            Some(l) => format!("line {l} ({})", prev.id_path),
            None => prev.id_path.to_string(),
        };
        let line = case_line(decl, r);
        r.at_line(
            line,
            decl.id_path.to_string(),
            format!(
                "duplicate case id {:?}, first declared at {prev_at}",
                decl.id
            ),
            "give every case a unique id (a new task list belongs in a new batch)",
        );
    }
}
