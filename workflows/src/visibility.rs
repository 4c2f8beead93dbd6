//! The `Casebatch*` search attributes the batch upserts as it progresses, so `temporal
//! workflow list --query` finds batches by id, outcome and counts.
//!
//! An upsert is a workflow command, so it is gated twice: by the input's
//! `search_attributes` (the starter sets it only where the attributes are registered; an
//! unknown attribute fails the workflow task) and by the [`SEARCH_ATTRIBUTES`] patch marker,
//! so a run whose history began without upserts replays without them. The batch id and the
//! initial outcome come with the start options; the workflow upserts the outcome and counts
//! at most once per workflow activation that recorded finished cases, and at the end. Runs
//! with the [`UPSERTS_THROTTLED`] marker upsert at most once per [`UPSERT_EVERY_MS`] of
//! workflow time while cases finish (each upsert is a billed action; a burst of short cases
//! upserted once per activation), and always before they sleep, continue as new or end: the
//! counts in the attributes may trail the batch by that long, `batch status` never does.

use casebatch_proto::Counts;
use casebatch_proto::visibility::search_attr;
use temporalio_common::search_attributes::SearchAttributeKey;
use temporalio_sdk::WorkflowContext;

use crate::shared::{Host, cost};

/// Patch id recorded by runs that upsert search attributes.
pub(crate) const SEARCH_ATTRIBUTES: &str = "search-attributes";
/// Patch id recorded by runs that upsert at most once per [`UPSERT_EVERY_MS`].
pub(crate) const UPSERTS_THROTTLED: &str = "upserts-throttled";
/// Workflow time between two upserts of a throttled run while cases finish.
pub(crate) const UPSERT_EVERY_MS: u64 = 10_000;

const OUTCOME: SearchAttributeKey<String> = SearchAttributeKey::keyword(search_attr::OUTCOME);
const SUCCEEDED: SearchAttributeKey<i64> = SearchAttributeKey::int(search_attr::SUCCEEDED);
const FAILED: SearchAttributeKey<i64> = SearchAttributeKey::int(search_attr::FAILED);

/// Whether this run upserts search attributes. Decided once per run, before any command but
/// the pipeline's patch marker; the marker is only asked for when the input enables upserts,
/// so runs that do not upsert record nothing new.
pub(crate) fn of_run<W: Host>(ctx: &WorkflowContext<W>, requested: bool) -> bool {
    let on = requested && ctx.patched(SEARCH_ATTRIBUTES);
    if on {
        cost(ctx, |a| a.markers += 1);
    }
    on
}

/// Whether this upserting run throttles its upserts. Asked once, right after [`of_run`].
pub(crate) fn throttled<W: Host>(ctx: &WorkflowContext<W>, visible: bool) -> bool {
    let on = visible && ctx.patched(UPSERTS_THROTTLED);
    if on {
        cost(ctx, |a| a.markers += 1);
    }
    on
}

/// Upserts the outcome and the counts.
pub(crate) fn publish<W: Host>(ctx: &WorkflowContext<W>, outcome: &str, counts: &Counts) {
    cost(ctx, |a| a.upserts += 1);
    ctx.upsert_search_attributes([
        OUTCOME.value_set(outcome.to_string()),
        SUCCEEDED.value_set(i64::from(counts.succeeded)),
        FAILED.value_set(i64::from(counts.failed)),
    ]);
}
