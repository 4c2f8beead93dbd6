//! What a valid manifest resolves into: settings, fully resolved cases, fingerprint.

mod common;

use casebatch_manifest::{
    CommandSpec, FakeOutcome, LoadOptions, ManifestFormat, Plan, RuntimeKind, load_plan,
};
use common::*;

const SANDBOXED: &str = "\
batch_id: sb
defaults:
  harness: ./run.sh
  sandbox:
    provider: container
    template: web-default
    platform: linux/amd64
    network: none
    lifetime: 900
tasks:
  - task_id: inherits
  - task_id: replaces
    sandbox:
      provider: local
";

#[test]
fn a_task_sandbox_replaces_the_default_whole() {
    let plan = accept("m.yaml", SANDBOXED);
    let inherits = plan.cases[0].sandbox.as_ref().unwrap();
    assert_eq!(inherits.provider, "container");
    assert_eq!(inherits.template.as_deref(), Some("web-default"));
    assert_eq!(inherits.network.as_deref(), Some("none"));
    let replaces = plan.cases[1].sandbox.as_ref().unwrap();
    assert_eq!(replaces.provider, "local");
    // Not merged: nothing of the default survives in the task's sandbox.
    assert_eq!(replaces.template, None);
    assert_eq!(replaces.platform, None);
    assert_eq!(replaces.network, None);
    assert_eq!(replaces.lifetime, None);
}

#[test]
fn defaults_flags_and_tasks_layer_in_order() {
    let dir = workspace();
    let path = write(
        dir.path(),
        "m.yaml",
        "\
batch_id: layers
defaults:
  concurrency: 3
  max_retries: 2
  timeout_seconds: 100
  harness: ./manifest.sh
  controller_url: ws://manifest
tasks:
  - task_id: a
  - task_id: b
    timeout_seconds: 5
",
    );
    let plan = load(&path).unwrap();
    assert_eq!(plan.settings.concurrency, 3);
    assert_eq!(plan.settings.max_retries, 2);
    assert_eq!(
        plan.settings.controller_url.as_deref(),
        Some("ws://manifest")
    );
    assert_eq!(plan.cases[0].timeout_seconds, 100);
    assert_eq!(plan.cases[1].timeout_seconds, 5);

    let mut opts = LoadOptions::default();
    opts.overrides.concurrency = Some(7);
    opts.overrides.timeout_seconds = Some(50);
    // Absolute: a relative flag resolves against the current directory (tests/integration).
    let flag = program(dir.path(), "flag.sh").display().to_string();
    opts.overrides.harness = Some(CommandSpec::Shell(flag.clone()));
    opts.batch_id = Some("from-flag".into());
    let plan = load_plan(&path, &opts).unwrap();
    assert_eq!(plan.batch_id, "from-flag");
    assert_eq!(
        plan.settings.concurrency, 7,
        "flags win over manifest defaults"
    );
    assert_eq!(plan.settings.max_retries, 2);
    assert_eq!(plan.cases[0].timeout_seconds, 50);
    assert_eq!(
        plan.cases[1].timeout_seconds, 5,
        "a task's own value wins over flags"
    );
    assert_eq!(plan.cases[0].harness, Some(CommandSpec::Shell(flag)));
}

#[test]
fn built_in_defaults() {
    let plan = accept("m.yaml", &with_tasks("  - task_id: a\n"));
    assert_eq!(plan.settings.concurrency, 2);
    assert_eq!(plan.settings.max_retries, 1);
    let case = &plan.cases[0];
    assert_eq!(
        case.runtime,
        RuntimeKind::LocalProcess,
        "a harness implies local-process"
    );
    assert_eq!(case.timeout_seconds, 600);
    assert_eq!(case.index, 0);
    assert_eq!(plan.schema_version, "batch_plan_v1");
    assert!(plan.warnings.is_empty());
}

