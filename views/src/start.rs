//! `batch prepare --json`: the next run of a batch as a start request any Temporal SDK can
//! send, and (`--kind workflow-input`) the schema of the input it carries.

use std::collections::BTreeMap;

use casebatch_proto::BatchInput;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A workflow start, as `batch run` would make it. Sent as is (by any SDK, with the default
/// JSON payload converter), it starts a normal batch: `status`, `drain`, `resume` and `report`
/// work on it, and its ownership is proven by its input (plan fingerprint and bundle).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StartRequest {
    /// The Temporal namespace the bundle's engine record names.
    pub namespace: String,
    /// `casebatch-<batch_id>`.
    pub workflow_id: String,
    /// `BatchWorkflow`.
    pub workflow_type: String,
    /// `casebatch`: where the workers poll.
    pub task_queue: String,
    /// `fail`: a second start of a running batch is refused by the engine, never attached.
    pub id_conflict_policy: String,
    /// Memo fields (each a JSON payload): manifest, owner, cases, fingerprint, bundle_dir.
    pub memo: BTreeMap<String, serde_json::Value>,
    /// The `Casebatch*` search attributes' first values (Keyword and Int), empty where the
    /// namespace has not registered them: sending unknown attributes fails the start.
    pub search_attributes: BTreeMap<String, serde_json::Value>,
    /// The workflow's single argument (`config schema --kind workflow-input`).
    pub input: BatchInput,
}
