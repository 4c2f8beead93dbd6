//! `batch status` (live when the batch runs), `batch report` (from the bundle alone; no
//! engine needed) and `batch history`.

use crate::cli::BatchRef;
use crate::exit::{CliResult, Exit};
use crate::render;

pub async fn status(r: &BatchRef) -> CliResult {
    let view = casebatch_control::status(&r.location()?, &r.engine.choice()).await?;
    if r.json {
        render::json(
            &serde_json::json!({ "live": view.live, "end": view.end, "status": view.status }),
        );
    } else {
        render::status(&view);
    }
    Ok(Exit::Success)
}

pub fn report(r: &BatchRef) -> CliResult {
    let view = casebatch_control::report(&r.location()?)?;
    if r.json {
        render::json(
            &serde_json::json!({ "summary": view.summary, "redispatched": view.redispatched }),
        );
    } else {
        render::report(&view);
    }
    Ok(Exit::Success)
}

pub async fn history(
    r: &BatchRef,
    run_id: Option<String>,
    breaker: Option<&str>,
    out: &std::path::Path,
) -> CliResult {
    let wid = casebatch_control::history(&r.location()?, &r.engine.choice(), run_id, breaker, out)
        .await?;
    say!("wrote the history of {wid} to {}", out.display());
    Ok(Exit::Success)
}
