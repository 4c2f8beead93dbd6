//! The report's case-level view: one section per case with what went in (its input), what
//! came out (outputs, scores, verdict, failure, usage) and every attempt (stage timings and
//! links to its logs and records, relative to the report so the bundle and the report move
//! together).

use casebatch_proto::CaseState;
use std::path::{Component, Path, PathBuf};

use casebatch_bundle::attempt_files;
use casebatch_bundle::summary::{reran_in_place, sum_usage};
use casebatch_bundle::{AttemptRecord, CaseResult};
use casebatch_manifest::PlannedCase;
use serde::Serialize;

use crate::human;

/// Sections beyond this many make a page no browser opens comfortably; the rest of a larger
/// batch is in the bundle (and `batch logs`). Cases that did not succeed are shown first.
pub const MAX_SECTIONS: usize = 2000;
/// Input and outputs longer than this are cut (the whole is in the bundle).
const MAX_JSON_CHARS: usize = 8 * 1024;

/// One case's section.
#[derive(Debug, Serialize)]
pub struct CaseSection {
    /// The element id the cases table links to.
    pub anchor: String,
    pub case_id: String,
    pub state: String,
    pub verdict: Option<String>,
    pub failure: Option<String>,
    pub input: String,
    pub outputs: Option<String>,
    pub scores: Vec<(String, String)>,
    pub usage: Option<String>,
    /// Where the result comes from when it is not the case's first run.
    pub origin: Option<String>,
    pub attempts: Vec<AttemptRow>,
}

/// One attempt of a case.
#[derive(Debug, Serialize)]
pub struct AttemptRow {
    pub attempt: u32,
    pub outcome: String,
    pub took: Option<String>,
    /// `stage time`, in pipeline order.
    pub stages: Vec<String>,
    /// `(label, href)` of the attempt's files that exist.
    pub links: Vec<(String, String)>,
}

/// Everything about one case, as read from the bundle.
pub struct CaseEvidence<'a> {
    pub case: &'a PlannedCase,
    pub result: Option<&'a CaseResult>,
    pub attempts: Vec<&'a AttemptRecord>,
}

