//! Every kind of broken manifest is refused, and the error names the problem, its field,
//! its line where known, and a fix.

mod common;

use casebatch_manifest::LoadOptions;
use common::*;

#[test]
fn duplicate_task_ids_name_both_lines() {
    let err = refuse(
        "m.yaml",
        &with_tasks("  - task_id: a\n  - task_id: b\n  - task_id: a\n"),
    );
    let p = says(&err, "tasks[2].task_id", "duplicate case id \"a\"");
    assert_eq!(p.line, Some(7));
    assert!(p.message.contains("line 5"), "{err}");
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn duplicate_ids_in_json_and_jsonl() {
    let err = refuse(
        "m.json",
        r#"{
  "batch_id": "t",
  "defaults": {"runtime": "fake"},
  "tasks": [
    {"task_id": "x"},
    {"task_id": "x"}
  ]
}"#,
    );
    let p = says(&err, "tasks[1].task_id", "first declared at line 5");
    assert_eq!(p.line, Some(6));

    let err = refuse("data.jsonl", "{\"id\": \"q1\"}\n\n{\"id\": \"q1\"}\n");
    // JSONL has no manifest defaults: the missing harness is one problem, the duplicate another.
    let p = says(&err, "id", "first declared at line 1");
    assert_eq!(p.line, Some(3));
}

#[test]
fn unknown_field_is_named_with_its_nearest_match() {
    let err = refuse("m.yaml", &with_tasks("  - task_id: a\n    qurey: hello\n"));
    let p = says(&err, "tasks[0].qurey", "unknown field `qurey`");
    assert_eq!(p.line, Some(6));
    assert!(p.fix.contains("`query`"), "{err}");

    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: x\n  paralelism: 2\ntasks:\n  - task_id: a\n",
    );
    let p = says(&err, "defaults.paralelism", "unknown field");
    assert_eq!(p.line, Some(4));
    assert!(p.fix.contains("allowed here: concurrency"), "{err}");

    let err = refuse("m.yaml", "batch_id: t\ntask:\n  - task_id: a\n");
    let p = says(&err, "task", "unknown field");
    assert!(p.fix.contains("`tasks`"), "{err}");
}

#[test]
fn missing_and_empty_task_id() {
    let err = refuse(
        "m.yaml",
        &with_tasks("  - task_id: a\n  - query: no id here\n  - task_id: \"\"\n"),
    );
    let p = says(&err, "tasks[1]", "missing required field `task_id`");
    assert_eq!(p.line, Some(6));
    let p = says(&err, "tasks[2].task_id", "empty");
    assert_eq!(p.line, Some(7));
}

#[test]
fn wrong_types_are_reported_with_what_was_expected() {
    let err = refuse(
        "m.yaml",
        &with_tasks("  - task_id: 12\n    max_steps: ten\n    sandbox: docker\n"),
    );
    let p = says(
        &err,
        "tasks[0].task_id",
        "expected a string, found number 12",
    );
    assert!(p.fix.contains("quote"), "{err}");
    says(&err, "tasks[0].max_steps", "expected a whole number");
    says(&err, "tasks[0].sandbox", "expected a mapping");
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  runtime: docker\ntasks:\n  - task_id: a\n",
    );
    let p = says(&err, "defaults.runtime", "unknown runtime `docker`");
    assert_eq!(p.line, Some(3));
}

#[test]
fn malformed_yaml_has_a_line() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\ntasks:\n  - task_id: a\n   query: [unclosed\n",
    );
    let p = says(&err, "(syntax)", "malformed YAML");
    assert!(p.line.is_some_and(|l| l >= 3), "{err}");
}

#[test]
fn malformed_json_and_jsonl_have_lines() {
    let err = refuse("m.json", "{\n  \"batch_id\": \"t\",\n  \"tasks\": [\n}\n");
    let p = says(&err, "(syntax)", "malformed JSON");
    assert_eq!(p.line, Some(4));

    let err = refuse(
        "d.jsonl",
        "{\"id\": \"a\"}\n{\"id\": \"b\"\n{\"id\": \"c\"}\n",
    );
    let p = says(&err, "(syntax)", "malformed JSON");
    assert_eq!(p.line, Some(2));
}

