//! Metrics and probes: a worker replica serving `/metrics`, `/healthz` and `/readyz` runs a
//! real batch; its counters move while the batch runs and match the report at the end, and
//! its histograms follow Prometheus's conventions, read by a standard text parser. Its port is
//! the kernel's pick, found the way the image's HEALTHCHECK finds it. A replica whose engine
//! does not answer yet is alive (`/healthz`) and not ready (`/readyz`) until it does.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_parse::{Scrape, Value};

use crate::support::*;

#[test]
fn a_worker_s_metrics_move_with_a_batch_and_match_its_report() {
    let sb = Sandbox::engine();
    let out = sb.out().display().to_string();
    let manifest = sb.write(
        "metered.yaml",
        r#"batch_id: metered
defaults:
  concurrency: 4
  pass_env: [SANDBOX]
  runtime: local-process
  harness: 'case "$CASEBATCH_CASE_ID" in crash) exit 3;; gated) while [ ! -e "$SANDBOX/go" ]; do sleep 0.05; done;; esac; echo "{}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: ok-1
  - task_id: ok-2
  - task_id: crash
  - task_id: gated
"#,
    );
    let mut runner = sb.spawn_batch_without_worker(&manifest, "run.log");
    let addr_file = sb.path("metrics.addr").display().to_string();
    let health = |extra: &[&str]| {
        let mut args = vec!["health", "--address-file", &addr_file];
        args.extend(extra);
        sb.run(&args)
    };
    assert_exit(&health(&[]), 1);
    let mut worker = sb.spawn(
        &[
            "worker",
            "--output-dir",
            &out,
            "--metrics-bind",
            "127.0.0.1:0",
            "--metrics-address-file",
            &addr_file,
        ],
        "worker.log",
    );
    wait_until(Duration::from_secs(60), "the worker is ready", || {
        health(&["--ready"]).status.code() == Some(0)
    });
    let port: u16 = std::fs::read_to_string(&addr_file)
        .unwrap()
        .trim()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(stdout(&health(&[])).starts_with("healthy: "));
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(port, "/nothing").map(|r| r.0), Some(404));

    // Three cases end while the gated one runs: the counters show them as they happen.
    let finished = "casebatch_cases_finished_total";
    let mut text = String::new();
    wait_until(Duration::from_secs(120), "three cases counted", || {
        text = http_get(port, "/metrics").map(|r| r.1).unwrap_or_default();
        metric(&text, finished, &[]) >= 3.0
    });
    assert_eq!(
        metric(&text, finished, &[("outcome", "succeeded")]),
        2.0,
        "{text}"
    );
    let harness_failures = [("outcome", "failed"), ("failure_class", "harness")];
    assert_eq!(metric(&text, finished, &harness_failures), 1.0, "{text}");
    assert_eq!(metric(&text, "casebatch_jobs_awaited", &[]), 1.0, "{text}");
    // The SDK's own worker metrics are on the same page.
    assert!(
        text.lines()
            .any(|l| l.starts_with("temporal_") && l.contains("task_queue=\"casebatch\"")),
        "no SDK worker metric: {text}"
    );

    // The gated case outlasts its `start`'s watch: a `settle` takes its job over.
    let address = engine_address(&sb.out());
    wait_until(
        Duration::from_secs(60),
        "the gated case's settle runs",
        || activities_running(&address, "metered", "settle") == 1,
    );
    sb.write("go", "");
    assert_eq!(
        wait_child(&mut runner, Duration::from_secs(120)),
        4,
        "a batch with a failed case exits 4: {}",
        tail(&sb.path("run.log"), 20)
    );
    let text = http_get(port, "/metrics").unwrap().1;
    let summary = sb.json(&sb.bundle("metered").join("batch_summary.json"));
    for outcome in ["succeeded", "failed", "cancelled"] {
        assert_eq!(
            metric(&text, finished, &[("outcome", outcome)]),
            summary["counts"][outcome].as_f64().unwrap_or(0.0),
            "{outcome}: {summary:#}\n{text}"
        );
    }
    assert_eq!(
        metric(&text, "casebatch_attempts_total", &[]),
        summary["attempts_total"].as_f64().unwrap(),
        "{text}"
    );
    assert_eq!(metric(&text, "casebatch_jobs_awaited", &[]), 0.0, "{text}");
    let settles = metric(
        &text,
        "casebatch_stage_duration_seconds_count",
        &[("stage", "settle")],
    );
    // The three short cases settled in their `start`; only the gated one, past the watch,
    // needed a `settle`.
    assert_eq!(settles, 1.0, "one settle, for the long case: {text}");
    conventional_histograms(&text, summary["attempts_total"].as_f64().unwrap());
    // The batch's count of the activities it scheduled is what the worker ran.
    let actions = &summary["temporal_actions"];
    assert_eq!(
        metric(
            &text,
            "casebatch_temporal_actions_total",
            &[("kind", "activities")]
        ),
        actions["activities"].as_f64().unwrap(),
        "{summary:#}\n{text}"
    );
    assert!(actions["runs"].as_u64() == Some(1), "{actions}");
    assert_eq!(stop(&mut worker), 0, "the worker stops cleanly on SIGTERM");
    let gone = health(&[]);
    assert_exit(&gone, 1);
    assert!(
        stdout(&gone).starts_with("unhealthy: "),
        "{}",
        stdout(&gone)
    );
}

