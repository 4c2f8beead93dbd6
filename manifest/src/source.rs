//! Turning a file's bytes into a JSON value: text decoding, format sniffing, YAML/JSON syntax.
//!
//! Every later stage works on `serde_json::Value`, whichever syntax the file used, so type
//! checks and messages are the same for YAML and JSON.

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::locate;
use crate::report::{FieldPath, Locator, Report};

/// The surface syntax of a file (the manifest *shape* is decided later, from its content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syntax {
    Yaml,
    Json,
    Jsonl,
}

/// Pseudo-field for problems with the file as a whole.
pub(crate) const FILE_FIELD: &str = "(file)";
/// Pseudo-field for syntax errors.
pub(crate) const SYNTAX_FIELD: &str = "(syntax)";

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// By extension; an unknown extension is sniffed from the content.
pub(crate) fn syntax_of(path: &Path, text: &str) -> Syntax {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("jsonl" | "ndjson") => Syntax::Jsonl,
        Some("json") => Syntax::Json,
        Some("yaml" | "yml") => Syntax::Yaml,
        _ => sniff(text),
    }
}

fn sniff(text: &str) -> Syntax {
    let trimmed = text.trim_start();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return Syntax::Yaml;
    }
    if serde_json::from_str::<Value>(text).is_ok() {
        return Syntax::Json;
    }
    // Several objects one per line, each valid on its own: JSON Lines.
    let first = trimmed.lines().next().unwrap_or_default();
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    if lines > 1 && serde_json::from_str::<Value>(first).is_ok() {
        Syntax::Jsonl
    } else {
        Syntax::Json
    }
}

/// Bytes as UTF-8 text (a leading byte-order mark dropped), or a problem naming the line of
/// the first invalid byte.
pub(crate) fn decode<'a>(bytes: &'a [u8], r: &mut Report) -> Option<&'a str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Some(text.strip_prefix('\u{feff}').unwrap_or(text)),
        Err(e) => {
            let valid = &bytes[..e.valid_up_to()];
            let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
            r.at_line(
                Some(line),
                FILE_FIELD,
                format!(
                    "not UTF-8 text (invalid byte at offset {})",
                    e.valid_up_to()
                ),
                "save the file as UTF-8",
            );
            None
        }
    }
}

/// Parse one YAML or JSON document. Returns the value and a locator for its fields; syntax
/// errors (with serde's line and column) go to the report.
pub(crate) fn parse_document(
    text: &str,
    syntax: Syntax,
    r: &mut Report,
) -> Option<(Value, Locator)> {
    match syntax {
        Syntax::Json | Syntax::Jsonl => parse_json(text, r),
        Syntax::Yaml => parse_yaml(text, r),
    }
}

/// One JSON value; duplicate keys are reported (serde_json would keep only the last).
pub(crate) fn parse_json(text: &str, r: &mut Report) -> Option<(Value, Locator)> {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            r.at_line(
                (e.line() > 0).then_some(e.line()),
                SYNTAX_FIELD,
                format!("malformed JSON: {e}"),
                "fix the JSON syntax at the position shown",
            );
            return None;
        }
    };
    let index = locate::index_json(text);
    for (path, first, again) in &index.duplicates {
        r.at_line(
            Some(*again),
            path.to_string(),
            format!("duplicate key (first set at line {first})"),
            "keep only one of the two",
        );
    }
    Some((value, Locator::Index(index.lines)))
}

fn parse_yaml(text: &str, r: &mut Report) -> Option<(Value, Locator)> {
    let syntax_problem = |r: &mut Report, e: serde_yaml::Error| {
        r.at_line(
            e.location().map(|l| l.line()),
            SYNTAX_FIELD,
            format!("malformed YAML: {e}"),
            "fix the YAML syntax at the position shown (indentation, quoting, `key: value`)",
        );
    };
    let mut yaml: serde_yaml::Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            syntax_problem(r, e);
            return None;
        }
    };
    // `<<: *anchor` merge keys are common in hand-written YAML; resolve them like YAML 1.1.
    if let Err(e) = yaml.apply_merge() {
        syntax_problem(r, e);
        return None;
    }
    match yaml_to_json(yaml) {
        Ok(v) => Some((v, Locator::for_yaml(text))),
        Err(message) => {
            r.at(
                &FieldPath::root(),
                message,
                "use plain strings as mapping keys",
            );
            None
        }
    }
}

/// YAML values into JSON ones. Scalar keys become their text; NaN/infinity become strings so
/// a later type check reports them instead of silently reading `null`.
fn yaml_to_json(value: serde_yaml::Value) -> Result<Value, String> {
    use serde_yaml::Value as Y;
    Ok(match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(f)
                    .map_or_else(|| Value::String(n.to_string()), Value::Number)
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(
            items
                .into_iter()
                .map(yaml_to_json)
                .collect::<Result<_, _>>()?,
        ),
        Y::Mapping(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                let key =
                    match k {
                        Y::String(s) => s,
                        Y::Bool(b) => b.to_string(),
                        Y::Number(n) => n.to_string(),
                        Y::Null => "null".to_string(),
                        _ => return Err(
                            "a mapping key is a list or mapping, which manifests do not support"
                                .into(),
                        ),
                    };
                out.insert(key, yaml_to_json(v)?);
            }
            Value::Object(out)
        }
        // Custom tags carry no meaning for manifests: keep the tagged value.
        Y::Tagged(tagged) => yaml_to_json(tagged.value)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffing_unknown_extensions() {
        let p = Path::new("manifest.txt");
        assert_eq!(syntax_of(p, "batch_id: x\n"), Syntax::Yaml);
        assert_eq!(syntax_of(p, "{\"batch_id\": \"x\"}"), Syntax::Json);
        assert_eq!(syntax_of(p, "{\"id\": 1}\n{\"id\": 2}\n"), Syntax::Jsonl);
        assert_eq!(syntax_of(Path::new("a.YML"), "{}"), Syntax::Yaml);
    }

    #[test]
    fn non_utf8_names_the_line() {
        let mut r = Report::default();
        assert!(decode(b"a: 1\nb: \xff\n", &mut r).is_none());
        assert_eq!(r.problems[0].line, Some(2));
    }

    #[test]
    fn yaml_duplicate_keys_and_syntax_errors_have_lines() {
        let mut r = Report::default();
        assert!(parse_yaml("a: 1\nb: [\n", &mut r).is_none());
        assert!(r.problems[0].line.is_some(), "{:?}", r.problems);
        let mut r = Report::default();
        assert!(parse_yaml("a: 1\na: 2\n", &mut r).is_none());
        assert!(
            r.problems[0].message.contains("duplicate"),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn yaml_merge_keys_are_resolved() {
        let mut r = Report::default();
        let (v, _) = parse_yaml("base: &b\n  x: 1\nmine:\n  <<: *b\n  y: 2\n", &mut r).unwrap();
        assert_eq!(v["mine"]["x"], 1);
    }
}
