//! The index over real bundles on disk: a plan and a `batch_attempts.json` per batch, written
//! the way the bundle writer lays them out.

use std::path::{Path, PathBuf};

use casebatch_bundle::Bundle;
use casebatch_history::{HistoryIndex, MedianRow, Refreshed, Weights, harness_identity};
use casebatch_manifest::model::{CommandSpec, Plan};
use casebatch_manifest::{LoadOptions, load_plan};
use casebatch_proto::{Failure, FailureCode, Stage};
use serde_json::{Value, json};

/// One attempt of a case, finished and successful unless changed.
#[derive(Clone)]
struct Att {
    case: String,
    n: u32,
    runtime: Option<String>,
    ms: Option<u64>,
    actor: &'static str,
    failure: Option<Failure>,
    loser: bool,
}

fn att(case: &str, n: u32, runtime: &str, ms: u64) -> Att {
    Att {
        case: case.into(),
        n,
        runtime: Some(runtime.into()),
        ms: Some(ms),
        actor: "finished",
        failure: None,
        loser: false,
    }
}

impl Att {
    fn actor(mut self, actor: &'static str) -> Self {
        self.actor = actor;
        self
    }
    fn failed(mut self, f: Failure) -> Self {
        self.failure = Some(f);
        self
    }
    fn loser(mut self) -> Self {
        self.loser = true;
        self
    }
    /// As written before timings were kept.
    fn untimed(mut self) -> Self {
        self.ms = None;
        self
    }
    /// On the built-in runtime: no runtimes-table name.
    fn builtin(mut self) -> Self {
        self.runtime = None;
        self
    }

    fn json(&self) -> Value {
        let mut summary = json!({
            "attempt": self.n,
            "actor": self.actor,
            "exit_code": 0,
            "evaluation_configured": false,
            "verdict": null,
            "failure": self.failure,
            "cleanup_confirmed": true,
        });
        if let Some(ms) = self.ms {
            summary["started_at_ms"] = json!(1_700_000_000_000u64);
            summary["ended_at_ms"] = json!(1_700_000_000_000u64 + ms);
        }
        if self.loser {
            summary["speculative_loser"] = json!(true);
        }
        let mut record = json!({
            "schema_version": "casebatch_v1",
            "case_id": self.case,
            "summary": summary,
            "cleanup_confirmed": true,
            "will_retry": false,
            "runtime": if self.runtime.is_some() { "agent" } else { "local-process" },
        });
        if let Some(name) = &self.runtime {
            record["runtime_name"] = json!(name);
        }
        record
    }
}

