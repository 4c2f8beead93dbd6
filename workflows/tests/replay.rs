//! Replay tests: recorded histories of real batches (scripts/record-histories.sh) must replay
//! against the current workflow code without a nondeterminism error. A failure here means a
//! change would break batches that are running now.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use casebatch_workflows::{BatchWorkflow, RatePacer, RuntimeBreaker, RuntimeSlots};
use temporalio_client::WorkflowHistory;
use temporalio_common::protos::temporal::api::enums::v1::EventType;
use temporalio_common::protos::temporal::api::history::v1::History;
use temporalio_sdk::workflow_replayer::{WorkflowReplayer, WorkflowReplayerOptions};

#[path = "replay/legacy_query.rs"]
mod legacy_query;

/// Every file `tests/histories` must hold, and nothing else may be there: a history that goes
/// missing is a running batch nobody checks any more, so removing one is a failure, not a
/// smaller test. Histories recorded by older code stay (batches started then may still be
/// running when a new worker picks them up); a new recording is listed here in its commit.
const EXPECTED: &[&str] = &[
    // The regular-activity pipeline (scripts/record-histories.sh), crashed runs included.
    "activities-agent-crashed-runner.json",
    "activities-breaker-skipped.json",
    // A budget spent (the run ends `budget_exhausted`), then resumed with a larger one.
    "activities-budget-exhausted.json",
    "activities-budget-resumed.json",
    "activities-cancelled.json",
    "activities-closed-crashed-runner.json",
    "activities-closed-on-settle.json",
    "activities-completed-local.json",
    "activities-continued-as-new.json",
    "activities-crashed-runner.json",
    "activities-drained.json",
    "activities-enveloped.json",
    "activities-failover.json",
    // The closing write of the batch files as a regular activity (`finalize-as-activity`).
    "activities-finalized.json",
    "activities-oom-auto-boost.json",
    "activities-operated.json",
    // Paces: a batch's own (timers), and one shared by a rate key (`reserve_start`).
    "activities-paced-shared.json",
    "activities-paced.json",
    "activities-outage-probes-spill.json",
    "activities-outage-reattached.json",
    "activities-outage-stranded.json",
    "activities-prepared-ahead.json",
    "activities-prepared-cancelled.json",
    "activities-prepared-drained.json",
    // A batch held back by its agent's `queue_limit`, then admitted.
    "activities-queue-limit-held.json",
    // Rate-limited attempts waiting on timers (the `rate-limit-rules` patch).
    "activities-rate-limited.json",
    "activities-resumed.json",
    "activities-retries.json",
    // Its runs that upsert the Casebatch* search attributes.
    "activities-searchattr-continued-as-new.json",
    "activities-searchattr-paused-drained.json",
    "activities-searchattr-resumed.json",
    "activities-searchattr-retries.json",
    "activities-searchattr-throttled.json",
    // Two users' batches sharing an agent's slots (`RuntimeSlots`): asks, grants, returns;
    // before the batch stopped signalling its returns (the `slot-returns-by-activity` patch)
    // and after it.
    "activities-shared-slots-returned.json",
    "activities-shared-slots.json",
    "activities-speculated.json",
    // `start` settles short jobs (the `start-settles-short-jobs` patch).
    "activities-start-settled-crashed-runner.json",
    "activities-start-settled.json",
    "activities-superseded.json",
    // A runtime's breaker workflow (the dead runtime of `activities-failover`).
    "breaker-failover.json",
    // The shared pace of `activities-paced-shared` (a `RatePacer` workflow).
    "pacer-shared.json",
    // The agent's slots of `activities-shared-slots` (a `RuntimeSlots` workflow; the file
    // kept from before the patch, whose slots take a return from either side alike).
    "slots-shared.json",
    // The old local-activity pipeline: can no longer be recorded, never delete them.
    "cancelled.json",
    "completed-local.json",
    "continued-as-new.json",
    "drained.json",
    "oom-auto-boost.json",
    "resumed.json",
    "retries.json",
];

fn histories_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/histories")
}

fn replayer() -> WorkflowReplayer {
    let options = WorkflowReplayerOptions::new()
        .register_workflow::<BatchWorkflow>()
        .expect("BatchWorkflow registers")
        .register_workflow::<RuntimeBreaker>()
        .expect("RuntimeBreaker registers")
        .register_workflow::<RatePacer>()
        .expect("RatePacer registers")
        .register_workflow::<RuntimeSlots>()
        .expect("RuntimeSlots registers")
        .build();
    WorkflowReplayer::new(options).expect("replayer")
}

