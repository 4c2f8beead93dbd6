//! Replay tests: recorded histories of real batches (scripts/record-histories.sh) must replay
//! against the current workflow code without a nondeterminism error. A failure here means a
//! change would break batches that are running now.

use std::path::Path;

use casebatch_workflows::{BatchWorkflow, RuntimeBreaker};
use temporalio_client::WorkflowHistory;
use temporalio_sdk::workflow_replayer::{WorkflowReplayer, WorkflowReplayerOptions};

#[path = "replay/legacy_query.rs"]
mod legacy_query;

fn replayer() -> WorkflowReplayer {
    let options = WorkflowReplayerOptions::new()
        .register_workflow::<BatchWorkflow>()
        .expect("BatchWorkflow registers")
        .register_workflow::<RuntimeBreaker>()
        .expect("RuntimeBreaker registers")
        .build();
    WorkflowReplayer::new(options).expect("replayer")
}

fn history(name: &str) -> WorkflowHistory {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/histories")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    WorkflowHistory::from_json(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every recorded history, sorted by name. Histories recorded by older code stay: batches
/// started then may still be running when a new worker picks them up.
fn recorded() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/histories");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn recorded_histories_replay_deterministically() {
    let names = recorded();
    // The local-activity pipeline's seven, the regular-activity pipeline's set with the
    // crashed runs, and its runs that upsert search attributes (scripts/record-histories.sh).
    assert!(names.len() >= 7, "histories missing: {names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("activities-searchattr-")),
        "no history with search-attribute upserts: {names:?}"
    );
    // A batch that spilled over a dead runtime and that runtime's breaker, a batch whose
    // dispatches an open circuit skipped, a superseded batch, and a batch whose stragglers
    // raced duplicates (tail speculation).
    for needed in [
        "activities-failover.json",
        "breaker-failover.json",
        "activities-breaker-skipped.json",
        "activities-superseded.json",
        "activities-speculated.json",
    ] {
        assert!(names.iter().any(|n| n == needed), "{needed} missing");
    }
    let replayer = replayer();
    for name in &names {
        replayer
            .replay_workflow(history(name))
            .await
            .unwrap_or_else(|e| panic!("{name} no longer replays: {e}"));
    }
}
