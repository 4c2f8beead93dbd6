//! Replay tests: recorded histories of real batches (scripts/record-histories.sh) must replay
//! against the current workflow code without a nondeterminism error. A failure here means a
//! change would break batches that are running now.

use std::path::Path;

use casebatch_workflows::BatchWorkflow;
use temporalio_client::WorkflowHistory;
use temporalio_sdk::workflow_replayer::{WorkflowReplayer, WorkflowReplayerOptions};

fn replayer() -> WorkflowReplayer {
    let options = WorkflowReplayerOptions::new()
        .register_workflow::<BatchWorkflow>()
        .expect("BatchWorkflow registers")
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

#[tokio::test]
async fn recorded_histories_replay_deterministically() {
    let names = [
        "completed-local.json",
        "retries.json",
        "drained.json",
        "resumed.json",
        "cancelled.json",
        "continued-as-new.json",
        "oom-auto-boost.json",
    ];
    let replayer = replayer();
    for name in names {
        replayer
            .replay_workflow(history(name))
            .await
            .unwrap_or_else(|e| panic!("{name} no longer replays: {e}"));
    }
}
