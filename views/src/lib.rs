//! The shape of every `--json` output of the casebatch CLI, and its JSON Schema.
//!
//! Each module holds one view: a struct the CLI builds and serializes, so scripts can rely on a
//! stable, documented shape (`casebatch config schema --kind <view>` prints its schema). A view
//! change is a schema change, and the schema snapshots (`views/tests/schemas.rs`) show it in
//! review. This crate is a leaf: it embeds the wire and bundle types and imports nothing that
//! runs batches.

pub mod compare;
pub mod engine;
pub mod inspect;
pub mod manifest;
pub mod operate;
pub mod run;
pub mod run_history;
pub mod start;

use schemars::{JsonSchema, generate::SchemaSettings};
use serde_json::Value;

pub use compare::{BatchDiff, Flip, Interval, Listed, PairedDelta, RateDelta};
pub use engine::EngineStatus;
pub use inspect::{BatchHistoryView, QueuedCase, ReportView, StatusSource, StatusView};
pub use manifest::{PlanView, ValidateView};
pub use operate::{ControlView, Effect};
pub use run::{RunEnd, RunView};
pub use run_history::HistoryView;
pub use start::StartRequest;

const SCHEMA_BASE: &str = "https://casebatch.dev/schemas";

/// What `casebatch config schema --kind` describes: the batch manifest (the input), the
/// result files a harness and an evaluator write, or the `--json` output of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ViewKind {
    /// The YAML/JSON batch manifest (input, not a view).
    #[default]
    Batch,
    /// The result file a harness writes to `$CASEBATCH_RESULT` (input, not a view).
    Result,
    /// The result file an evaluator writes to its `$CASEBATCH_RESULT` (input, not a view).
    EvaluatorResult,
    /// `batch validate --json`.
    Validate,
    /// `batch plan --json` and `batch run --dry-run --json`.
    Plan,
    /// `batch run|resume|rerun|retry-failed --json` and `run --case --json`.
    Run,
    /// `batch status --json`.
    Status,
    /// `batch report --json`.
    Report,
    /// `batch diff --json`.
    Diff,
    /// `batch list --json`.
    List,
    /// `batch drain|pause|unpause|cancel|supersede|set-concurrency --json`.
    Control,
    /// `batch history --json` (a run's workflow history exported).
    BatchHistory,
    /// `casebatch history --json` (the run-history index).
    History,
    /// `engine status --json`.
    EngineStatus,
    /// `batch prepare --json`: a start request for any Temporal SDK.
    StartRequest,
    /// The batch workflow's input (`input` of a start request).
    WorkflowInput,
}

impl ViewKind {
    /// Every kind, in the order of `--kind`'s help.
    pub const ALL: [ViewKind; 16] = [
        ViewKind::Batch,
        ViewKind::Result,
        ViewKind::EvaluatorResult,
        ViewKind::Validate,
        ViewKind::Plan,
        ViewKind::Run,
        ViewKind::Status,
        ViewKind::Report,
        ViewKind::Diff,
        ViewKind::List,
        ViewKind::Control,
        ViewKind::BatchHistory,
        ViewKind::History,
        ViewKind::EngineStatus,
        ViewKind::StartRequest,
        ViewKind::WorkflowInput,
    ];

    /// The kebab-case name `--kind` takes.
    pub fn name(self) -> &'static str {
        match self {
            ViewKind::Batch => "batch",
            ViewKind::Result => "result",
            ViewKind::EvaluatorResult => "evaluator-result",
            ViewKind::Validate => "validate",
            ViewKind::Plan => "plan",
            ViewKind::Run => "run",
            ViewKind::Status => "status",
            ViewKind::Report => "report",
            ViewKind::Diff => "diff",
            ViewKind::List => "list",
            ViewKind::Control => "control",
            ViewKind::BatchHistory => "batch-history",
            ViewKind::History => "history",
            ViewKind::EngineStatus => "engine-status",
            ViewKind::StartRequest => "start-request",
            ViewKind::WorkflowInput => "workflow-input",
        }
    }

    /// The kind's JSON Schema (draft 2020-12).
    pub fn schema(self) -> Value {
        match self {
            ViewKind::Batch => casebatch_manifest::batch_schema(),
            ViewKind::Result => casebatch_attempt::result_contract::result_schema(),
            ViewKind::EvaluatorResult => {
                casebatch_attempt::result_contract::evaluator_result_schema()
            }
            ViewKind::Validate => schema_of::<ValidateView>(self),
            ViewKind::Plan => schema_of::<PlanView>(self),
            ViewKind::Run => schema_of::<RunView>(self),
            ViewKind::Status => schema_of::<StatusView>(self),
            ViewKind::Report => schema_of::<ReportView>(self),
            ViewKind::Diff => schema_of::<BatchDiff>(self),
            ViewKind::List => schema_of::<Vec<Listed>>(self),
            ViewKind::Control => schema_of::<ControlView>(self),
            ViewKind::BatchHistory => schema_of::<BatchHistoryView>(self),
            ViewKind::History => schema_of::<HistoryView>(self),
            ViewKind::EngineStatus => schema_of::<EngineStatus>(self),
            ViewKind::StartRequest => schema_of::<StartRequest>(self),
            ViewKind::WorkflowInput => schema_of::<casebatch_proto::BatchInput>(self),
        }
    }
}

fn schema_of<T: JsonSchema>(kind: ViewKind) -> Value {
    let generator = SchemaSettings::draft2020_12().into_generator();
    let schema = generator.into_root_schema_for::<T>();
    let mut value = serde_json::to_value(schema).expect("a schema serializes");
    if let Some(object) = value.as_object_mut() {
        let name = kind.name();
        object.insert(
            "$id".into(),
            Value::String(format!("{SCHEMA_BASE}/views/{name}.json")),
        );
        object.insert(
            "title".into(),
            Value::String(format!("casebatch {name} --json output")),
        );
    }
    value
}
