//! `batch retry-failed`: a new batch that re-runs only the failed cases of a finished one.
//!
//! The new batch is a full, comparable batch (same case set): passing results are carried
//! over verbatim, stamped `origin: {retry_of, carried: true}`; the source bundle and workflow
//! are only read. Cases killed by the memory limit are re-run with their memory doubled for
//! that job only (recorded as `memory_boost_mb`, compounding across retries, capped at
//! 16 GB); past the cap they stay failed, with the advice to change the spec.

use std::collections::BTreeMap;

use casebatch_bundle::layout::attempt_files;
use casebatch_bundle::{
    Bundle, CaseRecordState, CaseResult, Lineage, Origin, RECORD_SCHEMA_VERSION, read_json,
    write_json_atomic,
};
use casebatch_proto::{
    ActorStatus, FailureClass, OOM_BOOST_CAP_MB, Stage, Verdict, codes, workflow_id,
};
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{WorkflowDescribeOptions, WorkflowExecutionStatus, WorkflowHandle};

use super::{absolute, check_batch_id, run, status};
use crate::cli::RetryArgs;
use crate::exit::{CliError, CliResult};

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

pub async fn retry_failed(args: RetryArgs) -> CliResult {
    let (source, plan) = status::open(&args.batch)?;
    let classes = args
        .classes
        .iter()
        .map(|c| {
            FailureClass::parse(c).ok_or_else(|| {
                CliError::usage(format!(
                    "failed to read --class {c:?}: use infra, config, harness or agent"
                ))
            })
        })
        .collect::<CliResult<Vec<_>>>()?;
    let root = absolute(&args.batch.output_dir)?;
    let engine = run::connect(&root, &args.batch.engine).await?;
    let handle: WorkflowHandle<_, BatchWorkflow> = engine
        .client
        .get_workflow_handle(workflow_id(&plan.batch_id));
    if let Ok(d) = handle.describe(WorkflowDescribeOptions::default()).await
        && d.status() == WorkflowExecutionStatus::Running
    {
        return Err(CliError::usage(format!(
            "failed to retry batch {}: it is still running; wait for it to finish or drain it",
            plan.batch_id
        )));
    }
    let new_id = match &args.new_batch_id {
        Some(id) => id.clone(),
        None => (1..)
            .map(|n| format!("{}-retry{n}", plan.batch_id))
            .find(|id| !Bundle::new(&root, id).exists())
            .expect("some retry id is free"),
    };
    check_batch_id(&new_id)?;
    let target = Bundle::new(&root, &new_id);
    if target.exists() {
        return Err(CliError::usage(format!(
            "failed to create batch {new_id}: {} already exists; pick another --new-batch-id",
            target.root().display()
        )));
    }

    let mut lineage = Lineage {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        retry_of: plan.batch_id.clone(),
        class_filter: args.classes.clone(),
        rerun: Vec::new(),
        carried: Vec::new(),
        memory_boost_mb: BTreeMap::new(),
        past_cap: Vec::new(),
        recollected: Vec::new(),
        recovered: Vec::new(),
    };
    let mut carried = Vec::new();
    let mut recollected = Vec::new();
    for case in &plan.cases {
        let result: Option<CaseResult> = read_json(&source.case_result(&case.case_dir)).ok();
        match choose(result, case.resources.memory_mb, &classes) {
            Choice::Carry(r) => {
                lineage.carried.push(case.case_id.clone());
                carried.push(r);
            }
            Choice::Recollect(mut r) => {
                lineage.recollected.push(case.case_id.clone());
                lineage.carried.push(case.case_id.clone());
                let trace = r.trace_ref.clone().expect("chosen for its trace_ref");
                let dest = target.case(&case.case_dir).join(attempt_files::TRACE);
                std::fs::create_dir_all(target.case(&case.case_dir)).map_err(|e| {
                    CliError::usage(format!("failed to create {}: {e}", dest.display()))
                })?;
                if casebatch_activities::trace::collect(&trace, &dest)
                    .await
                    .is_ok()
                {
                    lineage.recovered.push(case.case_id.clone());
                    r.collect_failure = None;
                    r.failure = None;
                    let verified = !r.evaluation_configured || r.verdict == Some(Verdict::Pass);
                    let finished = r.actor_status == Some(ActorStatus::Finished);
                    r.state = if finished && verified {
                        CaseRecordState::Succeeded
                    } else {
                        CaseRecordState::Failed
                    };
                }
                recollected.push(r);
            }
            Choice::PastCap(r) => {
                lineage.past_cap.push(case.case_id.clone());
                lineage.carried.push(case.case_id.clone());
                carried.push(r);
            }
            Choice::Rerun { boost_mb } => {
                if let Some(mb) = boost_mb {
                    lineage.memory_boost_mb.insert(case.case_id.clone(), mb);
                }
                lineage.rerun.push(case.case_id.clone());
            }
        }
    }

    let mut new_plan = plan.clone();
    new_plan.batch_id = new_id.clone();
    run::prepare_bundle(
        &target,
        &new_plan,
        std::path::Path::new(&plan.provenance.manifest_path),
        Some(&engine),
    )?;
    // The manifest as the source batch saw it, not as the file may read today.
    if let Ok(text) = std::fs::read(source.manifest()) {
        std::fs::write(target.manifest(), text).map_err(|e| {
            CliError::usage(format!(
                "failed to write {}: {e}",
                target.manifest().display()
            ))
        })?;
    }
    write_json_atomic(&target.lineage(), &lineage)?;
    let stamped = carried.into_iter().map(|r| (r, false));
    for (mut r, recollected) in stamped.chain(recollected.into_iter().map(|r| (r, true))) {
        r.origin = Some(Origin {
            retry_of: plan.batch_id.clone(),
            carried: true,
            recollected,
        });
        write_json_atomic(&target.case_result(&r.case_dir), &r)?;
    }
    say!(
        "batch {new_id} retries {}: re-running {} failed case(s), carrying {} result(s){}",
        plan.batch_id,
        lineage.rerun.len(),
        lineage.carried.len(),
        if lineage.memory_boost_mb.is_empty() {
            String::new()
        } else {
            format!(", {} with memory doubled", lineage.memory_boost_mb.len())
        }
    );
    if !lineage.recollected.is_empty() {
        say!(
            "  {} collect-failed case(s) re-collected without re-run ({} recovered)",
            lineage.recollected.len(),
            lineage.recovered.len()
        );
    }
    for id in &lineage.past_cap {
        say!(
            "  {id}: OOM-killed at the {OOM_BOOST_CAP_MB} MB cap; not re-run. Change the case's resources.memory_mb (or what it does)"
        );
    }
    run::execute(
        engine,
        &target,
        &new_plan,
        args.no_worker,
        Default::default(),
    )
    .await
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
    if r.state == CaseRecordState::Succeeded {
        return Choice::Carry(r);
    }
    let class = r.failure.as_ref().map(|f| f.class);
    if !classes.is_empty() && !class.is_some_and(|c| classes.contains(&c)) {
        return Choice::Carry(r);
    }
    let collect_only = r
        .failure
        .as_ref()
        .is_some_and(|f| f.stage == Stage::Collect);
    if collect_only && r.trace_ref.is_some() {
        return Choice::Recollect(r);
    }
    let oom = r
        .failure
        .as_ref()
        .is_some_and(|f| f.code == codes::OOM_KILLED);
    if !oom {
        return Choice::Rerun { boost_mb: None };
    }
    // The next size builds on the last boost: 64 → 128 → 256 ...
    match r.memory_boost_mb.or(manifest_mb).map(|mb| mb * 2) {
        Some(mb) if mb > OOM_BOOST_CAP_MB => Choice::PastCap(r),
        boost_mb => Choice::Rerun { boost_mb },
    }
}