#[test]
fn the_input_holds_the_task_fields_that_are_set() {
    let plan = accept(
        "m.yaml",
        &with_tasks(
            "  - task_id: t1\n    query: find it\n    url: https://x\n    max_steps: 9\n    inputs:\n      level: 2\n  - task_id: t2\n    agent_kind: desktop\n",
        ),
    );
    let input = serde_json::to_value(&plan.cases[0].input).unwrap();
    assert_eq!(
        input,
        serde_json::json!({
            "task_id": "t1", "query": "find it", "url": "https://x", "max_steps": 9, "level": 2
        })
    );
    let input = serde_json::to_value(&plan.cases[1].input).unwrap();
    assert_eq!(
        input,
        serde_json::json!({"task_id": "t2", "agent_kind": "desktop"})
    );
}

#[test]
fn an_input_may_not_shadow_a_task_field() {
    let err = refuse(
        "m.yaml",
        &with_tasks(
            "  - task_id: a\n    query: q\n    inputs:\n      query: other\n      task_id: x\n",
        ),
    );
    let p = says(&err, "tasks[0].inputs.query", "collides");
    assert_eq!(p.line, Some(8));
    says(&err, "tasks[0].inputs.task_id", "collides");
}

#[test]
fn fake_runtime_needs_no_harness() {
    let plan = accept(
        "m.yaml",
        "batch_id: f\ndefaults:\n  runtime: fake\n  fake: {duration_ms: 5}\ntasks:\n  - task_id: a\n  - task_id: b\n    fake: {outcome: oom_killed}\n",
    );
    assert_eq!(plan.cases[0].runtime, RuntimeKind::Fake);
    assert_eq!(plan.cases[0].harness, None);
    assert_eq!(plan.cases[0].fake.as_ref().unwrap().duration_ms, 5);
    let fake = plan.cases[1].fake.as_ref().unwrap();
    assert_eq!(fake.outcome, FakeOutcome::OomKilled);
    assert_eq!(
        fake.duration_ms, 0,
        "a task's fake script replaces the default whole"
    );
}

#[test]
fn fingerprint_is_stable_and_tracks_the_task_list() {
    let base = with_tasks("  - task_id: a\n    query: q\n  - task_id: b\n");
    let fp = |text: &str| accept("m.yaml", text).fingerprint;
    let first = fp(&base);
    assert_eq!(first.len(), 64);
    assert_eq!(first, fp(&base), "same manifest, same fingerprint");
    // Formatting and comments do not matter; the task list does.
    assert_eq!(first, fp(&format!("# a comment\n{base}\n\n")));
    assert_ne!(first, fp(&with_tasks("  - task_id: a\n    query: q\n")));
    assert_ne!(
        first,
        fp(&with_tasks(
            "  - task_id: a\n    query: Q\n  - task_id: b\n"
        ))
    );
    assert_ne!(
        first,
        fp(&with_tasks(
            "  - task_id: b\n  - task_id: a\n    query: q\n"
        ))
    );
    assert_ne!(
        first,
        fp(&with_tasks(
            "  - task_id: a\n    query: q\n  - task_id: c\n"
        ))
    );
    // The same cases written as JSON give the same fingerprint.
    let json = r#"{"batch_id": "t", "defaults": {"harness": "./run.sh"},
                   "tasks": [{"task_id": "a", "query": "q"}, {"task_id": "b"}]}"#;
    assert_eq!(first, accept("m.json", json).fingerprint);
}

/// A batch is resumed only when its manifest plans to the fingerprint its bundle recorded, so a
/// fingerprint may never change between versions: this one was recorded by an earlier build.
#[test]
fn a_fingerprint_is_the_one_earlier_versions_recorded() {
    let plan = accept(
        "m.yaml",
        "\
batch_id: golden
defaults:
  harness: ./run.sh
  env: {MODE: fast}
tasks:
  - task_id: a
    query: find the price
    url: https://example.com/
    max_steps: 12
    inputs: {web_name: Example, nested: {b: [1, 2], a: null}}
  - task_id: b
    epochs: 2
    agent_kind: browser
",
    );
    assert_eq!(plan.cases.len(), 3);
    assert_eq!(
        plan.fingerprint,
        "5806bfc27b89eb4862fa81501f5e3e008d08ff03c1d0f2504c07bb30e1f221d1"
    );
}

