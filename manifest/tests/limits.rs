//! Values that cannot run are refused by validation, not found out at run time: durations
//! and sizes past their documented maximum, control characters in ids, runspecs that are not
//! regular files, documents nested too deep or too large, and bad environment settings.

mod common;

use std::time::{Duration, Instant};

use casebatch_manifest::limits::{MAX_MANIFEST_BYTES, MAX_NESTING_DEPTH, MAX_TIMEOUT_SECONDS};
use common::*;

#[test]
fn timeouts_past_seven_days_are_refused() {
    // u64::MAX overflowed a duration in the workflow; 2^63 was refused by the server for ever.
    for huge in ["18446744073709551615", "9223372036854775808", "604801"] {
        let err = refuse(
            "m.yaml",
            &format!(
                "batch_id: t\ndefaults:\n  harness: x\n  timeout_seconds: {huge}\ntasks:\n  - task_id: a\n    timeout_seconds: {huge}\n"
            ),
        );
        let p = says(
            &err,
            "defaults.timeout_seconds",
            "more than the maximum of 604800",
        );
        assert_eq!(p.line, Some(4));
        assert!(p.fix.contains("between 1 and 604800"), "{err}");
        let p = says(&err, "tasks[0].timeout_seconds", "604800");
        assert_eq!(p.line, Some(7));
    }
    let plan = accept(
        "m.yaml",
        &format!(
            "batch_id: t\ndefaults:\n  harness: x\n  timeout_seconds: {MAX_TIMEOUT_SECONDS}\ntasks:\n  - task_id: a\n"
        ),
    );
    assert_eq!(plan.cases[0].timeout_seconds, MAX_TIMEOUT_SECONDS);
}

#[test]
fn timeouts_in_jsonl_and_runspecs_are_bounded_too() {
    let err = refuse(
        "d.jsonl",
        "{\"id\": \"a\", \"timeout_seconds\": 18446744073709551615}\n",
    );
    says(&err, "timeout_seconds", "more than the maximum");
}

#[test]
fn sizes_and_other_durations_are_bounded() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: x\n  resources: {memory_mb: 18446744073709551615, cpu: 100000}\n  sandbox: {provider: local, lifetime: 18446744073709551615}\n  fake: {duration_ms: 18446744073709551615, infra_failures_first: 4294967295}\ntasks:\n  - task_id: a\n",
    );
    says(&err, "defaults.resources.memory_mb", "maximum of 1048576");
    says(&err, "defaults.resources.cpu", "up to 1024");
    says(&err, "defaults.sandbox.lifetime", "maximum of 604800");
    says(&err, "defaults.fake.duration_ms", "maximum of 604800000");
    says(
        &err,
        "defaults.fake.infra_failures_first",
        "maximum of 1000",
    );
}

#[test]
fn control_characters_in_ids_are_refused() {
    for (escaped, shown) in [("a\\0b", "\\0"), ("a\\nb", "\\n"), ("a\\tb", "\\t")] {
        let err = refuse(
            "m.yaml",
            &with_tasks(&format!("  - task_id: \"{escaped}\"\n")),
        );
        let p = says(&err, "tasks[0].task_id", "control character");
        assert!(p.message.contains(shown), "{err}");
        assert_eq!(p.line, Some(5));
    }
    let err = refuse("d.jsonl", "{\"id\": \"a\\u0000b\", \"harness\": \"x\"}\n");
    let p = says(&err, "id", "control character");
    assert_eq!(p.line, Some(1));
    let err = refuse(
        "m.yaml",
        "batch_id: \"t\\0\"\ndefaults:\n  harness: x\ntasks:\n  - task_id: a\n",
    );
    says(&err, "batch_id", "control character");
}

#[test]
fn a_nul_in_a_command_is_refused() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: \"echo \\0\"\n  evaluator: [\"x\", \"a\\0\"]\ntasks:\n  - task_id: a\n",
    );
    says(&err, "defaults.harness", "NUL");
    says(&err, "defaults.evaluator", "NUL");
}

#[test]
fn a_fifo_runspec_is_refused_without_being_opened() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("case.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let manifest = write(
        dir.path(),
        "batch.yaml",
        "schema_version: batch_v1\ndefaults:\n  harness: x\nbatch:\n  cases:\n    - label: a\n      runspec: case.yaml\n",
    );
    // Opening a FIFO with no writer blocks: validate on a thread, and fail instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(load(&manifest));
    });
    let result = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("validation of a FIFO runspec hung (it opened the FIFO)");
    let err = result.expect_err("a FIFO runspec was accepted");
    let p = says(&err, "batch.cases[0].runspec", "not a regular file");
    assert!(p.message.contains("case.yaml"), "{err}");
    assert_eq!(p.line, Some(7));
}

