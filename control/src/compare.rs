//! `batch diff` and `batch list`: batches side by side, read from their bundles only (nothing
//! is written and no engine is asked).

use casebatch_proto::CaseState;
use std::collections::BTreeMap;
use std::path::Path;

use casebatch_bundle::stats::{BatchStats, Rate};
use casebatch_bundle::{Bundle, CaseResult, Event, read_json, summary};
pub use casebatch_views::compare::{BatchDiff, Flip, Interval, Listed, PairedDelta, RateDelta};

use crate::bootstrap::paired_delta;
use crate::error::Result;
use crate::location::{BatchLocation, absolute};

/// One side: each case's latest result by id, in plan order, and the batch's stats.
struct Side {
    fingerprint: String,
    cases: Vec<(String, Option<CaseResult>)>,
    stats: BatchStats,
}

fn side(location: &BatchLocation) -> Result<Side> {
    let (bundle, plan) = location.open_head()?;
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

/// Succeeded or failed: a result to compare (the pass rate's denominator).
fn finished(r: &Option<CaseResult>) -> Option<&CaseResult> {
    r.as_ref()
        .filter(|r| matches!(r.state, CaseState::Succeeded | CaseState::Failed))
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

    let (mut flipped, mut not_finished) = (Vec::new(), Vec::new());
    let mut passes = Vec::new();
    let mut scores: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (id, ra) in &sa.cases {
        let Some(rb) = in_b.get(id.as_str()) else {
            continue;
        };
        let both = finished(ra).zip(finished(rb));
        let (from, to) = (state(ra), state(rb));
        if from != to {
            let flip = Flip {
                case_id: id.clone(),
                from,
                to,
            };
            match both {
                Some(_) => flipped.push(flip),
                None => not_finished.push(flip),
            }
        }
        let Some((ra, rb)) = both else {
            continue;
        };
        let passed = |r: &CaseResult| f64::from(u8::from(r.state == CaseState::Succeeded));
        passes.push((passed(ra), passed(rb)));
        for (name, va) in &ra.scores {
            if let (Some(x), Some(y)) = (va.as_f64(), rb.scores.get(name).and_then(|v| v.as_f64()))
            {
                scores.entry(name.clone()).or_default().push((x, y));
            }
        }
    }
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
        not_finished,
        only_in_a: only(&sa, &in_b),
        only_in_b: only(&sb, &in_a),
        pass_rate: rate_delta(sa.stats.pass_rate.clone(), sb.stats.pass_rate.clone()),
        pass_rate_excluding_infra: rate_delta(
            sa.stats.pass_rate_excluding_infra,
            sb.stats.pass_rate_excluding_infra,
        ),
        paired_pass_rate: paired_delta(&passes),
        scores: scores
            .into_iter()
            .map(|(name, pairs)| (name, paired_delta(&pairs)))
            .collect(),
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
            let plan = bundle.read_plan_head().ok()?;
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
            let span = run_span(&bundle.events());
            Some(Listed {
                batch_id: plan.batch_id,
                cases: plan.cases.len(),
                pass_rate: summary
                    .as_ref()
                    .and_then(|s| s.stats.as_ref())
                    .and_then(|st| st.pass_rate.rate),
                counts,
                outcome: outcome.into(),
                started_at_ms: span.started_at_ms,
                duration_ms: span.duration_ms(),
            })
        })
        .collect();
    listed.sort_by(|a, b| a.batch_id.cmp(&b.batch_id));
    Ok(listed)
}

/// When a batch's runs started and ended, from its events.
#[derive(Debug, Default, PartialEq)]
struct RunSpan {
    started_at_ms: Option<u64>,
    /// The last run's end; `None` while the last run started has not ended.
    ended_at_ms: Option<u64>,
}

impl RunSpan {
    fn duration_ms(&self) -> Option<u64> {
        Some(self.ended_at_ms?.saturating_sub(self.started_at_ms?))
    }
}

/// Reads the first event (the batch's start: `run_started`, or an older bundle's first
/// attempt) and the last 64 KiB, where the last run's start or end is: a listing of many
/// large batches reads a few kilobytes of each, not every attempt's event.
fn run_span(events: &Path) -> RunSpan {
    use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
    const TAIL: u64 = 64 * 1024;
    let Ok(mut file) = std::fs::File::open(events) else {
        return RunSpan::default();
    };
    let parse = |line: &str| serde_json::from_str::<Event>(line).ok();
    let mut first = String::new();
    let _ = BufReader::new(&mut file).read_line(&mut first);
    let started_at_ms = parse(&first).map(|e| e.ts_ms);
    let len = file.metadata().map_or(0, |m| m.len());
    let mut tail = String::new();
    if file
        .seek(SeekFrom::Start(len.saturating_sub(TAIL)))
        .is_err()
        || file.read_to_string(&mut tail).is_err()
    {
        return RunSpan::default();
    }
    let last_run_event = tail
        .lines()
        .rev()
        .filter_map(parse)
        .find(|e| e.kind == Event::RUN_STARTED || e.kind == Event::RUN_ENDED);
    RunSpan {
        started_at_ms,
        ended_at_ms: last_run_event
            .filter(|e| e.kind == Event::RUN_ENDED)
            .map(|e| e.ts_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_bundle::append_jsonl;

    fn event(ts_ms: u64, kind: &str) -> Event {
        Event {
            ts_ms,
            kind: kind.into(),
            case_id: None,
            attempt: None,
            message: "x".repeat(200),
        }
    }

    #[test]
    fn a_span_runs_from_the_first_start_to_the_last_end_and_is_open_while_a_run_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        assert_eq!(run_span(&path), RunSpan::default());
        append_jsonl(&path, &event(1_000, Event::RUN_STARTED)).unwrap();
        // Enough attempts that the first start is far outside the tail that is read.
        for i in 0..1000 {
            append_jsonl(&path, &event(2_000 + i, "attempt_finished")).unwrap();
        }
        append_jsonl(&path, &event(5_000, Event::RUN_ENDED)).unwrap();
        let ended = run_span(&path);
        assert_eq!(
            (ended.started_at_ms, ended.duration_ms()),
            (Some(1_000), Some(4_000))
        );
        append_jsonl(&path, &event(9_000, Event::RUN_STARTED)).unwrap();
        append_jsonl(&path, &event(9_500, "attempt_finished")).unwrap();
        let resumed = run_span(&path);
        assert_eq!(
            (resumed.started_at_ms, resumed.ended_at_ms),
            (Some(1_000), None)
        );
        append_jsonl(&path, &event(12_000, Event::RUN_ENDED)).unwrap();
        assert_eq!(run_span(&path).duration_ms(), Some(11_000));
    }
}
