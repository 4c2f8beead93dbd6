//! YAML text into the JSON value every later stage reads, plus the line of every key and
//! list item, in one pass over the events of saphyr's parser (YAML 1.2, positions included).
//!
//! The value is built here rather than through a YAML library's own tree so that what a
//! manifest must not contain is refused while parsing, with a line: several documents, keys
//! that are lists or mappings, duplicate keys, nesting deeper than [`MAX_NESTING_DEPTH`]
//! (parsing stops there, so deep input costs nothing and no stack grows), and aliases that
//! expand out of proportion to the text ("billion laughs"). `<<: *anchor` merge keys are
//! resolved like YAML 1.1. Nodes copied through an alias get no lines of their own: problems
//! in them point at the alias.

use std::borrow::Cow;
use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span};
use serde_json::{Map, Value};

use crate::error::{Problem, SYNTAX_FIELD, too_deep_problem};
use crate::limits::{MAX_ALIAS_EXPANSION, MAX_NESTING_DEPTH};
use crate::report::FieldPath;
use crate::yaml_scalar;

/// A parsed YAML document.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) value: Value,
    /// Path (as displayed) to the line where its key or list item starts.
    pub(crate) lines: HashMap<String, usize>,
    /// (path, first line, duplicate line) of keys set twice in one mapping.
    pub(crate) duplicates: Vec<(FieldPath, usize, usize)>,
}

/// Parse one YAML document; the first problem that stops parsing is returned.
pub(crate) fn parse(text: &str) -> Result<Parsed, Problem> {
    let mut builder = Builder {
        unterminated_end: (!text.ends_with('\n')).then(|| text.chars().count()),
        ..Builder::default()
    };
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(scan_problem)?;
        builder.event(event, span)?;
    }
    Ok(Parsed {
        value: builder.root.unwrap_or(Value::Null),
        lines: builder.lines,
        duplicates: builder.duplicates,
    })
}

fn scan_problem(e: ScanError) -> Problem {
    let line = e.marker().line();
    // The scanner's own bound on flow nesting (`[[[...`, 255 levels) is hit before our
    // depth check sees the events; `nesting_stops_at_the_limit` guards this message.
    if e.info() == "recursion limit exceeded" {
        return too_deep_problem(line);
    }
    syntax_problem(
        line,
        format!("malformed YAML: {e}"),
        "fix the YAML syntax at the position shown (indentation, quoting, `key: value`)",
    )
}

fn syntax_problem(line: usize, message: String, fix: &str) -> Problem {
    Problem {
        line: Some(line),
        field: SYNTAX_FIELD.into(),
        message,
        fix: fix.into(),
    }
}

/// A list or mapping whose end has not been read yet.
struct Frame {
    path: FieldPath,
    anchor: usize,
    /// Nodes in it so far, itself included: what an alias of it copies.
    nodes: usize,
    body: Body,
}

enum Body {
    Seq(Vec<Value>),
    Map(MapBody),
}

#[derive(Default)]
struct MapBody {
    map: Map<String, Value>,
    /// The key whose value comes next, and its line; `None` while a key comes next.
    key: Option<(String, usize)>,
    /// Line of each key, to name both lines of a duplicate.
    key_lines: HashMap<String, usize>,
    /// Values of `<<` keys, merged in when the mapping ends.
    merges: Vec<(Value, usize)>,
}

const MERGE_KEY: &str = "<<";

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Value>,
    /// Anchor id to the finished node and its node count.
    anchors: HashMap<usize, (Value, usize)>,
    lines: HashMap<String, usize>,
    duplicates: Vec<(FieldPath, usize, usize)>,
    documents: usize,
    events: usize,
    alias_copies: usize,
    /// The end of the text (in characters) when its last line has no line break.
    unterminated_end: Option<usize>,
}