#[test]
fn deep_nesting_is_refused_before_parsing_and_fast() {
    let n = 100_000;
    let flow = format!(
        "batch_id: t\ndefaults:\n  harness: x\ntasks:\n  - task_id: a\n    inputs:\n      deep: {}{}\n",
        "[".repeat(n),
        "]".repeat(n)
    );
    let block = format!("batch_id: t\ntasks:\n{}x\n", "- ".repeat(n));
    let json = format!(
        "{{\"batch_id\": \"t\", \"tasks\": {}{}}}",
        "[".repeat(n),
        "]".repeat(n)
    );
    for (name, text, line) in [
        ("flow.yaml", flow, 7),
        ("block.yaml", block, 3),
        ("deep.json", json, 1),
    ] {
        let start = Instant::now();
        let err = refuse(name, &text);
        let took = start.elapsed();
        let p = says(
            &err,
            "(syntax)",
            &format!("more than {MAX_NESTING_DEPTH} levels"),
        );
        assert_eq!(p.line, Some(line), "{name}: {err}");
        assert!(p.fix.contains("flatten"), "{err}");
        assert!(took < Duration::from_millis(500), "{name} took {took:?}");
    }
    // The depth a real manifest uses passes.
    accept(
        "ok.yaml",
        "batch_id: t\ndefaults:\n  harness: x\ntasks:\n  - task_id: a\n    inputs:\n      k: {a: [[{b: [1]}]]}\n",
    );
}

#[test]
fn an_oversize_manifest_is_refused_from_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.yaml");
    // Sparse: costs no disk and is never read.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(MAX_MANIFEST_BYTES + 1).unwrap();
    let start = Instant::now();
    let err = load(&path).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(1));
    let p = says(
        &err,
        "(file)",
        "more than the limit of 67108864 bytes (64 MiB)",
    );
    assert!(p.fix.contains("split"), "{err}");
    assert!(err.to_string().contains("huge.yaml"), "{err}");
}

#[test]
fn an_oversize_runspec_is_refused_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::File::create(dir.path().join("case.yaml"))
        .unwrap()
        .set_len(MAX_MANIFEST_BYTES + 1)
        .unwrap();
    let manifest = write(
        dir.path(),
        "batch.yaml",
        "schema_version: batch_v1\ndefaults:\n  harness: x\nbatch:\n  cases:\n    - label: a\n      runspec: case.yaml\n",
    );
    let err = load(&manifest).unwrap_err();
    says(&err, "batch.cases[0].runspec", "64 MiB");
}

#[test]
fn environment_names_are_checked() {
    let err = refuse(
        "m.yaml",
        "\
batch_id: t
defaults:
  harness: x
  env: {GOOD: '1', 2BAD: x, CASEBATCH_RESULT: /tmp/x, NUM: 3, NULVAL: \"a\\0\"}
  pass_env: [OK_NAME, 'A-B', CASEBATCH_INPUT, GOOD, OK_NAME]
tasks:
  - task_id: a
    env:
      casebatch_x: y
",
    );
    says(
        &err,
        "defaults.env.2BAD",
        "not a valid environment variable name",
    );
    says(&err, "defaults.env.CASEBATCH_RESULT", "harness contract");
    says(&err, "defaults.env.NUM", "expected a string");
    says(&err, "defaults.env.NULVAL", "NUL");
    says(
        &err,
        "defaults.pass_env[1]",
        "not a valid environment variable name",
    );
    says(&err, "defaults.pass_env[2]", "harness contract");
    says(
        &err,
        "defaults.pass_env[3]",
        "both in `env` and in `pass_env`",
    );
    says(&err, "defaults.pass_env[4]", "listed twice");
    let p = says(&err, "tasks[0].env.casebatch_x", "harness contract");
    assert_eq!(p.line, Some(9));
    assert_eq!(err.problems.len(), 9, "{err}");
}

#[test]
fn task_environment_merges_over_the_defaults_by_name() {
    let plan = accept(
        "m.yaml",
        "\
batch_id: t
defaults:
  harness: x
  env: {A: from-defaults, B: from-defaults}
  pass_env: [P, Q]
tasks:
  - task_id: plain
  - task_id: own
    env: {B: from-task, Q: literal-now}
    pass_env: [A, R]
",
    );
    let plain = &plan.cases[0];
    assert_eq!(plain.env.len(), 2);
    assert_eq!(plain.pass_env, ["P", "Q"]);
    let own = &plan.cases[1];
    assert_eq!(
        own.env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["B=from-task", "Q=literal-now"]
    );
    assert_eq!(own.pass_env, ["P", "A", "R"]);
    // Different environments are different task lists.
    assert_ne!(
        plan.fingerprint,
        accept(
            "m.yaml",
            "batch_id: t\ndefaults:\n  harness: x\ntasks:\n  - task_id: plain\n  - task_id: own\n"
        )
        .fingerprint
    );
}

#[test]
fn a_batch_past_the_most_cases_its_state_can_carry_is_refused_at_its_first_extra_line() {
    let max = casebatch_proto::MAX_BATCH_CASES as usize;
    let mut text = String::with_capacity((max + 1) * 32);
    for i in 0..=max {
        text.push_str(&format!("{{\"id\": \"c{i}\", \"harness\": \"x\"}}\n"));
    }
    let err = refuse("d.jsonl", &text);
    let p = says(
        &err,
        "(document)",
        "too many cases: a batch holds at most 1000000",
    );
    assert_eq!(p.line, Some(max + 1), "{err}");
    assert!(p.fix.contains("several batches"), "{err}");
    assert_eq!(err.problems.len(), 1, "{err}");
}
