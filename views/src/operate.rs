//! `batch drain|pause|unpause|cancel|supersede|set-concurrency --json`: an operation's answer.

use casebatch_proto::Phase;
use casebatch_proto::share::ShareChange;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How an operation reached the batch workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "how")]
pub enum Effect {
    /// Applied by a worker (an update): the batch is now in this phase.
    Phase {
        /// The batch's phase after the operation.
        phase: Phase,
    },
    /// Applied by a worker: the active case limit changed.
    Concurrency {
        /// The limit before.
        before: u32,
        /// The limit now.
        after: u32,
    },
    /// Applied by a worker: the batch's priority and weight on shared runtimes changed.
    Share {
        /// Priority and weight before.
        before: ShareChange,
        /// Priority and weight now.
        after: ShareChange,
    },
    /// No worker answered within the wait: sent as a signal, applied when one runs the batch.
    Signalled,
}

/// The answer of an operation on a running batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ControlView {
    /// The batch operated on.
    pub batch_id: String,
    /// The operation: `drain`, `pause`, `unpause`, `cancel`, `supersede` or `set-concurrency`.
    pub operation: String,
    /// How it took effect.
    pub effect: Effect,
    /// What it means, for people (the text output's sentence).
    pub message: String,
}
