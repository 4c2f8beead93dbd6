//! `retry-failed`: a new batch that re-runs only the failed cases of a finished one.
//!
//! The new batch is a full, comparable batch (same case set): passing results are carried
//! over verbatim, stamped `origin: {retry_of, carried: true}`; the source bundle and workflow
//! are only read. Cases killed by the memory limit are re-run with their memory doubled for
//! that job only (recorded as `memory_boost_mb`, compounding across retries, capped); past
//! the cap they stay failed, with the advice to change the spec.

use casebatch_proto::CaseState;
use std::collections::BTreeMap;

use casebatch_bundle::attempt_files;
use casebatch_bundle::{
    Bundle, BundleError, CaseResult, Lineage, Origin, RECORD_SCHEMA_VERSION, read_json_if_present,
    write_bytes_atomic, write_json_atomic,
};
use casebatch_manifest::Plan;
use casebatch_proto::{FailureClass, FailureCode, Stage};
use casebatch_worker::Engine;
use casebatch_workflows::decide::{OomBoost, is_verified_success, oom_boost};

use crate::drive::drive;
use crate::error::{ControlError, Result};
use crate::events::Observer;
use crate::finish::RunReport;
use crate::location::{Attached, BatchLocation, EngineChoice, check_batch_id};
use crate::options::DriveOptions;
use crate::prepare;
use crate::workflow::Presence;

#[derive(Debug, Clone)]
pub struct RetryRequest {
    /// The finished batch whose failures are retried.
    pub source: BatchLocation,
    /// Only failures of these classes are re-run (all when empty).
    pub classes: Vec<FailureClass>,
    /// The new batch's id; `<source>-retry<N>` when `None`.
    pub new_batch_id: Option<String>,
    pub engine: EngineChoice,
    pub without_worker: bool,
}

/// The new batch, written and ready to run: its lineage says what happens to every case.
pub struct PreparedRetry {
    pub lineage: Lineage,
    engine: Engine,
    bundle: Bundle,
    plan: Plan,
    without_worker: bool,
}

/// What happens to one case of the source batch.
enum Choice {
    Carry(CaseResult),
    /// The work is done; only its trace is missing: pull it again, run nothing.
    Recollect(CaseResult),
    Rerun {
        boost_mb: Option<u64>,
    },
    PastCap(CaseResult),
}

/// The source batch as it was read, before anything of the new batch is written.
struct Source {
    /// Each case's record, in plan order (`None`: it never ran).
    results: Vec<Option<CaseResult>>,
    /// `manifest.json` byte for byte, checked to be whole JSON.
    manifest: Option<Vec<u8>>,
}

/// The new batch's cases: what happens to each, and the results it keeps.
struct Sorted {
    lineage: Lineage,
    /// Carried results, and whether their trace was pulled again.
    kept: Vec<(CaseResult, bool)>,
}

/// Writes the new batch's bundle (plan, lineage, carried results, re-collected traces):
/// locate the source (on its engine, not running), name the new batch, read the source,
/// sort its cases, then write the new bundle.
pub async fn prepare(req: RetryRequest) -> Result<PreparedRetry> {
    let Attached {
        bundle: source,
        engine,
        presence,
        ..
    } = req.source.attach(&req.engine).await?;
    let plan = source.read_plan()?;
    if presence == Presence::Running {
        return Err(ControlError::StillRunning {
            batch_id: plan.batch_id.clone(),
            action: "retry",
        });
    }
    let (new_id, target) = new_bundle(&req, &plan)?;
    let read = read_source(&source, &plan)?;
    let sorted = sort_cases(&plan, read.results, &req.classes, &target).await?;
    let mut new_plan = plan.clone();
    new_plan.batch_id = new_id;
    prepare::write_plan(
        &target,
        &new_plan,
        std::path::Path::new(&plan.provenance.manifest_path),
    )?;
    prepare::write_run_config(&target, &new_plan, &engine, &req.engine)?;
    if let Some(bytes) = read.manifest {
        write_bytes_atomic(&target.manifest(), &bytes)?;
    }
    write_json_atomic(&target.lineage(), &sorted.lineage)?;
    for (mut r, recollected) in sorted.kept {
        r.origin = Some(Origin {
            retry_of: plan.batch_id.clone(),
            carried: true,
            recollected,
        });
        write_json_atomic(&target.case_result(&r.case_dir), &r)?;
    }
    Ok(PreparedRetry {
        lineage: sorted.lineage,
        engine,
        bundle: target,
        plan: new_plan,
        without_worker: req.without_worker,
    })
}

/// The new batch's bundle: `--new-batch-id`, else the first free `<source>-retry<N>`; one
/// that exists already is refused.
fn new_bundle(req: &RetryRequest, plan: &Plan) -> Result<(String, Bundle)> {
    let root = &req.source.output_root;
    let new_id = match &req.new_batch_id {
        Some(id) => id.clone(),
        None => (1..)
            .map(|n| format!("{}-retry{n}", plan.batch_id))
            .find(|id| !Bundle::new(root, id).exists())
            .expect("some retry id is free"),
    };
    check_batch_id(&new_id)?;
    let target = Bundle::new(root, &new_id);
    if target.exists() {
        return Err(ControlError::BatchExists {
            batch_id: new_id,
            path: target.root().to_path_buf(),
        });
    }
    Ok((new_id, target))
}

