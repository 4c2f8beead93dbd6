//! The `reserve_start` activity's side of the shared paces (`RatePacer` workflows, one per
//! `rate_key`): book one start with update-with-start, so the first batch to ask starts the
//! key's pacer and every later one, on any worker replica, asks the same one.

use casebatch_proto::pace::{PaceAsk, pacer_workflow_id};
use casebatch_workflows::RatePacer;
use casebatch_workflows::pace::Gcra;
use temporalio_client::Client;

use crate::shared_workflows::{answer_within, start_or_ask};

/// Books one start on the pace of `ask`'s key: when it may go, µs since the epoch.
pub async fn reserve(client: &Client, ask: PaceAsk) -> Result<u64, String> {
    let key = ask
        .pace
        .key
        .clone()
        .ok_or("a pace without a rate_key is the batch's own, not a shared one")?;
    let id = pacer_workflow_id(&key);
    let options = start_or_ask(&id);
    let call = client.execute_update_with_start_workflow(
        RatePacer::run,
        Gcra::default(),
        RatePacer::reserve,
        ask,
        options,
    );
    answer_within(&format!("the shared pace {id}"), call).await
}
