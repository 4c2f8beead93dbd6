//! Turning a file's bytes into a JSON value: text decoding, format sniffing, YAML/JSON syntax.
//!
//! Every later stage works on `serde_json::Value`, whichever syntax the file used, so type
//! checks and messages are the same for YAML and JSON. Each syntax comes with a map from field
//! paths to lines: YAML's is recorded by the parser itself (`yaml_syntax`), JSON's by a scan
//! of the text (`locate`), since serde_json keeps no positions. Nesting deeper than
//! [`MAX_NESTING_DEPTH`] is refused in every syntax before it costs time or stack.

use std::io::Read;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{FILE_FIELD, SYNTAX_FIELD, too_deep_problem};
use crate::limits::{MAX_MANIFEST_BYTES, MAX_NESTING_DEPTH};
use crate::locate;
use crate::report::{FieldPath, Locator, Report};
use crate::yaml_syntax;

/// The surface syntax of a file (the manifest *shape* is decided later, from its content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syntax {
    Yaml,
    Json,
    Jsonl,
}

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
    let unreadable = |r: &mut Report, e: std::io::Error| {
        r.at_line(
            None,
            FILE_FIELD,
            format!("cannot read {what}: {e}"),
            "check the path and that the file is readable",
        );
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            unreadable(r, e);
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
        unreadable(r, e);
        return None;
    }
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        too_big(r, "larger than that".into());
        return None;
    }
    Some(bytes)
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
/// errors (with the parser's line and column) go to the report.
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
    // serde_json's own depth limit is deeper, and its message names no fix.
    if let Some(line) = locate::json_too_deep(text, MAX_NESTING_DEPTH) {
        r.problems.push(too_deep_problem(line));
        return None;
    }
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
    report_duplicates(&index.duplicates, r);
    Some((value, Locator::Index(index.lines)))
}

/// One YAML document, with the lines its parser saw. Duplicate keys refuse it.
fn parse_yaml(text: &str, r: &mut Report) -> Option<(Value, Locator)> {
    match yaml_syntax::parse(text) {
        Err(problem) => {
            r.problems.push(problem);
            None
        }
        Ok(parsed) if !parsed.duplicates.is_empty() => {
            report_duplicates(&parsed.duplicates, r);
            None
        }
        Ok(parsed) => Some((parsed.value, Locator::Index(parsed.lines))),
    }
}

/// (path, first line, duplicate line) of keys set twice, as problems at the second.
fn report_duplicates(duplicates: &[(FieldPath, usize, usize)], r: &mut Report) {
    for (path, first, again) in duplicates {
        r.at_line(
            Some(*again),
            path.to_string(),
            format!("duplicate key (first set at line {first})"),
            "keep only one of the two",
        );
    }
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
