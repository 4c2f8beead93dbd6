//! The `Casebatch*` search attributes the batch upserts as it progresses, so `temporal
//! workflow list --query` finds batches by id, outcome and counts.
//!
//! An upsert is a workflow command, so it is gated twice: by the input's
//! `search_attributes` (the starter sets it only where the attributes are registered; an
//! unknown attribute fails the workflow task) and by the [`SEARCH_ATTRIBUTES`] patch marker,
//! so a run whose history began without upserts replays without them. The batch id and the
//! initial outcome come with the start options; the workflow upserts the outcome and counts
//! at most once per workflow activation that recorded finished cases, and at the end.

use casebatch_proto::Counts;
use casebatch_proto::visibility::search_attr;
use temporalio_common::search_attributes::SearchAttributeKey;
use temporalio_sdk::WorkflowContext;

/// Patch id recorded by runs that upsert search attributes.
pub(crate) const SEARCH_ATTRIBUTES: &str = "search-attributes";

const OUTCOME: SearchAttributeKey<String> = SearchAttributeKey::keyword(search_attr::OUTCOME);
const SUCCEEDED: SearchAttributeKey<i64> = SearchAttributeKey::int(search_attr::SUCCEEDED);
const FAILED: SearchAttributeKey<i64> = SearchAttributeKey::int(search_attr::FAILED);

/// Whether this run upserts search attributes. Decided once per run, before any command but
/// the pipeline's patch marker; the marker is only asked for when the input enables upserts,
/// so runs that do not upsert record nothing new.
pub(crate) fn of_run<W>(ctx: &WorkflowContext<W>, requested: bool) -> bool {
    requested && ctx.patched(SEARCH_ATTRIBUTES)
}

/// Upserts the outcome and the counts.
pub(crate) fn publish<W>(ctx: &WorkflowContext<W>, outcome: &str, counts: &Counts) {
    ctx.upsert_search_attributes([
        OUTCOME.value_set(outcome.to_string()),
        SUCCEEDED.value_set(i64::from(counts.succeeded)),
        FAILED.value_set(i64::from(counts.failed)),
    ]);
}