/// The sections, in plan order, at most [`MAX_SECTIONS`] of them (unsuccessful cases kept
/// first), and how many were left out. `bundle_dir` is the bundle as the report's directory
/// reaches it (relative where it can be); a link is made for files that exist there.
pub fn sections(
    cases: &[CaseEvidence<'_>],
    bundle_dir: &Path,
    bundle_href: &str,
) -> (Vec<CaseSection>, usize) {
    let succeeded =
        |e: &CaseEvidence<'_>| e.result.is_some_and(|r| r.state == CaseState::Succeeded);
    let mut shown: Vec<usize> = (0..cases.len())
        .filter(|&i| !succeeded(&cases[i]))
        .collect();
    shown.extend((0..cases.len()).filter(|&i| succeeded(&cases[i])));
    shown.truncate(MAX_SECTIONS);
    shown.sort_unstable();
    let left_out = cases.len() - shown.len();
    let sections = shown
        .into_iter()
        .map(|i| section(&cases[i], bundle_dir, bundle_href))
        .collect();
    (sections, left_out)
}

/// The anchor of a case's section (by plan index: ids may hold any character).
pub fn anchor(index: u32) -> String {
    format!("case-{index}")
}

fn section(e: &CaseEvidence<'_>, bundle_dir: &Path, bundle_href: &str) -> CaseSection {
    let r = e.result;
    let case_dir = format!("cases/{}", e.case.case_dir);
    CaseSection {
        anchor: anchor(e.case.index),
        case_id: e.case.case_id.clone(),
        state: r.map_or("queued".into(), |r| r.state.as_str().into()),
        verdict: r.and_then(|r| r.verdict.as_ref()).map(text),
        failure: r.and_then(|r| r.failure.as_ref()).map(|f| {
            format!(
                "{}/{} ({}): {}",
                text(&f.stage),
                text(&f.class),
                text(&f.code),
                f.message
            )
        }),
        input: pretty(&e.case.input),
        outputs: r
            .filter(|r| !r.outputs.is_null())
            .map(|r| pretty(&r.outputs)),
        scores: r
            .map(|r| {
                r.scores
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        usage: usage(&e.attempts),
        origin: origin(r, &e.attempts),
        attempts: e
            .attempts
            .iter()
            .map(|a| attempt_row(a, &case_dir, bundle_dir, bundle_href))
            .collect(),
    }
}

/// What every attempt of the case reported, summed (`None`: nothing was reported).
fn usage(attempts: &[&AttemptRecord]) -> Option<String> {
    let sum = sum_usage(attempts.iter().filter_map(|a| a.summary.usage.as_ref()))?;
    let parts: Vec<String> = sum
        .0
        .iter()
        .map(|(k, v)| format!("{k} {}", crate::headline::number(*v)))
        .collect();
    Some(parts.join(" · "))
}

/// Where a case's result comes from when it is not a first run: carried over or re-run by
/// `retry-failed`, or re-run inside this batch after it had finished.
fn origin(r: Option<&CaseResult>, attempts: &[&AttemptRecord]) -> Option<String> {
    if let Some(o) = r.and_then(|r| r.origin.as_ref()) {
        let source = &o.retry_of;
        return Some(match (o.carried, o.recollected) {
            (true, false) => format!("carried over from batch {source} as it was"),
            (true, true) => {
                format!("carried over from batch {source}, its trace collected again")
            }
            (false, _) => format!("re-run by retry-failed of batch {source}"),
        });
    }
    reran_in_place(attempts.iter().copied())
        .then(|| "re-run in this batch after an earlier attempt had finished it".to_string())
}

fn attempt_row(a: &AttemptRecord, case_dir: &str, bundle_dir: &Path, href: &str) -> AttemptRow {
    let s = &a.summary;
    let mut outcome = Vec::new();
    if let Some(actor) = &s.actor {
        outcome.push(format!("actor {}", text(actor)));
    }
    if let Some(code) = s.exit_code {
        outcome.push(format!("exit {code}"));
    }
    if let Some(v) = &s.verdict {
        outcome.push(format!("verdict {}", text(v)));
    }
    if let Some(f) = &s.failure {
        outcome.push(format!(
            "{}/{} ({})",
            text(&f.stage),
            text(&f.class),
            text(&f.code)
        ));
    }
    if a.will_retry {
        outcome.push("retried".into());
    }
    if s.speculative_loser {
        outcome.push("lost the race to a duplicate".into());
    }
    let dir = format!("{case_dir}/attempts/{}", s.attempt);
    let links = [
        ("stdout", attempt_files::STDOUT),
        ("stderr", attempt_files::STDERR),
        ("result", attempt_files::RESULT),
        ("evaluator stdout", attempt_files::EVAL_STDOUT),
        ("evaluator stderr", attempt_files::EVAL_STDERR),
        ("evaluator result", attempt_files::EVAL_RESULT),
        ("trace", attempt_files::TRACE),
        ("record", attempt_files::JOURNAL),
    ]
    .into_iter()
    .filter(|(_, file)| bundle_dir.join(&dir).join(file).is_file())
    .map(|(label, file)| (label.to_string(), format!("{href}/{}/{file}", encode(&dir))))
    .collect();
    AttemptRow {
        attempt: s.attempt,
        outcome: outcome.join(" · "),
        took: s.duration_ms().map(human),
        stages: a
            .stages
            .iter()
            .map(|t| format!("{} {}", t.stage.as_str(), human(t.duration_ms)))
            .collect(),
        links,
    }
}

/// A serialized enum's name (`succeeded`, `HARNESS_BAD_RESULT`).
fn text<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

fn pretty<T: Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    if s.len() > MAX_JSON_CHARS {
        let cut = (0..=MAX_JSON_CHARS)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        let more = s.len() - cut;
        s.truncate(cut);
        s.push_str(&format!("\n… ({more} bytes more in the bundle)"));
    }
    s
}

/// `to` as a link from the directory `from` (both absolute): relative, so a report written
/// beside or inside the output directory keeps working when the two are copied together.
pub fn relative_href(from: &Path, to: &Path) -> String {
    let (from, to) = (normal(from), normal(to));
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = from.components().count() - common;
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_string(), ups).collect();
    parts.extend(
        to.components()
            .skip(common)
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".into()
    } else {
        encode(&parts.join("/"))
    }
}

/// `.` and `..` resolved by name (the paths are made absolute by the caller).
fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Percent-encodes what is not safe in a URL path (slashes kept).
fn encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_to_the_report_and_encoded() {
        let rel = |a: &str, b: &str| relative_href(Path::new(a), Path::new(b));
        assert_eq!(rel("/w/out", "/w/out/logs/batch/b"), "logs/batch/b");
        assert_eq!(rel("/w/reports/x", "/w/out/b"), "../../out/b");
        assert_eq!(rel("/w/out/b", "/w/out/b"), ".");
        assert_eq!(rel("/w/./a/../r", "/w/my out/b#1"), "../my%20out/b%231");
    }

    #[test]
    fn long_json_is_cut_on_a_character_boundary_and_says_how_much_is_left() {
        let long = serde_json::json!({"text": "é".repeat(MAX_JSON_CHARS)});
        let s = pretty(&long);
        assert!(s.len() < MAX_JSON_CHARS + 64, "{}", s.len());
        assert!(s.ends_with("bytes more in the bundle)"), "{s}");
    }
}
