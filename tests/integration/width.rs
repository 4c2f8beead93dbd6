//! A batch runs as wide as its `concurrency` says: the worker's own limits must not narrow it.

use std::time::Duration;

use crate::support::*;

/// 150 cases at 150 in flight, each waiting for a gate the test opens only once every case's
/// `start` runs at once, watching its job. The SDK's default of 100 activity slots per worker
/// held the other 50 in the server's queue until the first 100 had watched theirs out.
#[test]
fn every_case_of_a_batch_wider_than_the_sdks_default_slots_starts_at_once() {
    const CASES: usize = 150;
    let sb = Sandbox::engine();
    let harness = r#"echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/started.log"; while [ ! -e "$SANDBOX/gate" ]; do sleep 1; done; echo '{}' > "$CASEBATCH_RESULT""#;
    let mut m = format!(
        "batch_id: wide\ndefaults:\n  concurrency: {CASES}\n  runtime: local-process\n  pass_env: [SANDBOX]\n  harness: '{}'\ntasks:\n",
        harness.replace('\'', "''")
    );
    for i in 0..CASES {
        m.push_str(&format!("  - {{task_id: c{i}}}\n"));
    }
    let manifest = sb.write("wide.yaml", &m);
    let mut runner = sb.spawn_batch(&manifest, "run.log");
    let address = engine_address(&sb.out());
    wait_until(Duration::from_secs(120), "every case's start runs", || {
        activities_running(&address, "wide", "start") == CASES
    });
    wait_until(Duration::from_secs(60), "every case's job runs", || {
        sb.lines("started.log") == CASES
    });
    sb.write("gate", "");
    let code = wait_child(&mut runner, Duration::from_secs(120));
    assert_eq!(code, 0, "{}", sb.read("run.log"));
    assert_eq!(sb.lines("started.log"), CASES, "one job per case");
    let summary = sb.json(&sb.bundle("wide").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], CASES, "{summary:#}");
}
