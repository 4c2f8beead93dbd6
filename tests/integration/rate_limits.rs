//! A harness rate limited by the API it calls: each attempt waits what it asked for
//! (`retry_after_s`) before the next, on a cap of its own (not `max_retries`), and the batch
//! narrows while its cases are limited and widens back as they finish. A pace
//! (`defaults.rate`) spaces starts, and a shared `rate_key` spaces two batches' together.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{Sandbox, assert_exit, wait_child};

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

/// A manifest of `n` quick cases paced at `per_minute`, optionally on a shared `key`; each
/// harness appends the wall-clock millisecond it started to `starts.log`.
fn paced_manifest(sb: &Sandbox, batch_id: &str, n: usize, per_minute: u32, key: &str) -> PathBuf {
    let tasks: String = (1..=n).map(|i| format!("  - task_id: p{i}\n")).collect();
    let key = if key.is_empty() {
        String::new()
    } else {
        format!(", rate_key: {key}")
    };
    sb.write(
        &format!("{batch_id}.yaml"),
        &format!(
            r#"batch_id: {batch_id}
defaults:
  runtime: local-process
  concurrency: {n}
  pass_env: [SANDBOX]
  rate: {{starts_per_minute: {per_minute}{key}}}
  harness: 'date +%s%3N >> "$SANDBOX/starts.log"'
tasks:
{tasks}"#
        ),
    )
}

/// The harnesses' own start times, sorted, and the smallest gap between two of them.
fn starts(sb: &Sandbox) -> (Vec<u64>, u64) {
    let mut at: Vec<u64> = sb
        .read("starts.log")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    at.sort_unstable();
    let gap = at.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(u64::MAX);
    (at, gap)
}

#[test]
fn sixty_starts_a_minute_spread_twenty_cases_a_second_apart() {
    let sb = Sandbox::engine();
    let manifest = paced_manifest(&sb, "paced", 20, 60, "");
    assert_exit(&sb.run_batch(&manifest), 0);
    let (at, gap) = starts(&sb);
    assert_eq!(at.len(), 20, "every case ran once");
    // A second apart, give or take the dispatch of one start (tens of milliseconds).
    assert!(gap >= 850, "two starts {gap} ms apart: {at:?}");
    assert!(at[19] - at[0] >= 18_500, "{at:?}");
    let status = sb.status("paced");
    let steps = status["status"]["timeline"].to_string();
    assert!(steps.contains("paced: 60 starts/min"), "{status:#}");
}

#[test]
fn two_batches_sharing_a_rate_key_stay_within_it_together() {
    let sb = Sandbox::engine();
    let (a, b) = (
        paced_manifest(&sb, "team-a", 6, 60, "shared-api"),
        paced_manifest(&sb, "team-b", 6, 60, "shared-api"),
    );
    let mut runners = [sb.spawn_batch(&a, "a.log"), sb.spawn_batch(&b, "b.log")];
    for r in &mut runners {
        assert_eq!(wait_child(r, Duration::from_secs(120)), 0);
    }
    let (at, gap) = starts(&sb);
    assert_eq!(at.len(), 12, "every case of both ran once");
    // Each alone would start at 60 a minute: together they would start two at a time.
    assert!(gap >= 850, "two starts {gap} ms apart: {at:?}");
    assert!(at[11] - at[0] >= 10_000, "{at:?}");
    for batch in ["team-a", "team-b"] {
        let steps = sb.status(batch)["status"]["timeline"].to_string();
        assert!(steps.contains("shared by rate key shared-api"), "{steps}");
        assert!(!steps.contains("did not answer"), "paced alone: {steps}");
    }
}