#[test]
fn bytes_that_are_not_utf8_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.yaml");
    std::fs::write(&path, b"batch_id: t\ntasks:\n  - task_id: \xff\xfe\n").unwrap();
    let err = load(&path).unwrap_err();
    let p = says(&err, "(file)", "not UTF-8");
    assert_eq!(p.line, Some(3));
}

#[test]
fn concurrency_out_of_range() {
    for bad in [0, 513] {
        let err = refuse(
            "m.yaml",
            &format!(
                "batch_id: t\ndefaults:\n  harness: x\n  concurrency: {bad}\ntasks:\n  - task_id: a\n"
            ),
        );
        let p = says(&err, "defaults.concurrency", "outside 1..=512");
        assert_eq!(p.line, Some(4));
    }
}

#[test]
fn max_retries_out_of_range() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: x\n  max_retries: 6\ntasks:\n  - task_id: a\n",
    );
    let p = says(&err, "defaults.max_retries", "outside 0..=5");
    assert_eq!(p.line, Some(4));
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: x\n  max_retries: -1\ntasks:\n  - task_id: a\n",
    );
    says(&err, "defaults.max_retries", "expected a whole number");
}

#[test]
fn flags_are_range_checked_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "m.yaml", &with_tasks("  - task_id: a\n"));
    let mut opts = LoadOptions::default();
    opts.overrides.concurrency = Some(1000);
    let err = casebatch_manifest::load_plan(&path, &opts).unwrap_err();
    says(&err, "flags.concurrency", "outside 1..=512");
}

#[test]
fn empty_task_list() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: x\ntasks: []\n",
    );
    let p = says(&err, "tasks", "empty");
    assert_eq!(p.line, Some(4));
    let err = refuse("m.yaml", "batch_id: t\n");
    says(&err, "(document)", "missing required field `tasks`");
    let err = refuse("d.jsonl", "\n\n");
    says(&err, "(file)", "no records");
}

#[test]
fn zero_timeout_and_bad_batch_ids() {
    let err = refuse(
        "m.yaml",
        "batch_id: ../escape\ndefaults:\n  harness: x\n  timeout_seconds: 0\ntasks:\n  - task_id: a\n    timeout_seconds: 0\n",
    );
    says(&err, "batch_id", "not safe in a directory name");
    says(&err, "defaults.timeout_seconds", "timeout_seconds is 0");
    says(&err, "tasks[0].timeout_seconds", "timeout_seconds is 0");
    let err = refuse(
        "m.yaml",
        "batch_id: .hidden\ndefaults:\n  harness: x\ntasks:\n  - task_id: a\n",
    );
    says(&err, "batch_id", "starts with '.'");
    let err = refuse(
        "m.yaml",
        "batch_id: ''\ndefaults:\n  harness: x\ntasks:\n  - task_id: a\n",
    );
    says(&err, "batch_id", "empty");
    // JSONL without --batch-id: the file stem must be a safe id.
    let err = refuse("my data.jsonl", "{\"id\": \"a\"}\n");
    says(&err, "batch_id", "not safe");
}

#[test]
fn local_process_without_a_harness() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  runtime: local-process\ntasks:\n  - task_id: a\n  - task_id: b\n",
    );
    // Reported once, at the defaults, not once per task.
    let p = says(
        &err,
        "defaults.harness",
        "runtime local-process needs a harness command",
    );
    assert_eq!(p.line, Some(2));
    assert_eq!(err.problems.len(), 1, "{err}");

    let err = refuse("m.yaml", "batch_id: t\ntasks:\n  - task_id: a\n");
    says(
        &err,
        "defaults.harness",
        "no harness command and no runtime",
    );
}

#[test]
fn empty_commands_and_summary_paths() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: []\n  evaluator: '  '\ntasks:\n  - task_id: a\nsummary:\n  fields: ['', scores..x]\n",
    );
    says(&err, "defaults.harness", "empty");
    says(&err, "defaults.evaluator", "empty");
    let p = says(&err, "summary.fields[0]", "empty");
    assert_eq!(p.line, Some(8));
    says(&err, "summary.fields[1]", "empty segment");
}

#[test]
fn sandbox_without_provider_is_incomplete() {
    let err = refuse(
        "m.yaml",
        &with_tasks("  - task_id: a\n    sandbox:\n      template: only-a-template\n"),
    );
    let p = says(
        &err,
        "tasks[0].sandbox",
        "missing required field `provider`",
    );
    assert!(p.fix.contains("replaces the default whole"), "{err}");
}

