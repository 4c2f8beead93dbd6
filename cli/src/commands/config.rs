//! `casebatch config schema`.

use crate::cli::SchemaKind;
use crate::exit::{CliResult, Exit};

pub fn schema(kind: SchemaKind) -> CliResult {
    let schema = match kind {
        SchemaKind::Batch => casebatch_manifest::batch_schema(),
    };
    say!(
        "{}",
        serde_json::to_string_pretty(&schema).expect("schema serializes")
    );
    Ok(Exit::Success)
}