/// A plan from a real manifest, to copy cases from (so no field of the plan is guessed).
fn template() -> Plan {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batch.yaml");
    // The harness must exist and run: validation checks a program path before planning.
    let program = dir.path().join("run.sh");
    std::fs::write(&program, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        &path,
        "batch_id: template\ndefaults:\n  runtime: local-process\n  harness: ./run.sh\ntasks:\n  - task_id: t\n    query: q\n",
    )
    .unwrap();
    load_plan(&path, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn harness(name: &str) -> CommandSpec {
    CommandSpec::Shell(name.into())
}

/// Writes `<out>/<batch>/batch_plan.json`: one case per case id of `attempts`, every case
/// running `harness_cmd` with `HARNESS_VERSION=version` when given.
fn write_plan(out: &Path, batch: &str, harness_cmd: &str, version: Option<&str>, attempts: &[Att]) {
    let mut plan = template();
    let case = plan.cases[0].clone();
    plan.batch_id = batch.into();
    plan.cases.clear();
    for (i, a) in attempts.iter().enumerate() {
        if plan.cases.iter().any(|c| c.case_id == a.case) {
            continue;
        }
        let mut c = case.clone();
        c.index = i as u32;
        c.case_id = a.case.clone();
        c.case_dir = a.case.clone();
        c.harness = Some(harness(harness_cmd));
        if let Some(v) = version {
            c.env.insert("HARNESS_VERSION".into(), v.into());
        }
        plan.cases.push(c);
    }
    let bundle = Bundle::new(out, batch);
    std::fs::create_dir_all(bundle.root()).unwrap();
    std::fs::write(bundle.plan(), serde_json::to_vec_pretty(&plan).unwrap()).unwrap();
}

fn write_attempts(out: &Path, batch: &str, attempts: &[Att]) {
    let file = json!({
        "schema_version": "casebatch_v1",
        "batch_id": batch,
        "attempts": attempts.iter().map(Att::json).collect::<Vec<_>>(),
    });
    let path = Bundle::new(out, batch).attempts();
    std::fs::write(path, serde_json::to_vec_pretty(&file).unwrap()).unwrap();
}

/// A finished bundle of `harness_cmd` (no version).
fn bundle(out: &Path, batch: &str, harness_cmd: &str, attempts: &[Att]) {
    versioned(out, batch, harness_cmd, None, attempts);
}

fn versioned(out: &Path, batch: &str, harness_cmd: &str, version: Option<&str>, attempts: &[Att]) {
    write_plan(out, batch, harness_cmd, version, attempts);
    write_attempts(out, batch, attempts);
}

fn index(out: &Path) -> HistoryIndex {
    HistoryIndex::open(&HistoryIndex::default_path(out)).unwrap()
}

fn refreshed(out: &Path) -> (HistoryIndex, Refreshed) {
    let mut idx = index(out);
    let r = idx.refresh(out).unwrap();
    (idx, r)
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn by(w: &Weights) -> Vec<(&str, u32)> {
    w.by_runtime.iter().map(|(n, w)| (n.as_str(), *w)).collect()
}

fn id(harness_cmd: &str) -> String {
    harness_identity(Some(&harness(harness_cmd)))
}

/// fast at 1000 ms, slow at 3000 ms (medians), in one batch.
fn fast_and_slow(out: &Path, batch: &str, unit: u64) {
    bundle(
        out,
        batch,
        "./run.sh",
        &[
            att("c1", 1, "fast", unit * 9 / 10),
            att("c2", 1, "fast", unit),
            att("c3", 1, "fast", unit * 11 / 10),
            att("c4", 1, "slow", 3 * unit),
            att("c5", 1, "slow", 3 * unit),
        ],
    );
}

#[test]
fn weights_of_a_three_times_slower_runtime() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "b1", 1000);
    let (idx, r) = refreshed(out.path());
    assert_eq!((r.indexed, r.attempts), (1, 5), "{r:?}");
    let w = idx.weights(&names(&["fast", "slow"])).unwrap();
    assert_eq!(by(&w), [("fast", 200), ("slow", 67)]);
    assert_eq!((w.batches_used, w.from_history), (1, true));
}

#[test]
fn a_batch_on_one_of_the_runtimes_does_not_count() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "b1", 1000);
    // Very fast on `fast` alone, and on a runtime not in the list.
    bundle(
        out.path(),
        "b2",
        "./run.sh",
        &[att("c1", 1, "fast", 1), att("c2", 1, "elsewhere", 50_000)],
    );
    // Slow on `slow`, but its `fast` attempt did not run to the end: not counted.
    bundle(
        out.path(),
        "b3",
        "./run.sh",
        &[
            att("c1", 1, "slow", 100_000),
            att("c2", 1, "fast", 1).actor("failed"),
        ],
    );
    let (idx, _) = refreshed(out.path());
    let w = idx.weights(&names(&["fast", "slow"])).unwrap();
    assert_eq!(by(&w), [("fast", 200), ("slow", 67)]);
    assert_eq!(w.batches_used, 1);
}

#[test]
fn batches_of_any_size_with_the_same_ratio_agree() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "short", 10);
    fast_and_slow(out.path(), "long", 100_000);
    // A newer harness version, much slower overall: the ratio is all that counts.
    versioned(
        out.path(),
        "v2",
        "./run-v2.sh",
        Some("2.0"),
        &[att("c1", 1, "slow", 900_000), att("c2", 1, "fast", 300_000)],
    );
    let (idx, _) = refreshed(out.path());
    let w = idx.weights(&names(&["slow", "fast"])).unwrap();
    assert_eq!(by(&w), [("slow", 67), ("fast", 200)]);
    assert_eq!(w.batches_used, 3);
}

