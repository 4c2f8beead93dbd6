//! Every `--json` output is what its published schema (`casebatch config schema --kind K`)
//! says: real commands on one real batch, each output validated against its schema.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Parses `o`'s stdout and checks it against the schema of view `kind`, naming every error.
fn conforms(sb: &Sandbox, kind: &str, o: &std::process::Output) -> Value {
    let schema = sb.run(&["config", "schema", "--kind", kind]);
    assert_exit(&schema, 0);
    let schema: Value = serde_json::from_slice(&schema.stdout).expect("a schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("the schema itself is valid");
    let value: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "--json output of kind {kind} is not JSON ({e}):\n{}",
            stdout(o)
        )
    });
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{kind} output breaks its schema: {errors:#?}\n{value:#}"
    );
    value
}

#[test]
fn every_json_output_conforms_to_its_published_schema() {
    let sb = Sandbox::engine();
    let out = sb.out();
    let out = out.to_str().unwrap();
    let manifest = sb.write(
        "views.yaml",
        r#"batch_id: views
defaults:
  runtime: local-process
  harness: '[ "$CASEBATCH_CASE_ID" = bad ] && exit 3; echo "{\"scores\": {\"accuracy\": 1}}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: good}, {task_id: bad}]
"#,
    );
    let m = manifest.to_str().unwrap();
    conforms(
        &sb,
        "validate",
        &sb.run(&["batch", "validate", "--manifest", m, "--json"]),
    );
    conforms(
        &sb,
        "plan",
        &sb.run(&[
            "batch",
            "plan",
            "--manifest",
            m,
            "--output-dir",
            out,
            "--json",
        ]),
    );
    // The start request (and in it the workflow's input) `batch prepare` prints, before the run.
    conforms(
        &sb,
        "start-request",
        &sb.run(&[
            "batch",
            "prepare",
            "--manifest",
            m,
            "--output-dir",
            out,
            "--json",
        ]),
    );
    let run = sb.run(&[
        "batch",
        "run",
        "--manifest",
        m,
        "--output-dir",
        out,
        "--json",
    ]);
    assert_exit(&run, 4);
    conforms(&sb, "run", &run);

    let by_id = |verb: &str| {
        sb.run(&[
            "batch",
            verb,
            "--batch-id",
            "views",
            "--output-dir",
            out,
            "--json",
        ])
    };
    conforms(&sb, "status", &by_id("status"));
    conforms(&sb, "report", &by_id("report"));
    conforms(
        &sb,
        "list",
        &sb.run(&["batch", "list", "--output-dir", out, "--json"]),
    );
    conforms(
        &sb,
        "diff",
        &sb.run(&[
            "batch",
            "diff",
            "views",
            "views",
            "--output-dir",
            out,
            "--json",
        ]),
    );
    conforms(
        &sb,
        "engine-status",
        &sb.run(&["engine", "status", "--output-dir", out, "--json"]),
    );

    // A control answer, from a batch that is running.
    let slow = sb.write(
        "slow.yaml",
        "batch_id: slow\ndefaults:\n  runtime: local-process\n  harness: 'sleep 60'\ntasks: [{task_id: s}]\n",
    );
    let mut runner = sb.spawn_batch(&slow, "slow.log");
    wait_until(Duration::from_secs(60), "the slow batch runs", || {
        !sb.recorded("slow", "s", 1, "job").is_null()
    });
    let cancel = sb.run(&[
        "batch",
        "cancel",
        "--batch-id",
        "slow",
        "--output-dir",
        out,
        "--json",
    ]);
    assert_exit(&cancel, 0);
    conforms(&sb, "control", &cancel);
    wait_child(&mut runner, Duration::from_secs(60));
}
