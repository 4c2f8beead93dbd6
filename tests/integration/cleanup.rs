//! Cleanup confirmation: every process of an attempt, including descendants that detached
//! from its process group, must be gone before `cleanup_confirmed: true`.

use crate::support::*;

#[test]
fn cleanup_finds_and_kills_a_detached_grandchild() {
    let sb = Sandbox::engine();
    // The harness leaves a grandchild behind in a new session (setsid + background), as a
    // careless browser launcher would, then exits successfully.
    let manifest = sb.write(
        "leak.yaml",
        r#"batch_id: leak
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  harness: 'setsid sh -c "sleep 400; echo survived >> $SANDBOX/survivor.log" > /dev/null 2>&1 & echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: leaky
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 0);
    let receipt = sb.json(
        &sb.bundle("leak")
            .join("cases/leaky/attempts/1/cleanup.json"),
    );
    assert_eq!(receipt["cleanup_confirmed"], true, "{receipt:#}");
    assert!(
        !receipt["killed"].as_array().unwrap().is_empty(),
        "the detached grandchild was found by its marker and killed: {receipt:#}"
    );
    // Killed is not yet gone: the orphan is reaped by init a moment later.
    wait_until(
        std::time::Duration::from_secs(10),
        "the grandchild is gone",
        || no_process_matches("sleep 400"),
    );
    let result = sb.case_result("leak", "leaky");
    assert_eq!(
        result["state"], "succeeded",
        "cleanup is reported apart from the outcome"
    );
}