#[test]
fn a_runtime_without_history_weighs_the_average() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "b1", 1000);
    let (idx, _) = refreshed(out.path());
    let w = idx
        .weights(&names(&["fast", "new", "slow", "fast"]))
        .unwrap();
    // (200 + 67) / 2 = 133.5
    assert_eq!(by(&w), [("fast", 200), ("new", 134), ("slow", 67)]);
    assert!(w.from_history);
}

#[test]
fn without_history_every_runtime_weighs_100() {
    let out = tempfile::tempdir().unwrap();
    let (idx, r) = refreshed(out.path());
    assert_eq!(r, Refreshed::default());
    let uniform = Weights {
        by_runtime: vec![("fast".into(), 100), ("slow".into(), 100)],
        batches_used: 0,
        from_history: false,
    };
    assert_eq!(idx.weights(&names(&["fast", "slow"])).unwrap(), uniform);

    // History on other runtimes says nothing of these.
    fast_and_slow(out.path(), "b1", 1000);
    let (idx, _) = refreshed(out.path());
    let w = idx.weights(&names(&["fast", "other"])).unwrap();
    assert_eq!(by(&w), [("fast", 100), ("other", 100)]);
    assert!(!w.from_history);
}

#[test]
fn medians_count_only_whole_timed_attempts() {
    let out = tempfile::tempdir().unwrap();
    let agent_fail = Failure::agent("the evaluator said fail");
    let infra = Failure::infra(Stage::Await, FailureCode::Timeout, "timed out");
    versioned(
        out.path(),
        "b1",
        "./a.sh",
        Some("1.0"),
        &[
            att("c1", 1, "fast", 100),
            att("c2", 1, "fast", 300),
            // Finished, judged a failure: counts, but not as a success.
            att("c3", 1, "fast", 200).failed(agent_fail),
            // None of these says how long the harness takes.
            att("c4", 1, "fast", 5).loser(),
            att("c5", 1, "fast", 6).actor("cancelled"),
            att("c6", 1, "fast", 7).actor("failed").failed(infra),
            att("c6", 2, "fast", 99_999).untimed(),
            // The built-in runtime goes by its kind.
            att("c7", 1, "-", 400).builtin(),
        ],
    );
    versioned(
        out.path(),
        "b2",
        "./a.sh",
        Some("1.1"),
        &[att("c1", 1, "fast", 1000)],
    );
    bundle(out.path(), "b3", "./b.sh", &[att("c1", 1, "slow", 50)]);
    let (idx, r) = refreshed(out.path());
    assert_eq!((r.indexed, r.attempts), (3, 10), "{r:?}");

    let row = |h: &str, v: Option<&str>, rt: &str, n, median, ok| MedianRow {
        harness: id(h),
        harness_version: v.map(String::from),
        runtime: rt.into(),
        attempts: n,
        median_ms: median,
        succeeded: ok,
    };
    let mut expected = vec![
        // 100, 200, 300, 1000: the mean of the middle two.
        row("./a.sh", Some("1.1"), "fast", 4, 250, 3),
        row("./a.sh", Some("1.0"), "local-process", 1, 400, 1),
        row("./b.sh", None, "slow", 1, 50, 1),
    ];
    expected.sort_by(|a, b| (&a.harness, &a.runtime).cmp(&(&b.harness, &b.runtime)));
    assert_eq!(idx.medians().unwrap(), expected);
}

#[test]
fn harness_median_spans_runtimes() {
    let out = tempfile::tempdir().unwrap();
    bundle(
        out.path(),
        "b1",
        "./a.sh",
        &[
            att("c1", 1, "fast", 100),
            att("c2", 1, "slow", 300),
            att("c3", 1, "slow", 200),
            att("c4", 1, "slow", 1).loser(),
            att("c5", 1, "slow", 2).actor("cancelled"),
        ],
    );
    bundle(out.path(), "b2", "./b.sh", &[att("c1", 1, "fast", 7)]);
    let (idx, _) = refreshed(out.path());
    assert_eq!(idx.harness_median_ms(&id("./a.sh")).unwrap(), Some(200));
    assert_eq!(idx.harness_median_ms(&id("./b.sh")).unwrap(), Some(7));
    assert_eq!(idx.harness_median_ms(&id("./c.sh")).unwrap(), None);
    assert_eq!(idx.harness_median_ms("none").unwrap(), None);
}