/// Only `local` and `container` are provided: another provider would be copied into the plan
/// and ignored, the harness running on the host. Every manifest shape is refused alike.
#[test]
fn a_sandbox_provider_no_runtime_provides_is_refused_in_every_shape() {
    let unsupported = |err: &casebatch_manifest::ManifestError, field: &str, name: &str| {
        let p = says(
            err,
            field,
            &format!("sandbox provider `{name}` is not supported"),
        );
        assert!(
            p.message.contains("accepted: `local`, `container`"),
            "{err}"
        );
        // A defaults file's or a runspec's fix names the field as written in that file.
        assert!(
            p.fix.contains("sandbox.provider to `local`, `container`"),
            "{err}"
        );
        p
    };

    // YAML: the defaults' sandbox and a task's own, each at its line.
    let err = refuse(
        "m.yaml",
        "\
batch_id: t
defaults:
  harness: ./run.sh
  sandbox: {provider: docker, template: web}
tasks:
  - task_id: a
  - task_id: b
    sandbox:
      provider: e2b
",
    );
    assert_eq!(
        unsupported(&err, "defaults.sandbox.provider", "docker").line,
        Some(4)
    );
    assert_eq!(
        unsupported(&err, "tasks[1].sandbox.provider", "e2b").line,
        Some(9)
    );
    assert_eq!(err.problems.len(), 2, "{err}");

    // JSON.
    let err = refuse(
        "m.json",
        r#"{
  "batch_id": "t",
  "defaults": {"harness": "./run.sh"},
  "tasks": [
    {"task_id": "a", "sandbox": {"provider": "docker"}}
  ]
}"#,
    );
    assert_eq!(
        unsupported(&err, "tasks[0].sandbox.provider", "docker").line,
        Some(5)
    );

    // JSONL records, and the defaults file that gives a JSONL manifest its settings.
    let dir = tempfile::tempdir().unwrap();
    let data = write(
        dir.path(),
        "d.jsonl",
        "{\"id\": \"a\"}\n{\"id\": \"b\", \"sandbox\": {\"provider\": \"docker\"}}\n",
    );
    let defaults = write(
        dir.path(),
        "defaults.yaml",
        "harness: ./run.sh\nsandbox:\n  provider: modal\n",
    );
    let opts = LoadOptions {
        defaults_file: Some(defaults),
        ..LoadOptions::default()
    };
    let err = casebatch_manifest::load_plan(&data, &opts).unwrap_err();
    assert_eq!(
        unsupported(&err, "sandbox.provider", "docker").line,
        Some(2)
    );
    let p = unsupported(&err, "defaults.sandbox.provider", "modal");
    assert!(p.message.contains("defaults.yaml line 3"), "{err}");

    // batch_v1: the manifest's defaults and a runspec, named by the runspec file.
    let err = {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "cases/a.yaml",
            "query: q\nsandbox: {provider: docker}\n",
        );
        let path = write(
            dir.path(),
            "batch.yaml",
            "schema_version: batch_v1\ndefaults:\n  harness: ./run.sh\n  sandbox: {provider: firecracker}\nbatch:\n  cases:\n    - label: a\n      runspec: cases/a.yaml\n",
        );
        load(&path).unwrap_err()
    };
    assert_eq!(
        unsupported(&err, "defaults.sandbox.provider", "firecracker").line,
        Some(4)
    );
    let p = unsupported(&err, "batch.cases[0].runspec.sandbox.provider", "docker");
    assert!(p.message.contains("cases/a.yaml line 2"), "{err}");

    // The one provider there is, and an empty name, which is no provider at all.
    accept(
        "m.yaml",
        &with_tasks("  - task_id: a\n    sandbox: {provider: local, lifetime: 60}\n"),
    );
    let err = refuse(
        "m.yaml",
        &with_tasks("  - task_id: a\n    sandbox: {provider: ''}\n"),
    );
    says(
        &err,
        "tasks[0].sandbox.provider",
        "sandbox provider is empty",
    );
}

