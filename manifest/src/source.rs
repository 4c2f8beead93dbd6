//! Turning a file's bytes into a JSON value: text decoding, format sniffing, YAML/JSON syntax.
//!
//! Every later stage works on `serde_json::Value`, whichever syntax the file used, so type
//! checks and messages are the same for YAML and JSON.

use std::io::Read;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::limits::{MAX_MANIFEST_BYTES, MAX_NESTING_DEPTH};
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

/// How a file came to be read, which decides what kinds of file are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Named by the user on the command line (the manifest, `--defaults-file`): a regular
    /// file, or a pipe such as `<(generate)`, read up to the size limit.
    Named,
    /// Referenced from inside a manifest (a batch_v1 runspec): a regular file only, checked
    /// before it is opened, so a FIFO or device is never opened (opening a FIFO blocks).
    Referenced,
}

/// Read a file of at most [`MAX_MANIFEST_BYTES`]: the size is checked from the metadata before
/// reading (symlinks followed), and the read itself stops past the limit, so neither a huge
/// file nor an endless pipe is read whole. Problems are reported as `(file)` with a fix.
pub(crate) fn read_bounded(path: &Path, what: &str, kind: Kind, r: &mut Report) -> Option<Vec<u8>> {
    let too_big = |r: &mut Report, size: String| {
        r.at_line(
            None,
            FILE_FIELD,
            format!("{what} is {size}, more than the limit of {MAX_MANIFEST_BYTES} bytes (64 MiB)"),
            "split the batch into several manifests, or move large task data into files the \
             harness reads (name them in `inputs`)",
        );
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            r.at_line(
                None,
                FILE_FIELD,
                format!("cannot read {what}: {e}"),
                "check the path and that the file is readable",
            );
            return None;
        }
    };
    if meta.is_dir() {
        r.at_line(
            None,
            FILE_FIELD,
            format!("{what} is a directory"),
            "name a YAML, JSON or JSONL file",
        );
        return None;
    }
    if !meta.is_file() && kind == Kind::Referenced {
        r.at_line(
            None,
            FILE_FIELD,
            format!("{what} is not a regular file (a FIFO, socket or device); it was not opened"),
            "point it at a regular YAML or JSON file",
        );
        return None;
    }
    if meta.is_file() && meta.len() > MAX_MANIFEST_BYTES {
        too_big(r, format!("{} bytes", meta.len()));
        return None;
    }
    let capacity = if meta.is_file() { meta.len() } else { 0 };
    let mut bytes = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
    let read = std::fs::File::open(path)
        .and_then(|f| f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes));
    if let Err(e) = read {
        r.at_line(
            None,
            FILE_FIELD,
            format!("cannot read {what}: {e}"),
            "check the path and that the file is readable",
        );
        return None;
    }
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        too_big(r, "larger than that".into());
        return None;
    }
    Some(bytes)
}

/// Bytes as UTF-8 text (a leading byte-order mark dropped), or a problem naming the line of
/// the first invalid byte. Text nested deeper than [`MAX_NESTING_DEPTH`] is refused here,
/// before any parser sees it.
pub(crate) fn decode<'a>(bytes: &'a [u8], r: &mut Report) -> Option<&'a str> {
    let text = decode_utf8(bytes, r)?;
    if let Some(line) = locate::too_deep(text, MAX_NESTING_DEPTH) {
        r.at_line(
            Some(line),
            SYNTAX_FIELD,
            format!("mappings and lists are nested more than {MAX_NESTING_DEPTH} levels deep here"),
            "flatten the structure (a manifest needs a handful of levels); deep data belongs \
             in a file the harness reads, named in `inputs`",
        );
        return None;
    }
    Some(text)
}

fn decode_utf8<'a>(bytes: &'a [u8], r: &mut Report) -> Option<&'a str> {
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
