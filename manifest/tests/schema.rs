//! The generated JSON Schemas accept the shipped examples and reject broken manifests.

mod common;

use std::path::Path;

use casebatch_manifest::{batch_schema, batch_v1_schema, runspec_schema};
use common::examples;
use saphyr::{LoadableYamlNode, Scalar, Yaml};
use serde_json::Value;

fn yaml(path: &Path) -> Value {
    parse(&std::fs::read_to_string(path).unwrap())
}

/// YAML text as JSON, read by saphyr's own loader: independent of the manifest's parser.
fn parse(text: &str) -> Value {
    let docs = Yaml::load_from_str(text).unwrap();
    to_json(&docs[0])
}

fn to_json(node: &Yaml) -> Value {
    match node {
        Yaml::Value(Scalar::Null) => Value::Null,
        Yaml::Value(Scalar::Boolean(b)) => Value::from(*b),
        Yaml::Value(Scalar::Integer(i)) => Value::from(*i),
        Yaml::Value(Scalar::FloatingPoint(f)) => Value::from(f.into_inner()),
        Yaml::Value(Scalar::String(s)) => Value::from(s.as_ref()),
        Yaml::Sequence(items) => items.iter().map(to_json).collect(),
        Yaml::Mapping(map) => map
            .iter()
            .map(|(k, v)| match to_json(k) {
                Value::String(key) => (key, to_json(v)),
                key => (key.to_string(), to_json(v)),
            })
            .collect(),
        other => panic!("unexpected YAML node {other:?}"),
    }
}

fn errors(schema: &Value, instance: &Value) -> Vec<String> {
    let validator = jsonschema::validator_for(schema).expect("the schema itself is valid");
    validator
        .iter_errors(instance)
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn batch_schema_validates_the_examples() {
    let schema = batch_schema();
    for name in ["batch-local.yaml", "batch-fake.yaml", "batch-agent.yaml"] {
        let errs = errors(&schema, &yaml(&examples().join(name)));
        assert!(errs.is_empty(), "{name}: {errs:#?}");
    }
}

#[test]
fn batch_v1_schemas_validate_the_example_and_its_runspecs() {
    let dir = examples().join("batch-v1");
    let errs = errors(&batch_v1_schema(), &yaml(&dir.join("batch.yaml")));
    assert!(errs.is_empty(), "{errs:#?}");
    for name in ["cases/greet-en.yaml", "cases/greet-fr.json"] {
        let errs = errors(&runspec_schema(), &yaml(&dir.join(name)));
        assert!(errs.is_empty(), "{name}: {errs:#?}");
    }
}

#[test]
fn batch_schema_rejects_invalid_manifests() {
    let schema = batch_schema();
    let invalid = [
        (
            "unknown field",
            "batch_id: x\ntasks:\n  - task_id: a\n    qurey: q\n",
        ),
        ("missing tasks", "batch_id: x\n"),
        ("empty tasks", "batch_id: x\ntasks: []\n"),
        (
            "concurrency",
            "batch_id: x\ndefaults:\n  concurrency: 0\ntasks:\n  - task_id: a\n",
        ),
        (
            "max_retries",
            "batch_id: x\ndefaults:\n  max_retries: 6\ntasks:\n  - task_id: a\n",
        ),
        (
            "runtime name",
            "batch_id: x\ndefaults:\n  runtime: Docker!\ntasks:\n  - task_id: a\n",
        ),
        (
            "runtimes entry",
            "batch_id: x\nruntimes:\n  box: {kind: agent, endpoint: \"http://h\", colour: red}\ntasks:\n  - task_id: a\n",
        ),
        (
            "runtimes name",
            "batch_id: x\nruntimes:\n  Box: {kind: fake}\ntasks:\n  - task_id: a\n",
        ),
        ("batch id", "batch_id: a/b\ntasks:\n  - task_id: a\n"),
        (
            "sandbox provider",
            "batch_id: x\ndefaults:\n  sandbox: {provider: docker}\ntasks:\n  - task_id: a\n",
        ),
        ("task id type", "batch_id: x\ntasks:\n  - task_id: [a]\n"),
    ];
    for (what, text) in invalid {
        let value = parse(text);
        assert!(
            !errors(&schema, &value).is_empty(),
            "{what} was accepted by the schema"
        );
    }
    let local = parse("batch_id: x\ntasks:\n  - task_id: a\n    sandbox: {provider: local}\n");
    assert!(errors(&schema, &local).is_empty());
    let runspec_sandbox = parse("query: q\nsandbox: {provider: docker}\n");
    assert!(!errors(&runspec_schema(), &runspec_sandbox).is_empty());
    let runspec_sweep = parse("matrix: {a: [1, 2]}\n");
    assert!(!errors(&runspec_schema(), &runspec_sweep).is_empty());
}

#[test]
fn batch_schema_is_pretty_stable_and_documented() {
    let schema = batch_schema();
    assert_eq!(schema["$id"], "https://casebatch.dev/schemas/batch.json");
    assert_eq!(schema["title"], "casebatch batch manifest");
    let pretty = serde_json::to_string_pretty(&schema).unwrap();
    assert_eq!(
        pretty,
        serde_json::to_string_pretty(&batch_schema()).unwrap()
    );
    assert!(pretty.contains("Stable identity within the output root"));
}