/// One file's history, or why it is not one: unreadable, not the SDK's JSON, or no workflow
/// start (an emptied file would otherwise replay as nothing and pass).
fn load(path: &Path) -> Result<WorkflowHistory, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot be read: {e}"))?;
    let history: History = serde_json::from_slice(&bytes)
        .map_err(|e| format!("is not a history in the SDK's JSON format: {e}"))?;
    match history.events.first().map(|e| e.event_type()) {
        Some(EventType::WorkflowExecutionStarted) => Ok(history.into()),
        Some(other) => Err(format!(
            "does not start with the workflow's start: {other:?}"
        )),
        None => Err("holds no events".into()),
    }
}

/// Replays every file in `dir` and checks the folder against `expected`, one line per failure
/// (`name: what`), so one run names every history that broke, not only the first.
async fn failures(dir: &Path, expected: &[&str]) -> Vec<String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return vec![format!("{}: cannot be listed: {e}", dir.display())],
    };
    let mut failures = Vec::new();
    let mut present = Vec::new();
    for entry in entries {
        match entry.map(|e| e.file_name().into_string()) {
            Ok(Ok(name)) => present.push(name),
            Ok(Err(name)) => failures.push(format!("{name:?}: a file name that is not UTF-8")),
            Err(e) => failures.push(format!("{}: an entry cannot be read: {e}", dir.display())),
        }
    }
    present.sort();
    for name in expected.iter().filter(|n| !present.iter().any(|p| p == *n)) {
        failures.push(format!(
            "{name}: missing from {} (listed in EXPECTED, workflows/tests/replay.rs)",
            dir.display()
        ));
    }
    let replayer = replayer();
    for name in &present {
        if !expected.contains(&name.as_str()) {
            failures.push(format!(
                "{name}: not listed in EXPECTED (workflows/tests/replay.rs): list a new \
                 recording there, or move a file that is not a history out of the folder"
            ));
        }
        // Unlisted files are replayed too: every file in the folder is checked.
        match load(&dir.join(name)) {
            Ok(history) => {
                if let Err(e) = replayer.replay_workflow(history).await {
                    failures.push(format!("{name}: no longer replays: {e}"));
                }
            }
            Err(why) => failures.push(format!("{name}: {why}")),
        }
    }
    failures
}

#[tokio::test]
async fn recorded_histories_replay_deterministically() {
    let failures = failures(&histories_dir(), EXPECTED).await;
    assert!(
        failures.is_empty(),
        "{} failure(s) in {}:\n{}",
        failures.len(),
        histories_dir().display(),
        failures.join("\n")
    );
}

/// The check itself, on a damaged copy of the folder: each kind of damage is reported, all in
/// one run, and the intact history beside them is not.
#[tokio::test]
async fn a_damaged_history_folder_reports_every_failure() {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replay-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let intact = std::fs::read(histories_dir().join("activities-drained.json")).unwrap();
    std::fs::write(dir.join("intact.json"), &intact).unwrap();
    std::fs::write(dir.join("truncated.json"), &intact[..intact.len() / 2]).unwrap();
    std::fs::write(dir.join("empty.json"), br#"{"events":[]}"#).unwrap();
    std::fs::create_dir(dir.join("directory.json")).unwrap();
    // The same batch, but its first stage activity under another name: the workflow code
    // schedules something the history does not hold.
    let text = String::from_utf8(intact.clone()).unwrap();
    let first = text
        .find(r#""activity_type":{"name":""#)
        .expect("an activity in the history");
    let mut altered = text.clone();
    altered.insert_str(first + r#""activity_type":{"name":""#.len(), "renamed-");
    std::fs::write(dir.join("altered.json"), altered).unwrap();
    std::fs::write(dir.join("unlisted.json"), &intact).unwrap();
    let expected = [
        "intact.json",
        "truncated.json",
        "empty.json",
        "directory.json",
        "altered.json",
        "gone.json",
    ];

    let failures = failures(&dir, &expected).await;
    std::fs::remove_dir_all(&dir).unwrap();

    let mut report = String::new();
    for f in &failures {
        writeln!(report, "{f}").unwrap();
    }
    for (name, what) in [
        ("gone.json", "missing from"),
        ("unlisted.json", "not listed in EXPECTED"),
        ("truncated.json", "not a history"),
        ("empty.json", "holds no events"),
        ("directory.json", "cannot be read"),
        ("altered.json", "no longer replays"),
    ] {
        assert!(
            failures
                .iter()
                .any(|f| f.starts_with(&format!("{name}: ")) && f.contains(what)),
            "{name} not reported as \"{what}\":\n{report}"
        );
    }
    assert!(
        !failures.iter().any(|f| f.starts_with("intact.json")),
        "an intact history reported:\n{report}"
    );
    assert_eq!(failures.len(), 6, "one failure per damaged file:\n{report}");
}