#[test]
fn refresh_is_incremental() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "b1", 1000);
    fast_and_slow(out.path(), "b2", 1000);
    let (mut idx, r) = refreshed(out.path());
    assert_eq!((r.indexed, r.unchanged, r.attempts), (2, 0, 10), "{r:?}");

    let r = idx.refresh(out.path()).unwrap();
    assert_eq!(
        r,
        Refreshed {
            unchanged: 2,
            ..Refreshed::default()
        }
    );

    // b1 is reported again with one more attempt: only b1 is read again.
    let more = [
        att("c1", 1, "fast", 1000),
        att("c2", 1, "slow", 3000),
        att("c2", 2, "slow", 3000),
    ];
    write_plan(out.path(), "b1", "./run.sh", None, &more);
    write_attempts(out.path(), "b1", &more);
    let r = idx.refresh(out.path()).unwrap();
    assert_eq!((r.indexed, r.unchanged, r.attempts), (1, 1, 3), "{r:?}");
    let total: u64 = idx.medians().unwrap().iter().map(|m| m.attempts).sum();
    assert_eq!(total, 8, "b1's old rows are replaced, not added to");

    // Another process (a second handle on the same file) sees it all as indexed.
    let r = index(out.path()).refresh(out.path()).unwrap();
    assert_eq!((r.indexed, r.unchanged), (0, 2));
}

#[test]
fn a_removed_bundle_is_forgotten() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "b1", 1000);
    bundle(
        out.path(),
        "b2",
        "./other.sh",
        &[att("c1", 1, "fast", 5), att("c2", 1, "slow", 5)],
    );
    let (mut idx, _) = refreshed(out.path());
    assert_eq!(
        idx.weights(&names(&["fast", "slow"])).unwrap().batches_used,
        2
    );

    std::fs::remove_dir_all(out.path().join("b2")).unwrap();
    let r = idx.refresh(out.path()).unwrap();
    assert_eq!((r.indexed, r.unchanged, r.forgotten), (0, 1, 1), "{r:?}");
    assert_eq!(idx.harness_median_ms(&id("./other.sh")).unwrap(), None);
    assert_eq!(
        idx.weights(&names(&["fast", "slow"])).unwrap().batches_used,
        1
    );
    assert_eq!(idx.refresh(out.path()).unwrap().forgotten, 0);
}

#[test]
fn bundles_of_another_output_dir_are_kept() {
    let root = tempfile::tempdir().unwrap();
    let (one, two) = (root.path().join("one"), root.path().join("two"));
    fast_and_slow(&one, "b1", 1000);
    fast_and_slow(&two, "b2", 1000);
    let mut idx = HistoryIndex::open(&root.path().join("shared.sqlite")).unwrap();
    assert_eq!(idx.refresh(&one).unwrap().indexed, 1);
    assert_eq!(idx.refresh(&two).unwrap().indexed, 1);
    let r = idx.refresh(&one).unwrap();
    assert_eq!((r.unchanged, r.forgotten), (1, 0), "{r:?}");
    assert_eq!(
        idx.weights(&names(&["fast", "slow"])).unwrap().batches_used,
        2
    );
    // A relative spelling of the same directory is the same directory.
    let relative = one.strip_prefix("/").unwrap();
    let relative: PathBuf =
        std::iter::repeat_n("..", std::env::current_dir().unwrap().components().count())
            .collect::<PathBuf>()
            .join(relative);
    let r = idx.refresh(&relative).unwrap();
    assert_eq!((r.indexed, r.unchanged, r.forgotten), (0, 1, 0), "{r:?}");
}

