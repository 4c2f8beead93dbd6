//! `batch validate --json` and `batch plan --json`: everything before execution.

use std::path::PathBuf;

use casebatch_manifest::{Problem, SpreadWeights};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The answer of `batch validate --json`: the plan's identity when the manifest is valid, its
/// problems (all at once; exit 2) when not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ValidateView {
    /// The manifest loads into a plan.
    pub valid: bool,
    /// The manifest as the caller named it.
    pub file: PathBuf,
    /// The batch's id (valid manifests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
    /// How many cases the plan has (valid manifests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cases: Option<usize>,
    /// The plan's fingerprint: equal for equal task lists (valid manifests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Non-fatal notes about the plan (valid manifests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnings: Option<Vec<String>>,
    /// Everything wrong with the manifest (invalid manifests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problems: Option<Vec<Problem>>,
}

/// The answer of `batch plan --json` (and `batch run --dry-run --json`): the plan written,
/// nothing executed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlanView {
    /// The batch's id.
    pub batch_id: String,
    /// How many cases the plan has.
    pub cases: usize,
    /// The plan's fingerprint: equal for equal task lists.
    pub fingerprint: String,
    /// Where `batch_plan.json` was written.
    pub plan: PathBuf,
    /// Non-fatal notes about the plan.
    pub warnings: Vec<String>,
    /// The weights `runtime:` lists were dealt by; `null`: evenly (or no lists).
    pub spread: Option<SpreadWeights>,
}