#[test]
fn several_problems_are_all_reported() {
    let err = refuse(
        "m.yaml",
        "\
batch_id: bad id
defaults:
  concurrency: 0
  max_retries: 9
  harness: ./run.sh
  colour: blue
tasks:
  - task_id: a
  - task_id: a
  - query: no id
  - task_id: b
    max_steps: many
",
    );
    for field in [
        "batch_id",
        "defaults.concurrency",
        "defaults.max_retries",
        "defaults.colour",
        "tasks[1].task_id",
        "tasks[2]",
        "tasks[3].max_steps",
    ] {
        problem(&err, field);
    }
    assert_eq!(err.problems.len(), 7, "{err}");
    let text = err.to_string();
    assert!(text.starts_with(&format!(
        "failed to load manifest {}: 7 problem(s)\n",
        err.file.display()
    )));
    assert!(
        text.contains("m.yaml:9: tasks[1].task_id: duplicate case id \"a\""),
        "{text}"
    );
    assert!(
        text.contains("m.yaml:6: defaults.colour: unknown field `colour` (fix: "),
        "{text}"
    );
}

#[test]
fn a_missing_file_is_one_problem() {
    let err = load(std::path::Path::new("/nonexistent/casebatch/m.yaml")).unwrap_err();
    says(&err, "(file)", "cannot read the manifest");
}

/// The refusal of a one-record JSONL batch loaded with `--defaults` holding `text`.
fn with_defaults_file(text: &str) -> casebatch_manifest::ManifestError {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "d.jsonl", "{\"id\": \"a\"}\n");
    let opts = LoadOptions {
        defaults_file: Some(write(dir.path(), "defaults.yaml", text)),
        ..LoadOptions::default()
    };
    casebatch_manifest::load_plan(&path, &opts).unwrap_err()
}

#[test]
fn a_broken_defaults_file_names_the_file() {
    let err = with_defaults_file("harness: ./x\nconcurrency: 0\nbogus: 1\n");
    let p = says(&err, "defaults.concurrency", "outside 1..=512");
    assert!(p.message.contains("defaults.yaml line 2"), "{err}");
    says(&err, "defaults.bogus", "unknown field");
}

/// The manifest's shape of a defaults file is checked as a manifest's: each problem under its
/// own field, with the file and line.
#[test]
fn a_broken_defaults_file_in_the_manifest_s_shape_names_the_file_and_field() {
    let err =
        with_defaults_file("defaults:\n  concurrency: 0\nsummary:\n  fields: ['']\ntasks: []\n");
    let p = says(&err, "defaults.concurrency", "outside 1..=512");
    assert!(p.message.contains("defaults.yaml line 2"), "{err}");
    says(&err, "summary.fields[0]", "empty");
    says(&err, "tasks", "unknown field");
}

/// A field only a container reads is refused with provider `local` (it would be ignored), a
/// container needs an image, and its choices are checked against the accepted values.
#[test]
fn container_fields_are_checked_for_what_reads_them() {
    let err = refuse(
        "m.yaml",
        "\
batch_id: t
defaults:
  harness: ./run.sh
tasks:
  - task_id: local-with-image
    sandbox: {provider: local, template: python:3.12-slim}
  - task_id: container-without-image
    sandbox: {provider: container, network: none}
  - task_id: bad-choices
    sandbox: {provider: container, template: busybox, network: host, pull: sometimes, user: ''}
",
    );
    let p = says(
        &err,
        "tasks[0].sandbox.template",
        "read by sandbox provider `container` only",
    );
    assert_eq!(p.line, Some(6));
    says(&err, "tasks[1].sandbox.template", "needs an image");
    let p = says(&err, "tasks[2].sandbox.network", "`host` is not one of");
    assert!(p.fix.contains("`none`, `default`"), "{err}");
    let p = says(&err, "tasks[2].sandbox.pull", "`sometimes` is not one of");
    assert!(p.fix.contains("`if-missing`, `always`, `never`"), "{err}");
    says(&err, "tasks[2].sandbox.user", "sandbox user is empty");
    assert_eq!(err.problems.len(), 5, "{err}");
}

/// Containers run on a worker's own host: a containerised case on the simulation (or on an
/// agent) would run without one, so it is refused, once for a default every case inherits.
#[test]
fn a_container_on_a_runtime_without_containers_is_refused() {
    let err = refuse(
        "m.yaml",
        "\
batch_id: t
defaults:
  runtime: fake
  sandbox: {provider: container, template: busybox}
tasks:
  - task_id: a
  - task_id: b
",
    );
    let p = says(
        &err,
        "defaults.sandbox.provider",
        "runs on runtime fake, which provides no container",
    );
    assert!(p.fix.contains("local-process"), "{err}");
    assert_eq!(err.problems.len(), 1, "reported once, not per case: {err}");
}