/// Every source record, read before anything of the new batch is written. A case with no
/// record never ran and is re-run; a damaged record stops the retry: read as "never ran" it
/// would re-run a case that passed. The manifest is the one the source batch saw, not the
/// file as it may read today.
fn read_source(source: &Bundle, plan: &Plan) -> Result<Source> {
    let results = plan
        .cases
        .iter()
        .map(|case| read_json_if_present::<CaseResult>(&source.case_result(&case.case_dir)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let manifest = match std::fs::read(source.manifest()) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(unreadable(&source.manifest(), e)),
        Ok(bytes) => {
            serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| {
                ControlError::BundleUnreadable(BundleError::Parse {
                    path: source.manifest().display().to_string(),
                    source: e,
                })
            })?;
            Some(bytes)
        }
    };
    Ok(Source { results, manifest })
}

/// What happens to every case (see [`choose`]), with the traces of collect failures pulled
/// again into the new bundle.
async fn sort_cases(
    plan: &Plan,
    results: Vec<Option<CaseResult>>,
    classes: &[FailureClass],
    target: &Bundle,
) -> Result<Sorted> {
    let mut lineage = Lineage {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        retry_of: plan.batch_id.clone(),
        class_filter: classes.iter().map(|c| c.as_str().to_string()).collect(),
        rerun: Vec::new(),
        carried: Vec::new(),
        memory_boost_mb: BTreeMap::new(),
        past_cap: Vec::new(),
        recollected: Vec::new(),
        recovered: Vec::new(),
    };
    let mut kept = Vec::new();
    for (case, result) in plan.cases.iter().zip(results) {
        let id = || case.case_id.clone();
        match choose(result, case.resources.memory_mb, classes) {
            Choice::Carry(r) => {
                lineage.carried.push(id());
                kept.push((r, false));
            }
            Choice::Recollect(r) => {
                lineage.recollected.push(id());
                lineage.carried.push(id());
                let (r, recovered) = recollect(r, target).await?;
                if recovered {
                    lineage.recovered.push(id());
                }
                kept.push((r, true));
            }
            Choice::PastCap(r) => {
                lineage.past_cap.push(id());
                lineage.carried.push(id());
                kept.push((r, false));
            }
            Choice::Rerun { boost_mb } => {
                if let Some(mb) = boost_mb {
                    lineage.memory_boost_mb.insert(id(), mb);
                }
                lineage.rerun.push(id());
            }
        }
    }
    Ok(Sorted { lineage, kept })
}

impl PreparedRetry {
    /// The new batch's id.
    pub fn batch_id(&self) -> &str {
        &self.plan.batch_id
    }

    /// Runs the new batch: only the re-run cases are queued.
    pub async fn run(self, observer: &mut dyn Observer) -> Result<RunReport> {
        let opts = DriveOptions {
            without_worker: self.without_worker,
            ..DriveOptions::default()
        };
        drive(self.engine, self.bundle, self.plan, opts, observer).await
    }
}

fn unreadable(path: &std::path::Path, source: std::io::Error) -> ControlError {
    ControlError::BundleUnreadable(BundleError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Pulls a collect-failed case's trace again; on success (`true`) the case's state is what
/// its kept work earned.
async fn recollect(mut r: CaseResult, target: &Bundle) -> Result<(CaseResult, bool)> {
    let trace = r.trace_ref.clone().expect("chosen for its trace_ref");
    let dir = target.case(&r.case_dir);
    std::fs::create_dir_all(&dir).map_err(|e| ControlError::write(&dir, e))?;
    let dest = dir.join(attempt_files::TRACE);
    let recovered = casebatch_activities::trace::collect(&trace, &dest)
        .await
        .is_ok();
    if recovered {
        r.collect_failure = None;
        r.failure = None;
        r.state = if is_verified_success(r.actor_status, r.evaluation_configured, r.verdict) {
            CaseState::Succeeded
        } else {
            CaseState::Failed
        };
    }
    Ok((r, recovered))
}

fn choose(
    result: Option<CaseResult>,
    manifest_mb: Option<u64>,
    classes: &[FailureClass],
) -> Choice {
    let Some(r) = result else {
        // Never ran (the source was drained or cancelled): unfinished work always runs.
        return Choice::Rerun { boost_mb: None };
    };
    if r.state == CaseState::Succeeded {
        return Choice::Carry(r);
    }
    let failure = r.failure.as_ref();
    if !classes.is_empty() && !failure.is_some_and(|f| classes.contains(&f.class)) {
        return Choice::Carry(r);
    }
    let Some(failure) = failure else {
        return Choice::Rerun { boost_mb: None };
    };
    if failure.stage == Stage::Collect && r.trace_ref.is_some() {
        return Choice::Recollect(r);
    }
    if failure.code != FailureCode::OomKilled {
        return Choice::Rerun { boost_mb: None };
    }
    // The next size builds on the last boost: 64 → 128 → 256 ...
    match oom_boost(r.memory_boost_mb.or(manifest_mb)) {
        OomBoost::To(mb) => Choice::Rerun { boost_mb: Some(mb) },
        OomBoost::PastCap => Choice::PastCap(r),
        OomBoost::UnknownSize => Choice::Rerun { boost_mb: None },
    }
}