#[test]
fn metrics_off_loopback_must_be_asked_for() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    let o = sb.run(&[
        "worker",
        "--output-dir",
        &out,
        "--metrics-bind",
        "0.0.0.0:9464",
    ]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("--metrics-public"), "{}", stderr(&o));
}

/// Heartbeats are Temporal actions: they go out at the batch's `heartbeat_every_seconds`, a
/// stage shorter than half a cadence sends none, and the batch counts what its stages sent.
#[test]
fn heartbeats_follow_the_batch_s_cadence_and_every_action_is_counted() {
    let sb = Sandbox::engine();
    let batch = |id: &str, every: &str, secs: u32| {
        format!(
            r#"batch_id: {id}
defaults:
  concurrency: 2
{every}  runtime: local-process
  harness: 'sleep {secs}; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks:
  - task_id: a
  - task_id: b
"#
        )
    };
    let summary_of = |id: &str| {
        let manifest = sb.write(
            &format!("{id}.yaml"),
            &if id == "eager" {
                batch(id, "  heartbeat_every_seconds: 1\n", 3)
            } else {
                batch(id, "", 1)
            },
        );
        let o = sb.run_batch(&manifest);
        assert_exit(&o, 0);
        let summary = sb.json(&sb.bundle(id).join("batch_summary.json"));
        summary["temporal_actions"].clone()
    };

    let eager = summary_of("eager");
    // Each 3 s wait heartbeats about every second (the first after half a second).
    let beats = eager["heartbeats"].as_u64().unwrap();
    assert!((3..=10).contains(&beats), "two 3 s cases at 1 s: {eager}");

    // The default cadence (4 s) sends none for a 1 s case: what it costs is its activities,
    // the run's start and its markers. Its `start` sees it end and settles and closes it:
    // one activity, one engine round trip. The batch adds one: its closing write.
    let quiet = summary_of("quiet");
    assert_eq!(quiet["heartbeats"], 0, "{quiet}");
    assert_eq!(quiet["runs"], 1, "{quiet}");
    assert_eq!(
        quiet["activities"], 3,
        "a short case costs one activity, its start; the batch's finalize one more: {quiet}"
    );

    // The closing write is a regular activity, the batch's last: as a local activity it held
    // the workflow task, and every `status` query behind it, for as long as it read the
    // cases' records.
    let history = sb.path("quiet-history.json");
    assert_exit(
        &sb.op_with("history", "quiet", &["--out", history.to_str().unwrap()]),
        0,
    );
    let scheduled: Vec<String> = sb.json(&history)["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            let a = &e["attributes"]["ActivityTaskScheduledEventAttributes"];
            a["activity_type"]["name"].as_str().map(String::from)
        })
        .collect();
    assert_eq!(
        scheduled.last().map(String::as_str),
        Some("casebatch.finalize"),
        "{scheduled:?}"
    );

    // `report` rebuilds the summary from the case files and keeps the workflow's count.
    let report = sb.op("report", "quiet");
    assert_exit(&report, 0);
    assert!(
        stdout(&report).contains("temporal actions "),
        "{}",
        stdout(&report)
    );
    let rebuilt = sb.json(&sb.bundle("quiet").join("batch_summary.json"));
    assert_eq!(rebuilt["temporal_actions"], quiet);
}

