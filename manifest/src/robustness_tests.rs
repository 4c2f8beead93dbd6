//! Property tests: no input, however broken, makes the loader panic.

use std::path::Path;

use proptest::prelude::*;
use serde_json::Value;

use crate::{LoadOptions, load_plan_from_bytes};

/// Words that steer random text into the manifest code paths instead of syntax errors.
const TOKENS: &str = "(batch_id|tasks|defaults|task_id|query|url|inputs|schema_version|batch_v1|batch|cases|label|runspec|harness|runtime|fake|local-process|concurrency|max_retries|timeout_seconds|sandbox|provider|summary|fields|matrix|id|ques|web|\\.\\./x|/etc/passwd|a\\.yaml|runtimes|kind|agent|endpoint|token_env|token_file|tls_ca|box-a|http://127\\.0\\.0\\.1:7301|https://\\[::1\\]:1|http://h:0)";

fn manifestish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just(": ".to_string()),
        Just(":\n".to_string()),
        Just("\n  ".to_string()),
        Just("\n  - ".to_string()),
        Just("- ".to_string()),
        Just("\n".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just(", ".to_string()),
        Just("\"".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("<<: ".to_string()),
        Just("|\n".to_string()),
        "[0-9]{1,4}".prop_map(|s| s),
        TOKENS.prop_map(|s| s),
        ".{0,3}".prop_map(|s| s),
    ];
    prop::collection::vec(piece, 0..80).prop_map(|v| v.concat())
}

/// JSON values whose keys are mostly real field names, so the walker goes deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,8}".prop_map(Value::from),
        TOKENS.prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(TOKENS, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A value as block-style YAML: nested `key:` and `- ` lines, leaves as JSON scalars (every
/// JSON scalar is a YAML flow scalar).
fn block_yaml(value: &Value) -> String {
    fn write(value: &Value, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match value {
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    out.push_str(&format!("\n{pad}- "));
                    write(item, indent + 2, out);
                }
            }
            Value::Object(map) if !map.is_empty() => {
                for (key, item) in map {
                    out.push_str(&format!("\n{pad}{}: ", Value::from(key.as_str())));
                    write(item, indent + 2, out);
                }
            }
            leaf => out.push_str(&leaf.to_string()),
        }
    }
    let mut out = String::new();
    write(value, 0, &mut out);
    out.push('\n');
    out
}

fn load(name: &str, bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), "query: q\n").unwrap();
    let path = dir.path().join(name);
    let _ = load_plan_from_bytes(&path, bytes, &LoadOptions::default());
    // The same bytes as a `--runtimes` file, next to a manifest that uses a table name.
    let runtimes = dir.path().join(format!("runtimes-{name}"));
    std::fs::write(&runtimes, bytes).unwrap();
    let opts = LoadOptions {
        runtimes_file: Some(runtimes),
        ..LoadOptions::default()
    };
    let manifest = b"batch_id: b\ndefaults: {runtime: box-a, harness: x}\ntasks: [{task_id: a}]\n";
    let _ = load_plan_from_bytes(&dir.path().join("m.yaml"), manifest, &opts);
}

const NAMES: [&str; 4] = ["m.yaml", "m.json", "m.jsonl", "m.unknown"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        for name in NAMES {
            load(name, &bytes);
        }
    }

    #[test]
    fn arbitrary_strings_never_panic(text in ".{0,300}") {
        for name in NAMES {
            load(name, text.as_bytes());
        }
    }

    #[test]
    fn manifest_like_text_never_panics(text in manifestish()) {
        for name in NAMES {
            load(name, text.as_bytes());
        }
    }

    #[test]
    fn manifest_like_values_never_panic(value in json_value()) {
        let json = serde_json::to_string_pretty(&value).unwrap();
        let yaml = block_yaml(&value);
        load("m.json", json.as_bytes());
        load("m.yaml", yaml.as_bytes());
        // The same value as each line of a JSONL file.
        let line = serde_json::to_string(&value).unwrap();
        load("m.jsonl", format!("{line}\n{line}\n").as_bytes());
    }
}

#[test]
fn pathological_inputs_are_refused_cleanly() {
    let deep = "[".repeat(10_000);
    let aliases = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n";
    for text in [
        deep.as_str(),
        aliases,
        "---\na: 1\n---\nb: 2\n",
        "!!binary aGVsbG8=",
        "? [a]\n: b\n",
        "\u{feff}batch_id: x\n",
    ] {
        for name in NAMES {
            let r = load_plan_from_bytes(Path::new(name), text.as_bytes(), &LoadOptions::default());
            assert!(r.is_err(), "{name}: {text:?} was accepted");
        }
    }
}