/// A program written as a path that cannot run on a worker's host is refused where it is
/// written: once at a default however many cases inherit it, at a case's own field, in the
/// defaults file that names it. Agents and containers run it elsewhere: not checked here.
#[test]
fn programs_that_cannot_run_are_refused_where_they_are_written() {
    let err = refuse(
        "m.yaml",
        r#"batch_id: t
runtimes:
  box: {kind: agent, endpoint: "http://127.0.0.1:7301"}
defaults:
  harness: ./absent.sh --flag
tasks:
  - task_id: a
  - task_id: b
  - task_id: c
    evaluator: [bin/absent-eval, --strict]
  - task_id: on-an-agent
    runtime: box
    harness: ./only-on-the-agent.sh
  - task_id: in-a-container
    sandbox: {provider: container, template: img}
    harness: ./only-in-the-image.sh
  - task_id: simulated
    runtime: fake
    harness: ./never-run.sh
  - task_id: shell
    harness: printf '{}' > "$CASEBATCH_RESULT"
"#,
    );
    assert_eq!(err.problems.len(), 2, "{err}");
    let p = says(&err, "defaults.harness", "program ./absent.sh (");
    assert_eq!(p.line, Some(5));
    assert!(p.message.ends_with("/absent.sh) does not exist"), "{err}");
    let p = says(&err, "tasks[2].evaluator", "program bin/absent-eval (");
    assert_eq!(p.line, Some(10));

    let dir = workspace();
    let defaults = write(dir.path(), "conf/defaults.yaml", "\nharness: ./absent.sh\n");
    let path = write(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"a\"}\n{\"id\": \"b\"}\n",
    );
    let opts = LoadOptions {
        defaults_file: Some(defaults.clone()),
        ..LoadOptions::default()
    };
    let err = casebatch_manifest::load_plan(&path, &opts).unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    let p = says(
        &err,
        "defaults.harness",
        &format!("in defaults file {} line 2: program", defaults.display()),
    );
    assert!(
        p.message.contains("/conf/absent.sh) does not exist"),
        "{err}"
    );
}

/// A value of the wrong type is refused with what its field accepts, not what its type
/// could hold: `concurrency` takes 1 to 512, not 0 to 4294967295.
#[test]
fn a_type_error_quotes_the_fields_own_limits() {
    let err = refuse(
        "m.yaml",
        r#"batch_id: t
runtimes:
  box: {kind: agent, endpoint: "http://127.0.0.1:7301", max_concurrent: -1}
defaults:
  harness: ./run.sh
  concurrency: many
  resources: {memory_mb: 1.5, cpu: fast}
tasks:
  - task_id: a
    timeout_seconds: -5
    max_steps: lots
"#,
    );
    for (field, expected) in [
        (
            "runtimes.box.max_concurrent",
            "a whole number from 1 to 512",
        ),
        ("defaults.concurrency", "a whole number from 1 to 512"),
        (
            "defaults.resources.memory_mb",
            "a whole number of MiB from 1 to 1048576",
        ),
        ("defaults.resources.cpu", "a number more than 0, up to 1024"),
        (
            "tasks[0].timeout_seconds",
            "a whole number of seconds from 1 to 604800 (7 days)",
        ),
        // No bounds of its own: its type's.
        ("tasks[0].max_steps", "a whole number (0 to 4294967295)"),
    ] {
        let p = says(&err, field, &format!("expected {expected}, found "));
        assert_eq!(p.fix, format!("write {field} as {expected}"), "{err}");
    }
}

#[test]
fn epochs_out_of_range_or_colliding_with_a_task_id_are_refused() {
    let err = refuse(
        "m.yaml",
        &with_tasks("  - task_id: a\n    epochs: 0\n  - task_id: b\n    epochs: 101\n"),
    );
    says(&err, "tasks[0].epochs", "epochs 0 is outside 1..=100");
    says(&err, "tasks[1].epochs", "epochs 101 is outside 1..=100");

    // `a` run twice is `a#1` and `a#2`: a task already named `a#2` would share a case id.
    let err = refuse(
        "m.yaml",
        &with_tasks("  - task_id: a\n    epochs: 2\n  - task_id: a#2\n"),
    );
    says(&err, "tasks[1].task_id", "duplicate case id \"a#2\"");
}
