//! `batch retry-failed`: a new batch that re-runs only the failed cases of a finished one
//! (see `casebatch_control::retry` for what is carried, re-collected or boosted).

use casebatch_control::RetryRequest;
use casebatch_proto::FailureClass;

use crate::cli::RetryArgs;
use crate::exit::{CliError, CliResult};
use crate::render::{self, Progress};

pub async fn retry_failed(args: RetryArgs) -> CliResult {
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
    let request = RetryRequest {
        source: args.batch.location()?,
        classes,
        new_batch_id: args.new_batch_id,
        engine: args.batch.engine.choice(),
        without_worker: args.no_worker,
    };
    let prepared = casebatch_control::retry::prepare(request).await?;
    // With --json, stdout is the run's view alone.
    if !args.batch.json {
        render::retry_plan(prepared.batch_id(), &prepared.lineage);
    }
    let mut progress = Progress::default();
    let report = prepared.run(&mut progress).await;
    progress.finish();
    let report = report?;
    Ok(if args.batch.json {
        render::run_report_json(&report)
    } else {
        render::run_report(&report)
    })
}