#[test]
fn provenance_names_the_file_and_its_hash() {
    let dir = workspace();
    let text = with_tasks("  - task_id: a\n");
    let path = write(dir.path(), "m.yml", &text);
    let plan = load(&path).unwrap();
    assert_eq!(plan.provenance.format, ManifestFormat::Yaml);
    assert!(std::path::Path::new(&plan.provenance.manifest_path).is_absolute());
    assert!(plan.provenance.manifest_path.ends_with("m.yml"));
    use sha2::Digest;
    assert_eq!(
        plan.provenance.manifest_sha256,
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    );
}

#[test]
fn max_cases_is_a_warning_not_an_error() {
    let dir = workspace();
    let path = write(
        dir.path(),
        "m.yaml",
        &with_tasks("  - task_id: a\n  - task_id: b\n"),
    );
    let opts = LoadOptions {
        max_cases: Some(1),
        ..LoadOptions::default()
    };
    let plan = load_plan(&path, &opts).unwrap();
    assert_eq!(plan.cases.len(), 2);
    assert_eq!(plan.warnings.len(), 1);
    assert!(plan.warnings[0].contains("more than the --max-cases threshold of 1"));
    let opts = LoadOptions {
        max_cases: Some(2),
        ..LoadOptions::default()
    };
    assert!(load_plan(&path, &opts).unwrap().warnings.is_empty());
}

#[test]
fn jsonl_records_with_aliases_defaults_file_and_extra_keys() {
    let dir = workspace();
    let path = write(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"a 1\", \"ques\": \"q\", \"web\": \"https://w\", \"web_name\": \"W\"}\n\n{\"task_id\": \"b\", \"query\": \"q2\", \"max_steps\": 4, \"inputs\": {\"k\": 1}}\n",
    );
    // Its program resolves against the defaults file's directory, not the manifest's.
    let defaults = write(
        dir.path(),
        "conf/defaults.json",
        "{\"harness\": [\"./run\", \"--x\"], \"concurrency\": 5}",
    );
    let run = program(dir.path(), "conf/run");
    let opts = LoadOptions {
        defaults_file: Some(defaults),
        ..LoadOptions::default()
    };
    let plan = load_plan(&path, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.batch_id, "tasks");
    assert_eq!(plan.provenance.format, ManifestFormat::Jsonl);
    assert_eq!(plan.settings.concurrency, 5);
    assert_eq!(plan.cases.len(), 2);
    let a = &plan.cases[0];
    assert_eq!(a.case_id, "a 1");
    assert_eq!(a.source.line, Some(1));
    assert_eq!(
        serde_json::to_value(&a.input).unwrap(),
        serde_json::json!({"task_id": "a 1", "query": "q", "url": "https://w", "web_name": "W"})
    );
    assert_eq!(plan.cases[1].source.line, Some(3));
    assert_eq!(plan.cases[1].input["k"], 1);
    assert_eq!(plan.cases[1].input["max_steps"], 4);
    let resolved = run.canonicalize().unwrap().display().to_string();
    assert_eq!(
        a.harness,
        Some(CommandSpec::Argv(vec![resolved, "--x".into()]))
    );
}

/// Issue 58: `--defaults` said it takes "a `defaults` object", but only the fields written
/// flat were read, and a JSONL batch had no way to set its `summary:`. The file's manifest
/// shape carries both; the flat one still works (above).
#[test]
fn a_defaults_file_in_the_manifest_s_shape_sets_defaults_and_the_summary() {
    let dir = workspace();
    let path = write(dir.path(), "tasks.jsonl", "{\"id\": \"a\"}\n");
    let defaults = write(
        dir.path(),
        "conf/defaults.yaml",
        "defaults:\n  harness: [./run]\n  concurrency: 3\nsummary:\n  fields: [scores.accuracy]\n  write_csv: true\n",
    );
    let run = program(dir.path(), "conf/run");
    let opts = LoadOptions {
        defaults_file: Some(defaults),
        ..LoadOptions::default()
    };
    let plan = load_plan(&path, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.settings.concurrency, 3);
    assert_eq!(
        plan.cases[0].harness,
        Some(CommandSpec::Argv(vec![
            run.canonicalize().unwrap().display().to_string()
        ]))
    );
    assert_eq!(plan.summary.fields, ["scores.accuracy"]);
    assert!(plan.summary.write_csv);

    // A manifest's own summary wins over the file's.
    let yaml = write(
        dir.path(),
        "m.yaml",
        "batch_id: m\ntasks: [{task_id: a}]\nsummary: {fields: [outputs.answer]}\n",
    );
    let plan = load_plan(&yaml, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.summary.fields, ["outputs.answer"]);
}

