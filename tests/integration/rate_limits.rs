//! A harness rate limited by the API it calls: each attempt waits what it asked for
//! (`retry_after_s`) before the next, on a cap of its own (not `max_retries`), and the batch
//! narrows while its cases are limited and widens back as they finish.

use std::collections::BTreeMap;

use crate::support::{Sandbox, assert_exit};

#[test]
fn a_rate_limited_case_waits_as_asked_without_spending_retries_and_the_width_recovers() {
    let sb = Sandbox::engine();
    let tasks: String = (1..=6).map(|i| format!("  - task_id: r{i}\n")).collect();
    // The first two attempts of every case are refused for their rate, asking for 2 s.
    let manifest = sb.write(
        "ratelimited.yaml",
        &format!(
            r#"batch_id: ratelimited
defaults:
  runtime: local-process
  concurrency: 3
  max_retries: 0
  harness: 'if [ "$CASEBATCH_ATTEMPT" -le 2 ]; then echo "{{\"failure\": {{\"class\": \"infra\", \"code\": \"RATE_LIMITED\", \"retryable\": true, \"retry_after_s\": 2}}}}" > "$CASEBATCH_RESULT"; exit 1; fi; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks:
{tasks}"#
        ),
    );
    assert_exit(&sb.run_batch(&manifest), 0);

    let attempts = sb.json(&sb.bundle("ratelimited").join("batch_attempts.json"));
    let mut by_case: BTreeMap<String, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for a in attempts["attempts"].as_array().unwrap() {
        let s = &a["summary"];
        let at = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}: {a:#}"));
        by_case
            .entry(a["case_id"].as_str().unwrap().to_string())
            .or_default()
            .push((at("attempt"), at("started_at_ms"), at("ended_at_ms")));
    }
    assert_eq!(by_case.len(), 6, "{attempts:#}");
    for (case, mut runs) in by_case {
        runs.sort();
        assert_eq!(runs.len(), 3, "{case}: {runs:?}");
        for pair in runs.windows(2) {
            let ((_, _, ended), (n, started, _)) = (pair[0], pair[1]);
            assert!(
                started >= ended + 2_000,
                "{case}: attempt {n} started {} ms after the last one settled, not after the 2 s asked for",
                started.saturating_sub(ended)
            );
        }
    }

    let status = sb.status("ratelimited");
    let s = &status["status"];
    assert_eq!(s["counts"]["succeeded"], 6, "{status:#}");
    assert_eq!(s["counters"]["rate_limited"], 12, "{status:#}");
    assert_eq!(s["counters"]["retries"], 0, "{status:#}");
    let steps: Vec<&str> = s["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["message"].as_str())
        .collect();
    let cut = steps
        .iter()
        .position(|m| m.starts_with("rate limited: width 3 → 1"));
    let eased = steps
        .iter()
        .rposition(|m| *m == "rate limits eased: width back to 3");
    assert!(
        matches!((cut, eased), (Some(c), Some(e)) if c < e),
        "the width narrows, then recovers: {steps:#?}"
    );
}
