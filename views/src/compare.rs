//! `batch diff --json` and `batch list --json`: batches side by side, read from their bundles.

use std::collections::BTreeMap;

use casebatch_bundle::stats::Rate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Two batches lined up by case id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BatchDiff {
    /// The batch compared from.
    pub a: String,
    /// The batch compared to.
    pub b: String,
    /// The batches ran the same task list (equal plan fingerprints).
    pub same_task_list: bool,
    /// Cases finished (succeeded or failed) in both whose state changed, in plan order of `a`:
    /// a result that changed.
    pub flipped: Vec<Flip>,
    /// Cases in both whose state differs and that one side has not finished (queued, running,
    /// retrying, cancelled): no result changed, a run is missing. In plan order of `a`.
    #[serde(default)]
    pub not_finished: Vec<Flip>,
    /// Case ids only `a` has.
    pub only_in_a: Vec<String>,
    /// Case ids only `b` has.
    pub only_in_b: Vec<String>,
    /// Pass rate over finished cases.
    pub pass_rate: RateDelta,
    /// Pass rate over finished cases whose failure is not infrastructure's.
    pub pass_rate_excluding_infra: RateDelta,
    /// Pass rate over the cases finished in both, paired case by case, with a bootstrap
    /// interval for its delta.
    #[serde(default)]
    pub paired_pass_rate: PairedDelta,
    /// By score name, over the cases finished in both that report it as a number in both.
    pub scores: BTreeMap<String, PairedDelta>,
}

/// A mean over cases present in both batches, paired case by case.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PairedDelta {
    /// Cases in the pairing.
    pub n: usize,
    /// Mean in `a` (a pass rate: the share that succeeded).
    pub mean_a: f64,
    /// Mean in `b`.
    pub mean_b: f64,
    /// `mean_b − mean_a`.
    pub delta: f64,
    /// A 95 % paired bootstrap interval of `delta`; `None` with fewer than two pairs.
    pub ci95: Option<Interval>,
}

/// A confidence interval and how it was computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Interval {
    pub low: f64,
    pub high: f64,
    /// Resamples of the cases (with replacement, seeded: the same bundles give the same
    /// interval); the interval is their 2.5th and 97.5th percentile means.
    pub resamples: u32,
}

/// A case whose state differs between the two batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Flip {
    /// The case's id.
    pub case_id: String,
    /// Its state in `a`.
    pub from: String,
    /// Its state in `b`.
    pub to: String,
}

/// One rate in both batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RateDelta {
    /// The rate in `a`.
    pub a: Rate,
    /// The rate in `b`.
    pub b: Rate,
    /// `b − a`; `None` when either has no denominator.
    pub delta: Option<f64>,
}

/// One batch of an output root, as its bundle shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Listed {
    /// The batch's id.
    pub batch_id: String,
    /// How many cases its plan has.
    pub cases: usize,
    /// Cases by state (from the last written summary; empty before the first one).
    pub counts: BTreeMap<String, usize>,
    /// `all succeeded`, `failures`, `unfinished`, or `not run` (no summary yet).
    pub outcome: String,
    /// Succeeded over finished cases; `null` when none finished.
    pub pass_rate: Option<f64>,
    /// When its first run started (ms since the epoch; the earliest event of an older bundle);
    /// `null` before any.
    #[serde(default)]
    pub started_at_ms: Option<u64>,
    /// From the first start to the end of its last run; `null` while a run has not ended.
    #[serde(default)]
    pub duration_ms: Option<u64>,
}