#[test]
fn jsonl_type_checks_known_keys_and_aliases() {
    let err = refuse(
        "d.jsonl",
        "{\"id\": 1, \"ques\": \"q\"}\n{\"id\": \"b\", \"task_id\": \"b\", \"max_steps\": \"x\"}\n[1]\n{\"ques\": \"no id\"}\n",
    );
    let at = |line: usize, field: &str, needle: &str| {
        assert!(
            err.problems
                .iter()
                .any(|p| p.line == Some(line) && p.field == field && p.message.contains(needle)),
            "no problem at line {line} {field} mentioning {needle:?}:\n{err}"
        );
    };
    at(1, "id", "expected a string, found number 1");
    at(2, "max_steps", "expected a whole number");
    at(2, "id", "both `task_id` and its alias `id`");
    at(3, "(document)", "expected a mapping");
    at(4, "task_id", "no `task_id`");
}

#[test]
fn the_plan_round_trips_through_json() {
    let plan = accept("m.yaml", SANDBOXED);
    let text = serde_json::to_string_pretty(&plan).unwrap();
    let back: Plan = serde_json::from_str(&text).unwrap();
    assert_eq!(back, plan);
}

#[test]
fn the_examples_plan() {
    let local = load(&examples().join("batch-local.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(local.cases.len(), 3);
    assert!(
        local
            .cases
            .iter()
            .all(|c| c.runtime == RuntimeKind::LocalProcess)
    );
    assert_ne!(
        local.cases[2].case_dir, local.cases[2].case_id,
        "`web task/3` is made safe"
    );
    let fake = load(&examples().join("batch-fake.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert!(fake.cases.iter().all(|c| c.runtime == RuntimeKind::Fake));
    let v1 = load(&examples().join("batch-v1/batch.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v1.batch_id, "v1-example");
    assert_eq!(v1.cases.len(), 2);
    let agents = load(&examples().join("batch-agent.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<_> = agents
        .cases
        .iter()
        .map(|c| (c.runtime, c.runtime_name.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        names,
        [
            (RuntimeKind::Agent, "box-a"),
            (RuntimeKind::Agent, "box-b"),
            (RuntimeKind::Agent, "box-a"),
            (RuntimeKind::Agent, "box-b"),
        ]
    );
}

#[test]
fn epochs_run_each_task_as_cases_of_its_own_that_know_their_run() {
    let plan = accept(
        "m.yaml",
        "\
batch_id: ep
defaults:
  runtime: fake
  epochs: 3
tasks:
  - task_id: a
    query: q
  - task_id: once
    epochs: 1
  - task_id: b
    epochs: 2
",
    );
    let ids: Vec<&str> = plan.cases.iter().map(|c| c.case_id.as_str()).collect();
    assert_eq!(ids, ["a#1", "a#2", "a#3", "once", "b#1", "b#2"]);
    let indexes: Vec<u32> = plan.cases.iter().map(|c| c.index).collect();
    assert_eq!(indexes, [0, 1, 2, 3, 4, 5]);
    let a2 = &plan.cases[1];
    let epoch = a2.epoch.as_ref().expect("a run of a task with epochs");
    assert_eq!((epoch.task_id.as_str(), epoch.epoch, epoch.of), ("a", 2, 3));
    assert_eq!(a2.env["CASEBATCH_TASK_ID"], "a");
    assert_eq!(a2.env["CASEBATCH_EPOCH"], "2");
    assert_eq!(
        a2.input, plan.cases[0].input,
        "every run has the task's input"
    );
    assert_eq!(plan.cases[3].epoch, None, "a task run once keeps its id");
    assert!(plan.cases[3].env.is_empty());
    // The runs are distinct directories.
    let dirs: std::collections::HashSet<&str> =
        plan.cases.iter().map(|c| c.case_dir.as_str()).collect();
    assert_eq!(dirs.len(), 6);
}

#[test]
fn a_change_of_epochs_is_another_plan() {
    let manifest = |n: u32| {
        format!("batch_id: ep\ndefaults: {{runtime: fake, epochs: {n}}}\ntasks:\n  - task_id: a\n")
    };
    let two = accept("m.yaml", &manifest(2));
    let three = accept("m.yaml", &manifest(3));
    assert_ne!(two.fingerprint, three.fingerprint);
}

/// `pass_when` is recorded in the plan case by case (a task's replaces the default's), is part
/// of the fingerprint where it is used, and leaves the fingerprint of a manifest without it as
/// it was.
#[test]
fn pass_when_is_planned_per_case_and_fingerprinted_only_where_used() {
    let base = with_tasks("  - task_id: a\n  - task_id: b\n");
    let judged = "batch_id: t\ndefaults:\n  harness: ./run.sh\n  pass_when: {score: match, \
                  at_least: 1}\ntasks:\n  - task_id: a\n  - task_id: b\n    pass_when: \
                  {score: f1, at_least: 0.5}\n";
    let plan = accept("m.yaml", judged);
    let rule = |i: usize| {
        let p = plan.cases[i].pass_when.as_ref().unwrap();
        (p.score.as_str(), p.at_least)
    };
    assert_eq!((rule(0), rule(1)), (("match", 1.0), ("f1", 0.5)));
    let without = accept("m.yaml", &base);
    assert_eq!(without.cases[0].pass_when, None);
    assert_ne!(
        plan.fingerprint, without.fingerprint,
        "a verdict rule is what a case is"
    );
    // The batch_plan.json of a plan without it does not name it.
    let written = serde_json::to_string(&without.cases[0]).unwrap();
    assert!(!written.contains("pass_when"), "{written}");
    // JSONL records and batch_v1 run specs take it too.
    let jsonl = accept(
        "m.jsonl",
        r#"{"task_id": "a", "harness": "./run.sh", "pass_when": {"score": "m", "at_least": 2}}"#,
    );
    assert_eq!(jsonl.cases[0].pass_when.as_ref().unwrap().at_least, 2.0);
}

#[test]
fn a_case_has_an_evaluator_or_a_pass_when_and_a_rule_is_whole() {
    let both = "batch_id: t\ndefaults:\n  harness: ./run.sh\n  evaluator: ./own.sh\ntasks:\n  \
                - task_id: a\n    pass_when: {score: match, at_least: 1}\n";
    let err = refuse("m.yaml", both);
    says(
        &err,
        "tasks[0].pass_when",
        "both an evaluator and a pass_when",
    );
    let both_defaults = "batch_id: t\ndefaults:\n  harness: ./run.sh\n  evaluator: ./own.sh\n  \
                         pass_when: {score: m, at_least: 1}\ntasks:\n  - task_id: a\n  - \
                         task_id: b\n";
    let err = refuse("m.yaml", both_defaults);
    says(
        &err,
        "defaults.pass_when",
        "both an evaluator and a pass_when",
    );
    let half = with_tasks("  - task_id: a\n    pass_when: {score: match, at_lest: 1}\n");
    let err = refuse("m.yaml", &half);
    says(
        &err,
        "tasks[0].pass_when",
        "missing required field `at_least`",
    );
    says(&err, "tasks[0].pass_when.at_lest", "unknown field");
    let unnamed = with_tasks("  - task_id: a\n    pass_when: {score: '', at_least: 1}\n");
    says(
        &refuse("m.yaml", &unnamed),
        "tasks[0].pass_when.score",
        "empty",
    );
    let words = with_tasks("  - task_id: a\n    pass_when: {score: m, at_least: high}\n");
    says(
        &refuse("m.yaml", &words),
        "tasks[0].pass_when.at_least",
        "expected",
    );
}