/// The buckets of every duration histogram casebatch configures, in seconds: 50 ms to 4 h.
const DURATION_BUCKETS: [f64; 18] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
    3600.0, 7200.0, 14400.0,
];

/// Every histogram of a scrape (parsed by `prometheus-parse`) carries its unit in its name;
/// casebatch's stage and attempt durations and the SDK's activity execution latency have
/// buckets up to hours; the attempts' histogram counts every attempt.
fn conventional_histograms(text: &str, attempts: f64) {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("a valid scrape");
    // Per histogram: its bucket bounds (the same for every label set) and its total count.
    let mut histograms: BTreeMap<String, (Vec<f64>, f64)> = BTreeMap::new();
    for sample in &scrape.samples {
        if let Value::Histogram(buckets) = &sample.value {
            let bounds: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
            let count = buckets.last().map_or(0.0, |b| b.count);
            let entry = histograms
                .entry(sample.metric.clone())
                .or_insert((bounds.clone(), 0.0));
            assert_eq!(entry.0, bounds, "{}: one set of buckets", sample.metric);
            entry.1 += count;
        }
    }
    assert!(!histograms.is_empty(), "no histogram parsed from:\n{text}");
    for name in histograms.keys() {
        assert!(
            name.ends_with("_seconds"),
            "histogram {name} has no unit suffix: {:?}",
            histograms.keys()
        );
    }
    let mut expected = DURATION_BUCKETS.to_vec();
    expected.push(f64::INFINITY);
    for name in [
        "casebatch_stage_duration_seconds",
        "casebatch_attempt_duration_seconds",
        "temporal_activity_execution_latency_seconds",
    ] {
        let (bounds, _) = histograms
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", histograms.keys()));
        assert_eq!(bounds, &expected, "{name}'s buckets");
    }
    assert_eq!(
        histograms["casebatch_attempt_duration_seconds"].1, attempts,
        "one observation per attempt"
    );
}

#[test]
fn a_worker_waiting_for_its_engine_is_alive_not_ready_and_serves_once_it_answers() {
    use nix::sys::signal::{Signal, kill};
    let sb = Sandbox::engine();
    let out = sb.out().display().to_string();
    // A "cluster" that does not answer: stopped (SIGSTOP) with its port held, so that no other
    // process can take the port while the worker waits (as one picked free and left unbound
    // for 30 s could be).
    let cluster = Cluster::start(&sb);
    let server = nix::unistd::Pid::from_raw(cluster.pid() as i32);
    kill(server, Signal::SIGSTOP).expect("SIGSTOP the cluster");
    let addr_file = sb.path("metrics.addr");
    let mut worker = sb.spawn(
        &[
            "worker",
            "--output-dir",
            &out,
            "--address",
            &cluster.address,
            "--metrics-bind",
            "127.0.0.1:0",
            "--metrics-address-file",
            addr_file.to_str().unwrap(),
        ],
        "worker.log",
    );
    wait_until(
        Duration::from_secs(30),
        "the listener names its address",
        || addr_file.exists(),
    );
    let listener: u16 = std::fs::read_to_string(&addr_file)
        .unwrap()
        .trim()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert_eq!(
        http_get(listener, "/healthz").map(|r| r.0),
        Some(200),
        "alive while it waits"
    );
    assert_eq!(http_get(listener, "/readyz").map(|r| r.0), Some(503));
    // Past the first connection's bound (30 s) it says so and keeps waiting, still alive.
    wait_until(
        Duration::from_secs(90),
        "the worker says it still waits",
        || sb.read("worker.log").contains("still waiting for it"),
    );
    assert!(
        worker.try_wait().unwrap().is_none(),
        "{}",
        sb.read("worker.log")
    );
    assert_eq!(http_get(listener, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(listener, "/readyz").map(|r| r.0), Some(503));

    kill(server, Signal::SIGCONT).expect("SIGCONT the cluster");
    wait_until(Duration::from_secs(60), "the worker is ready", || {
        http_get(listener, "/readyz").map(|r| r.0) == Some(200)
    });
    assert!(
        sb.read("worker.log").contains("worker polling task queues"),
        "{}",
        sb.read("worker.log")
    );
    assert_eq!(stop(&mut worker), 0, "the worker stops cleanly on SIGTERM");
}
