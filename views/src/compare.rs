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
    /// Cases in both whose state changed, in plan order of `a`.
    pub flipped: Vec<Flip>,
    /// Case ids only `a` has.
    pub only_in_a: Vec<String>,
    /// Case ids only `b` has.
    pub only_in_b: Vec<String>,
    /// Pass rate over finished cases.
    pub pass_rate: RateDelta,
    /// Pass rate over finished cases whose failure is not infrastructure's.
    pub pass_rate_excluding_infra: RateDelta,
    /// By score name, over the cases that report it as a number in both.
    pub scores: BTreeMap<String, ScoreDelta>,
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

/// One score's mean in both batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ScoreDelta {
    /// Cases with the score in both batches.
    pub n: usize,
    /// Mean in `a`.
    pub mean_a: f64,
    /// Mean in `b`.
    pub mean_b: f64,
    /// `mean_b − mean_a`.
    pub delta: f64,
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
}
