//! A batch is found and read with Temporal's own tools: `temporal workflow list --query` by
//! the `Casebatch*` search attributes (kept up to date while the batch runs and set to its
//! outcome at the end), the memo says who started what, and activity summaries name the case.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const MANIFEST: &str = r#"batch_id: visible
defaults:
  concurrency: 3
  max_retries: 0
  pass_env: [SANDBOX]
  runtime: local-process
  harness: 'echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: gated
    harness: 'while [ ! -e "$SANDBOX/go" ]; do sleep 0.05; done; echo "{}" > "$CASEBATCH_RESULT"'
  - task_id: ok
  - task_id: broken
    harness: 'exit 3'
"#;

fn temporal(address: &str, args: &[&str]) -> Output {
    let bin = std::env::var("CASEBATCH_TEMPORAL_BIN").unwrap_or_else(|_| "temporal".into());
    std::process::Command::new(bin)
        .args(args)
        .args(["--address", address])
        .output()
        .expect("temporal CLI runs")
}

/// `temporal workflow list --query Q -o json`; `None` while the server cannot answer.
fn list(address: &str, query: &str) -> Option<Vec<Value>> {
    let o = temporal(
        address,
        &["workflow", "list", "--query", query, "-o", "json"],
    );
    if !o.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout);
    if text.trim().is_empty() {
        return Some(Vec::new());
    }
    serde_json::from_str(&text).ok()
}

/// Waits until exactly one workflow matches the query and returns it.
fn find_one(address: &str, query: &str) -> Value {
    let mut found = Vec::new();
    wait_until(Duration::from_secs(60), query, || {
        found = list(address, query).unwrap_or_default();
        found.len() == 1
    });
    found.remove(0)
}

/// Standard base64, as the CLI prints payload bytes in JSON.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[test]
fn visibility_search_attributes_memo_and_summaries_find_and_describe_a_batch() {
    let sb = Sandbox::engine();
    let manifest = sb.write("visible.yaml", MANIFEST);
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    let address = engine_address(&sb.out());

    // While it runs: found by id, outcome `running`, the finished cases counted.
    let running = find_one(
        &address,
        "CasebatchBatchId='visible' AND CasebatchOutcome='running' \
         AND CasebatchSucceeded=1 AND CasebatchFailed=1",
    );
    assert_eq!(running["execution"]["workflowId"], "casebatch-visible");

    std::fs::write(sb.path("go"), "").unwrap();
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        4,
        "a failed case = not all succeeded"
    );

    // The runner stopped the engine it started; a worker brings it back on the same database
    // (registering the attributes again must not trip over the existing ones).
    let out = sb.out().display().to_string();
    let mut worker = sb.spawn(&["worker", "--output-dir", &out], "worker.log");
    let address = engine_address(&sb.out());
    let done = find_one(
        &address,
        "CasebatchBatchId='visible' AND CasebatchOutcome='failed_cases_present' \
         AND CasebatchSucceeded=2 AND CasebatchFailed=1",
    );
    assert_eq!(
        done["status"], "WORKFLOW_EXECUTION_STATUS_COMPLETED",
        "{done:#}"
    );
    // The same batch id finds nothing under another outcome.
    assert_eq!(
        list(
            &address,
            "CasebatchBatchId='visible' AND CasebatchOutcome='running'"
        ),
        Some(Vec::new())
    );

    // The memo: who started what, from where.
    let memo = &done["memo"]["fields"];
    let plan = sb.json(&sb.bundle("visible").join("batch_plan.json"));
    assert_eq!(memo["fingerprint"], plan["fingerprint"], "{memo:#}");
    assert_eq!(memo["cases"], 3, "{memo:#}");
    assert_eq!(
        memo["bundle_dir"].as_str(),
        Some(sb.bundle("visible").to_str().unwrap()),
        "{memo:#}"
    );
    assert!(
        memo["manifest"]
            .as_str()
            .is_some_and(|m| m.ends_with("visible.yaml")),
        "{memo:#}"
    );
    let owner = memo["owner"].as_str().unwrap_or_default();
    let (user, host) = owner.split_once('@').unwrap_or_default();
    assert!(!user.is_empty() && !host.is_empty(), "user@host: {owner:?}");

    // Activity summaries name the case, attempt and stage (these jobs are short: each
    // `start` sees its job end and closes the attempt, no `settle` or `cleanup` follows).
    let history = temporal(
        &address,
        &["workflow", "show", "-w", "casebatch-visible", "-o", "json"],
    );
    assert_exit(&history, 0);
    let history = String::from_utf8_lossy(&history.stdout);
    for summary in [
        "\"case #0 · attempt 1 · start\"",
        "\"case #2 · attempt 1 · start\"",
        "\"case #1 · attempt 1 · start\"",
    ] {
        assert!(
            history.contains(&base64(summary.as_bytes())),
            "summary {summary} in the history"
        );
    }
    for short in [
        "\"case #1 · attempt 1 · settle\"",
        "\"case #2 · attempt 1 · settle\"",
    ] {
        assert!(
            !history.contains(&base64(short.as_bytes())),
            "{short}: a job that ends at once needs no settle"
        );
    }
    assert_eq!(stop(&mut worker), 0, "the worker stops cleanly on SIGTERM");
}
