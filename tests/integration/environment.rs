//! Harnesses and evaluators start from an empty environment plus an allowlist: the runner's
//! secrets never reach a harness, so they cannot end up in the bundle.

use std::path::Path;

use crate::support::*;

const API_KEY: &str = "sekrit-temporal-api-key-7f3a";
const MY_SECRET: &str = "sekrit-my-secret-91bc";

/// Every file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn runner_secrets_never_reach_harnesses_or_the_bundle() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "env.yaml",
        r#"batch_id: env-allowlist
defaults:
  runtime: local-process
  timeout_seconds: 60
  harness: 'env > "$CASEBATCH_OUTPUT_DIR/env.txt"; echo "{}" > "$CASEBATCH_RESULT"'
  evaluator: 'env > "$CASEBATCH_OUTPUT_DIR/eval-env.txt"; printf "{\"verdict\": \"pass\"}" > "$CASEBATCH_RESULT"'
  env: {LOG_LEVEL: from-the-manifest}
  pass_env: [PASSED_TOKEN]
tasks:
  - task_id: one
"#,
    );
    let out = sb.out();
    let o = sb.run_env(
        &batch_run_args(&manifest, &out),
        &[
            // With no address configured, the embedded engine is used and this is ignored.
            ("TEMPORAL_API_KEY", API_KEY),
            ("MY_SECRET", MY_SECRET),
            ("PASSED_TOKEN", "visible-on-purpose"),
        ],
    );
    assert_exit(&o, 0);

    let attempt = sb.bundle("env-allowlist").join("cases/one/attempts/1");
    let output = attempt.join("output");
    for name in ["env.txt", "eval-env.txt"] {
        let env =
            std::fs::read_to_string(output.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, _)| k)
            .collect();
        assert!(
            env.contains("PASSED_TOKEN=visible-on-purpose"),
            "{name}:\n{env}"
        );
        assert!(
            env.contains("LOG_LEVEL=from-the-manifest"),
            "{name}:\n{env}"
        );
        assert!(env.contains("CASEBATCH_CASE_ID=one"), "{name}:\n{env}");
        assert!(env.contains("CASEBATCH_ALLOC_MARKER="), "{name}:\n{env}");
        assert!(env.contains("PATH="), "{name}:\n{env}");
        for hidden in ["TEMPORAL_API_KEY", "MY_SECRET", "SANDBOX"] {
            assert!(!names.contains(&hidden), "{name} shows {hidden}:\n{env}");
        }
    }

    // No file anywhere in the bundle holds a secret's value.
    let mut all = Vec::new();
    files(&sb.bundle("env-allowlist"), &mut all);
    assert!(all.len() > 10, "{all:?}");
    for file in all {
        let bytes = std::fs::read(&file).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for secret in [API_KEY, MY_SECRET] {
            assert!(
                !text.contains(secret),
                "{} contains {secret}",
                file.display()
            );
        }
        // The plan carries the name to pass, never its value.
        assert!(
            !text.contains("visible-on-purpose") || file.starts_with(&output),
            "{}",
            file.display()
        );
    }
}

#[test]
fn an_unset_pass_env_variable_fails_the_case_as_config() {
    let sb = Sandbox::engine();
    let manifest = sb.write(
        "unset.yaml",
        "batch_id: env-unset\ndefaults:\n  harness: 'echo ran >> \"$CASEBATCH_OUTPUT_DIR/ran\"'\n  pass_env: [CASEBATCH_TEST_SURELY_UNSET_X]\ntasks:\n  - task_id: one\n",
    );
    // The name is reserved (CASEBATCH_*): validation refuses it before anything runs.
    let o = sb.validate(&manifest);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("pass_env[0]"), "{}", stderr(&o));

    let manifest = sb.write(
        "unset.yaml",
        "batch_id: env-unset\ndefaults:\n  harness: 'echo ran'\n  pass_env: [SURELY_UNSET_VARIABLE_X]\ntasks:\n  - task_id: one\n",
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 4);
    let result = sb.case_result("env-unset", "one");
    assert_eq!(result["failure"]["class"], "config", "{result:#}");
    assert_eq!(result["failure"]["code"], "PASS_ENV_UNSET", "{result:#}");
    let message = result["failure"]["message"].as_str().unwrap();
    assert!(message.contains("SURELY_UNSET_VARIABLE_X"), "{message}");
}
