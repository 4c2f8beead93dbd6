//! `batch diff` and `batch list`: batches side by side, read from their bundles only (nothing
//! is written and no engine is asked).

use std::collections::BTreeMap;
use std::path::Path;

use casebatch_bundle::stats::{BatchStats, Rate};
use casebatch_bundle::{Bundle, CaseResult, read_json, summary};
pub use casebatch_views::compare::{BatchDiff, Flip, Listed, RateDelta, ScoreDelta};

use crate::error::Result;
use crate::location::{BatchLocation, absolute};

/// One side: each case's latest result by id, in plan order, and the batch's stats.
struct Side {
    fingerprint: String,
    cases: Vec<(String, Option<CaseResult>)>,
    stats: BatchStats,
}

fn side(location: &BatchLocation) -> Result<Side> {
    let (bundle, plan) = location.open()?;
    let assembled = summary::assemble(&bundle, &plan)?;
    let stats = BatchStats::of(&assembled.results, &assembled.attempts);
    let cases = plan
        .cases
        .iter()
        .map(|c| c.case_id.clone())
        .zip(assembled.results)
        .collect();
    Ok(Side {
        fingerprint: plan.fingerprint,
        cases,
        stats,
    })
}

fn state(r: &Option<CaseResult>) -> String {
    r.as_ref()
        .map_or("queued", |r| r.state.as_str())
        .to_string()
}

fn rate_delta(a: Rate, b: Rate) -> RateDelta {
    let delta = a.rate.zip(b.rate).map(|(x, y)| y - x);
    RateDelta { a, b, delta }
}

/// Lines up `a` and `b` (a batch and its `retry-failed` child, or any two runs).
pub fn diff(a: &BatchLocation, b: &BatchLocation) -> Result<BatchDiff> {
    let (sa, sb) = (side(a)?, side(b)?);
    let in_b: BTreeMap<&str, &Option<CaseResult>> =
        sb.cases.iter().map(|(id, r)| (id.as_str(), r)).collect();
    let in_a: BTreeMap<&str, &Option<CaseResult>> =
        sa.cases.iter().map(|(id, r)| (id.as_str(), r)).collect();

    let mut flipped = Vec::new();
    let mut pairs: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (id, ra) in &sa.cases {
        let Some(rb) = in_b.get(id.as_str()) else {
            continue;
        };
        let (from, to) = (state(ra), state(rb));
        if from != to {
            flipped.push(Flip {
                case_id: id.clone(),
                from,
                to,
            });
        }
        if let (Some(ra), Some(rb)) = (ra, rb) {
            for (name, va) in &ra.scores {
                if let (Some(x), Some(y)) =
                    (va.as_f64(), rb.scores.get(name).and_then(|v| v.as_f64()))
                {
                    pairs.entry(name.clone()).or_default().push((x, y));
                }
            }
        }
    }
    let scores = pairs
        .into_iter()
        .map(|(name, xy)| {
            let n = xy.len();
            let mean_a = xy.iter().map(|p| p.0).sum::<f64>() / n as f64;
            let mean_b = xy.iter().map(|p| p.1).sum::<f64>() / n as f64;
            let delta = mean_b - mean_a;
            (
                name,
                ScoreDelta {
                    n,
                    mean_a,
                    mean_b,
                    delta,
                },
            )
        })
        .collect();
    let only = |x: &Side, other: &BTreeMap<&str, &Option<CaseResult>>| {
        x.cases
            .iter()
            .filter(|(id, _)| !other.contains_key(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect()
    };
    Ok(BatchDiff {
        a: a.batch_id.clone(),
        b: b.batch_id.clone(),
        same_task_list: sa.fingerprint == sb.fingerprint,
        flipped,
        only_in_a: only(&sa, &in_b),
        only_in_b: only(&sb, &in_a),
        pass_rate: rate_delta(sa.stats.pass_rate.clone(), sb.stats.pass_rate.clone()),
        pass_rate_excluding_infra: rate_delta(
            sa.stats.pass_rate_excluding_infra,
            sb.stats.pass_rate_excluding_infra,
        ),
        scores,
    })
}

/// The batches under `output_dir`, by id.
pub fn list(output_dir: &Path) -> Result<Vec<Listed>> {
    let root = absolute(output_dir)?;
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(Vec::new());
    };
    let mut listed: Vec<Listed> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let bundle = Bundle::new(&root, &name);
            let plan = bundle.read_plan().ok()?;
            let summary: Option<summary::BatchSummary> = read_json(&bundle.summary()).ok();
            let counts = summary
                .as_ref()
                .map(|s| s.counts.clone())
                .unwrap_or_default();
            let count = |k: &str| counts.get(k).copied().unwrap_or(0);
            let outcome = match &summary {
                None => "not run",
                Some(_) if count("queued") + count("running") + count("retrying") > 0 => {
                    "unfinished"
                }
                Some(_) if count("failed") + count("cancelled") > 0 => "failures",
                Some(_) => "all succeeded",
            };
            Some(Listed {
                batch_id: plan.batch_id,
                cases: plan.cases.len(),
                pass_rate: summary
                    .as_ref()
                    .and_then(|s| s.stats.as_ref())
                    .and_then(|st| st.pass_rate.rate),
                counts,
                outcome: outcome.into(),
            })
        })
        .collect();
    listed.sort_by(|a, b| a.batch_id.cmp(&b.batch_id));
    Ok(listed)
}