impl Builder {
    fn event(&mut self, event: Event, span: Span) -> Result<(), Problem> {
        self.events += 1;
        let line = span.start.line();
        match event {
            Event::DocumentStart(_) => self.document(line),
            Event::Scalar(mut text, style, anchor, tag) => {
                if self.ends_unterminated(style, span) {
                    text = without_final_break(text);
                }
                let value = yaml_scalar::resolve(&text, style, tag.as_deref())
                    .map_err(|m| syntax_problem(line, m, "quote the value, or fix the tag"))?;
                self.node(value, 1, anchor, line)
            }
            Event::Alias(id) => {
                let (value, nodes) = self.copy_anchor(id, line)?;
                self.node(value, nodes, 0, line)
            }
            Event::SequenceStart(anchor, _) => self.open(Body::Seq(Vec::new()), anchor, line),
            Event::MappingStart(anchor, _) => {
                self.open(Body::Map(MapBody::default()), anchor, line)
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(),
            _ => Ok(()),
        }
    }

    /// A block scalar (`|`, `>`) that runs to the end of a text whose last line has no line
    /// break. saphyr still gives it a final line break; the YAML spec, and serde_yaml, do not.
    fn ends_unterminated(&self, style: ScalarStyle, span: Span) -> bool {
        matches!(style, ScalarStyle::Literal | ScalarStyle::Folded)
            && self
                .unterminated_end
                .is_some_and(|end| span.end.index() >= end)
    }

    fn document(&mut self, line: usize) -> Result<(), Problem> {
        self.documents += 1;
        if self.documents == 1 {
            return Ok(());
        }
        Err(syntax_problem(
            line,
            "malformed YAML: a second document starts here; a manifest is one document".into(),
            "remove the `---` line, or put each document in a manifest of its own",
        ))
    }

    /// Whether the next node is a key of the open mapping.
    fn awaiting_key(&self) -> bool {
        matches!(
            self.stack.last(),
            Some(Frame { body: Body::Map(m), .. }) if m.key.is_none()
        )
    }

    /// A finished scalar or alias copy: a key, or a value.
    fn node(
        &mut self,
        value: Value,
        nodes: usize,
        anchor: usize,
        line: usize,
    ) -> Result<(), Problem> {
        if self.awaiting_key() {
            self.remember(anchor, &value, nodes);
            return self.key(&value, line);
        }
        self.note_item_line(line);
        self.place(value, nodes, anchor);
        Ok(())
    }

    fn remember(&mut self, anchor: usize, value: &Value, nodes: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, (value.clone(), nodes));
        }
    }

    fn key(&mut self, value: &Value, line: usize) -> Result<(), Problem> {
        let Some(text) = key_text(value) else {
            return Err(self.complex_key(line));
        };
        let Some(Frame {
            path,
            body: Body::Map(m),
            ..
        }) = self.stack.last_mut()
        else {
            return Ok(());
        };
        let path = path.key(&text);
        match m.key_lines.get(&text) {
            Some(first) => self.duplicates.push((path.clone(), *first, line)),
            None => {
                m.key_lines.insert(text.clone(), line);
            }
        }
        m.key = Some((text, line));
        self.lines.entry(path.to_string()).or_insert(line);
        Ok(())
    }

    fn complex_key(&self, line: usize) -> Problem {
        let path = self
            .stack
            .last()
            .map(|f| f.path.clone())
            .unwrap_or_default();
        Problem {
            line: Some(line),
            field: path.to_string(),
            message: "a mapping key is a list or mapping, which manifests do not support".into(),
            fix: "use plain strings as mapping keys".into(),
        }
    }

    /// A list item's line is recorded where the item starts (a key's, where the key is).
    fn note_item_line(&mut self, line: usize) {
        if let Some(Frame {
            path,
            body: Body::Seq(items),
            ..
        }) = self.stack.last()
        {
            let item = path.index(items.len());
            self.lines.entry(item.to_string()).or_insert(line);
        }
    }

    /// The path of the node that comes next in the open list or mapping.
    fn next_path(&self) -> FieldPath {
        match self.stack.last() {
            None => FieldPath::root(),
            Some(Frame { path, body, .. }) => match body {
                Body::Seq(items) => path.index(items.len()),
                Body::Map(m) => path.key(m.key.as_ref().map_or("", |(k, _)| k)),
            },
        }
    }

    fn open(&mut self, body: Body, anchor: usize, line: usize) -> Result<(), Problem> {
        if self.awaiting_key() {
            return Err(self.complex_key(line));
        }
        if self.stack.len() >= MAX_NESTING_DEPTH {
            return Err(too_deep_problem(line));
        }
        self.note_item_line(line);
        self.stack.push(Frame {
            path: self.next_path(),
            anchor,
            nodes: 1,
            body,
        });
        Ok(())
    }

    fn close(&mut self) -> Result<(), Problem> {
        let Some(frame) = self.stack.pop() else {
            return Ok(());
        };
        let value = match frame.body {
            Body::Seq(items) => Value::Array(items),
            Body::Map(m) => Value::Object(merge(m.map, m.merges)?),
        };
        self.place(value, frame.nodes, frame.anchor);
        Ok(())
    }

    /// Put a finished node where it belongs: in the open list or mapping, or as the root.
    fn place(&mut self, value: Value, nodes: usize, anchor: usize) {
        self.remember(anchor, &value, nodes);
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(value);
            return;
        };
        frame.nodes += nodes;
        match &mut frame.body {
            Body::Seq(items) => items.push(value),
            Body::Map(m) => match m.key.take() {
                Some((key, line)) if key == MERGE_KEY => m.merges.push((value, line)),
                Some((key, _)) => {
                    m.map.insert(key, value);
                }
                None => {}
            },
        }
    }

    /// The node an alias names, within the expansion budget.
    fn copy_anchor(&mut self, id: usize, line: usize) -> Result<(Value, usize), Problem> {
        let Some((value, nodes)) = self.anchors.get(&id) else {
            return Err(syntax_problem(
                line,
                "malformed YAML: this alias names a list or mapping that contains it".into(),
                "an alias can only repeat a node that ends before it",
            ));
        };
        self.alias_copies += nodes;
        if self.alias_copies > MAX_ALIAS_EXPANSION.saturating_mul(self.events) {
            return Err(syntax_problem(
                line,
                format!(
                    "aliases (`*name`) copy more than {MAX_ALIAS_EXPANSION} nodes for every \
                     node written in the file"
                ),
                "write the repeated parts out, or repeat fewer nested aliases",
            ));
        }
        Ok((value.clone(), *nodes))
    }
}

