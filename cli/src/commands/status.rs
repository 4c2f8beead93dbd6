//! `batch status` (live when the batch runs), `batch report` (from the bundle alone; no
//! engine needed) and `batch history`.

use std::path::Path;

use casebatch_control::BatchLocation;

use crate::cli::{BatchRef, HistoryArgs, HistoryCommand, LogsArgs};
use crate::exit::{CliResult, Exit};
use crate::render;

pub async fn status(r: &BatchRef) -> CliResult {
    let view = casebatch_control::status(&r.location()?, &r.engine.choice()).await?;
    if r.json {
        render::json(&casebatch_views::StatusView {
            live: view.live,
            end: view.end,
            source: view.source,
            status: view.status,
            queued: view.queued,
        });
    } else {
        render::status(&view);
    }
    Ok(Exit::Success)
}

pub fn report(r: &BatchRef, html: Option<&Path>) -> CliResult {
    let view = casebatch_control::report(&r.location()?)?;
    if let Some(out) = html {
        let page = casebatch_report::render_html(&casebatch_report::ReportInput {
            plan: &view.plan,
            summary: &view.summary,
            results: &view.results,
            attempts: &view.attempts,
            bundle_dir: &view.bundle_root,
            bundle_href: bundle_href(out, &view.bundle_root)?,
        });
        casebatch_bundle::write_bytes_atomic(out, page.as_bytes())
            .map_err(casebatch_control::ControlError::Write)?;
        // On stderr: with --json, stdout is the JSON alone.
        eprintln!("wrote the HTML report to {}", out.display());
    }
    if r.json {
        render::json(&casebatch_views::ReportView {
            summary: view.summary,
            redispatched: view.redispatched,
        });
    } else {
        render::report(&view);
    }
    Ok(Exit::Success)
}

/// The bundle as a link from the directory the report is written to.
fn bundle_href(report: &Path, bundle: &Path) -> Result<String, crate::exit::CliError> {
    let absolute = |p: &Path| {
        std::path::absolute(p).map_err(|source| {
            casebatch_control::ControlError::Write(casebatch_bundle::BundleError::Write {
                path: p.display().to_string(),
                source,
            })
        })
    };
    let dir = absolute(report)?;
    let dir = dir.parent().unwrap_or(Path::new("/"));
    Ok(casebatch_report::relative_href(dir, &absolute(bundle)?))
}

pub fn logs(args: &LogsArgs) -> CliResult {
    let request = casebatch_control::LogsRequest {
        case_id: args.case.clone(),
        attempt: args.attempt,
        of: if args.evaluator {
            casebatch_control::LogsOf::Evaluator
        } else {
            casebatch_control::LogsOf::Harness
        },
        follow: args.follow,
    };
    let shown = casebatch_control::logs(
        &BatchLocation::new(&args.output_dir, &args.batch_id)?,
        &request,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )?;
    if shown == casebatch_control::LogsShown::NoAttemptYet {
        eprintln!(
            "case {} has not started an attempt yet (--follow waits for it)",
            args.case
        );
    }
    Ok(Exit::Success)
}

pub fn diff(output_dir: &Path, a: &str, b: &str, json: bool) -> CliResult {
    let d = casebatch_control::diff(
        &BatchLocation::new(output_dir, a)?,
        &BatchLocation::new(output_dir, b)?,
    )?;
    if json {
        render::json(&d);
    } else {
        render::diff(&d);
    }
    Ok(Exit::Success)
}

pub fn list(output_dir: &Path, json: bool) -> CliResult {
    let listed = casebatch_control::list(output_dir)?;
    if json {
        render::json(&listed);
    } else {
        render::list(&listed);
    }
    Ok(Exit::Success)
}

pub async fn history(
    r: &BatchRef,
    run_id: Option<String>,
    of: casebatch_control::HistoryOf<'_>,
    out: &std::path::Path,
) -> CliResult {
    let wid =
        casebatch_control::history(&r.location()?, &r.engine.choice(), run_id, of, out).await?;
    if r.json {
        render::json(&casebatch_views::BatchHistoryView {
            workflow_id: wid,
            out: out.to_path_buf(),
        });
    } else {
        say!("wrote the history of {wid} to {}", out.display());
    }
    Ok(Exit::Success)
}

/// `casebatch history [rebuild]`: the index refreshed (or rebuilt) from the bundles, then its
/// medians.
pub fn run_history(args: &HistoryArgs) -> CliResult {
    let rebuild = matches!(args.command, Some(HistoryCommand::Rebuild));
    let view =
        casebatch_control::history_view(&args.output_dir, args.history_db.as_deref(), rebuild)?;
    if args.json {
        render::json(&view);
    } else {
        render::history_view(&view);
    }
    Ok(Exit::Success)
}