#[test]
fn unreadable_bundles_are_skipped_and_the_rest_indexed() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "good", 1000);
    fast_and_slow(out.path(), "corrupt", 1000);
    let (mut idx, r) = refreshed(out.path());
    assert_eq!(r.indexed, 2);

    let corrupt = Bundle::new(out.path(), "corrupt").attempts();
    std::fs::write(&corrupt, "{\"attempts\": [tru").unwrap();
    // Not a bundle at all; a bundle still running; a stray file; hidden state.
    std::fs::create_dir(out.path().join("notes")).unwrap();
    write_plan(
        out.path(),
        "running",
        "./run.sh",
        None,
        &[att("c1", 1, "fast", 1)],
    );
    std::fs::write(out.path().join("README"), "hi").unwrap();
    std::fs::create_dir(out.path().join(".casebatch-engine")).unwrap();

    let r = idx.refresh(out.path()).unwrap();
    assert_eq!((r.indexed, r.unchanged, r.forgotten), (0, 1, 1), "{r:?}");
    assert_eq!(r.skipped.len(), 2, "{r:?}");
    let corrupt = std::fs::canonicalize(&corrupt).unwrap();
    assert!(
        r.skipped[0].starts_with(&format!("{}: ", corrupt.display())),
        "{r:?}"
    );
    assert!(r.skipped[1].contains("notes: not a batch bundle"), "{r:?}");
    assert_eq!(
        idx.weights(&names(&["fast", "slow"])).unwrap().batches_used,
        1
    );

    // A plan that does not parse is as bad.
    fast_and_slow(out.path(), "corrupt", 1000);
    std::fs::write(Bundle::new(out.path(), "corrupt").plan(), "[]").unwrap();
    let r = idx.refresh(out.path()).unwrap();
    assert!(
        r.skipped[0].contains("batch_plan.json: not valid JSON"),
        "{r:?}"
    );
}

#[test]
fn rebuild_reads_everything_again() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "b1", 1000);
    fast_and_slow(out.path(), "b2", 1000);
    let (mut idx, _) = refreshed(out.path());
    let r = idx.rebuild(out.path()).unwrap();
    assert_eq!((r.indexed, r.unchanged, r.attempts), (2, 0, 10), "{r:?}");
}

#[test]
fn an_index_of_another_schema_version_is_rebuilt() {
    let out = tempfile::tempdir().unwrap();
    fast_and_slow(out.path(), "b1", 1000);
    let path = HistoryIndex::default_path(out.path());
    assert_eq!(path, out.path().join(".casebatch-history.sqlite"));
    drop(refreshed(out.path()));

    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 999).unwrap();
    }
    let mut idx = index(out.path());
    assert_eq!(idx.medians().unwrap(), []);
    let r = idx.refresh(out.path()).unwrap();
    assert_eq!((r.indexed, r.unchanged), (1, 0), "{r:?}");
    drop(idx);

    // Not a database at all: made again.
    std::fs::write(&path, vec![b'x'; 8192]).unwrap();
    let mut idx = index(out.path());
    assert_eq!(idx.refresh(out.path()).unwrap().indexed, 1);
}

#[test]
fn open_creates_the_directory() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("a/b/history.sqlite");
    let idx = HistoryIndex::open(&path).unwrap();
    assert!(path.is_file());
    assert_eq!(idx.medians().unwrap(), []);
    assert_eq!(
        idx.weights(&[]).unwrap(),
        Weights {
            by_runtime: vec![],
            batches_used: 0,
            from_history: false
        }
    );
}

#[test]
fn two_processes_refresh_at_once() {
    let out = tempfile::tempdir().unwrap();
    for b in 0..8 {
        fast_and_slow(out.path(), &format!("b{b}"), 1000);
    }
    let dir = out.path().to_path_buf();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut idx = index(&dir);
                idx.refresh(&dir).unwrap()
            })
        })
        .collect();
    let rs: Vec<Refreshed> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(rs.iter().all(|r| r.indexed + r.unchanged == 8), "{rs:?}");
    let w = index(&dir).weights(&names(&["fast", "slow"])).unwrap();
    assert_eq!(
        (w.batches_used, by(&w)),
        (8, vec![("fast", 200), ("slow", 67)])
    );
}