fn without_final_break(text: Cow<'_, str>) -> Cow<'_, str> {
    match text.strip_suffix('\n') {
        Some(rest) => Cow::Owned(rest.to_string()),
        None => text,
    }
}

/// Scalar keys become their text, as serde_yaml's did (`1: x` has the key `"1"`).
fn key_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Null => Some("null".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// Apply `<<` merges: keys of the merged mappings that the mapping does not set itself.
fn merge(
    mut map: Map<String, Value>,
    merges: Vec<(Value, usize)>,
) -> Result<Map<String, Value>, Problem> {
    for (value, line) in merges {
        let sources = match value {
            Value::Array(items) => items,
            single => vec![single],
        };
        for source in sources {
            let Value::Object(source) = source else {
                return Err(syntax_problem(
                    line,
                    "`<<` merges a mapping or a list of mappings, and this is neither".into(),
                    "point `<<` at mapping anchors, e.g. `<<: *defaults`",
                ));
            };
            for (k, v) in source {
                map.entry(k).or_insert(v);
            }
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Locator;

    const YAML: &str = "\
batch_id: demo   # comment
defaults:
  concurrency: 2
  sandbox: &sb
    provider: local
  harness: |
    echo ok
    - not: a key
tasks:
- task_id: a
  query: \"x: y\"
-
  task_id: b
  inputs:
    k: v
  'url': http://example
summary:
  fields:
    - scores.accuracy
";

    fn lines(text: &str) -> HashMap<String, usize> {
        parse(text).unwrap_or_else(|p| panic!("{p}")).lines
    }

    #[test]
    fn keys_and_items_get_their_lines() {
        let map = lines(YAML);
        let line = |p: &str| map.get(p).copied();
        assert_eq!(line("batch_id"), Some(1));
        assert_eq!(line("defaults.concurrency"), Some(3));
        assert_eq!(line("defaults.sandbox.provider"), Some(5));
        assert_eq!(line("defaults.harness"), Some(6));
        assert_eq!(line("defaults.not"), None);
        assert_eq!(line("tasks"), Some(9));
        assert_eq!(line("tasks[0]"), Some(10));
        assert_eq!(line("tasks[0].task_id"), Some(10));
        assert_eq!(line("tasks[0].query"), Some(11));
        // An item whose `-` stands alone starts where its content does.
        assert_eq!(line("tasks[1]"), Some(13));
        assert_eq!(line("tasks[1].task_id"), Some(13));
        assert_eq!(line("tasks[1].inputs.k"), Some(15));
        assert_eq!(line("tasks[1].url"), Some(16));
        assert_eq!(line("summary.fields[0]"), Some(19));
    }

    #[test]
    fn indented_sequences_and_flow_collections_are_indexed() {
        let map = lines("tasks:\n  - task_id: a\n  - task_id: b\n    bogus: 1\nx: 1\n");
        assert_eq!(map.get("tasks[1].bogus"), Some(&4));
        assert_eq!(map.get("x"), Some(&5));
        let map = lines("a: {b: 1,\n  c: [x,\n    y]}\n");
        assert_eq!(map.get("a.c"), Some(&2));
        assert_eq!(map.get("a.c[1]"), Some(&3));
    }

    #[test]
    fn anchors_aliases_and_merges() {
        let parsed =
            parse("base: &b\n  x: 1\nmine:\n  <<: *b\n  x: 2\n  y: 3\nlist: [*b, *b]\n").unwrap();
        assert_eq!(parsed.value["mine"], serde_json::json!({"x": 2, "y": 3}));
        assert_eq!(parsed.value["list"][1]["x"], 1);
        // Copied nodes have no lines of their own: they fall back to the alias.
        assert_eq!(parsed.lines.get("list[1]"), Some(&7));
        assert_eq!(parsed.lines.get("list[1].x"), None);
        let bad = parse("a: &a 1\nb:\n  <<: *a\n").unwrap_err();
        assert_eq!(bad.line, Some(3));
        assert!(parse("a: &a [*a]\n").is_err());
    }

    #[test]
    fn refusals_name_their_line() {
        let dup = parse("a: 1\nb:\n  c: 1\n  c: 2\n").unwrap().duplicates;
        assert_eq!(dup.len(), 1);
        assert_eq!(
            (dup[0].0.to_string(), dup[0].1, dup[0].2),
            ("b.c".into(), 3, 4)
        );
        let p = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!((p.line, p.field.as_str()), (Some(2), SYNTAX_FIELD));
        let p = parse("a:\n  ? [x]\n  : y\n").unwrap_err();
        assert_eq!((p.line, p.field.as_str()), (Some(2), "a"));
        let p = parse("a: 1\nb: [\n").unwrap_err();
        assert!(p.message.starts_with("malformed YAML"), "{p}");
        let p = parse("a: !!int x\n").unwrap_err();
        assert_eq!(p.line, Some(1));
    }

    #[test]
    fn nesting_stops_at_the_limit() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse(&nested(MAX_NESTING_DEPTH)).is_ok());
        let p = parse(&format!("a: 1\nb: {}", nested(MAX_NESTING_DEPTH + 1))).unwrap_err();
        assert_eq!(p.line, Some(2));
        assert!(p.message.contains("nested more than"), "{p}");
        // Past the scanner's own flow bound, and block nesting.
        assert!(
            parse(&"[".repeat(10_000))
                .unwrap_err()
                .message
                .contains("nested")
        );
        let block = format!("a:\n{}x\n", "- ".repeat(10_000));
        assert_eq!(parse(&block).unwrap_err().line, Some(2));
    }

    #[test]
    fn block_scalars_at_the_end_keep_no_missing_line_break() {
        let value = |text: &str| parse(text).unwrap().value["a"].clone();
        assert_eq!(value("a: |\n  x"), "x");
        assert_eq!(value("a: >\n  x\n  ÿ"), "x ÿ");
        assert_eq!(value("a: |\n  x\n"), "x\n");
        assert_eq!(value("a: |\n  x\n# c"), "x\n");
        assert_eq!(value("a: |\n  x\nb: 1"), "x\n");
    }

    /// The index this parser records, read through the report's locator: a path the document
    /// does not have falls back to its nearest written ancestor.
    #[test]
    fn locator_falls_back_to_the_nearest_ancestor() {
        let text = "tasks:\n  - task_id: a\n    query: q\n";
        let loc = Locator::Index(parse(text).unwrap().lines);
        let missing = FieldPath::root().key("tasks").index(0).key("url");
        assert_eq!(loc.line(&missing), Some(2));
    }

    #[test]
    fn empty_text_is_null() {
        assert_eq!(parse("").unwrap().value, Value::Null);
        assert_eq!(parse("# nothing\n").unwrap().value, Value::Null);
    }
}
