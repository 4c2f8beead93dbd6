//! Best-effort maps from field paths to source lines, so problems can say where they are.
//!
//! serde gives line numbers only for syntax errors, so after a successful parse the text is
//! scanned once more: block-style YAML by indentation, JSON by a small tokenizer. Both are
//! tolerant: anything they do not understand is skipped, never an error or a panic.

use std::collections::HashMap;

use crate::report::FieldPath;

/// A container open at some column while scanning YAML.
struct Frame {
    /// Column of its keys (mapping) or of its `-` markers (sequence).
    col: usize,
    path: FieldPath,
    seq: bool,
    next_index: usize,
}

/// A key or `-` whose value starts on a later line.
struct Pending {
    path: FieldPath,
    col: usize,
    /// After `key:` a sequence may start at the key's own column; after `-` it may not.
    from_key: bool,
}

#[derive(Default)]
struct YamlIndexer {
    map: HashMap<String, usize>,
    stack: Vec<Frame>,
    pending: Option<Pending>,
}

/// Index block-style YAML: the line of every key and list item, by displayed path.
/// Flow collections (`{...}`, `[...]`) are treated as opaque values.
pub(crate) fn index_yaml(text: &str) -> HashMap<String, usize> {
    let mut ix = YamlIndexer::default();
    // Lines deeper than this column belong to a block scalar (`|`, `>`) and are skipped.
    let mut block_scalar: Option<usize> = None;
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let content = raw.trim_start_matches(' ');
        let indent = raw.len() - content.len();
        let content = content.trim_end();
        if let Some(col) = block_scalar {
            if content.is_empty() || indent > col {
                continue;
            }
            block_scalar = None;
        }
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        if indent == 0 && (content.starts_with("---") || content.starts_with("...")) {
            ix.stack.clear();
            ix.pending = None;
            continue;
        }
        block_scalar = ix.line(lineno, indent, content);
    }
    ix.map
}

impl YamlIndexer {
    /// Handle one significant line; returns the column a block scalar starts under, if any.
    fn line(&mut self, lineno: usize, indent: usize, content: &str) -> Option<usize> {
        let mut col = indent;
        let mut rest = content;
        let mut item: Option<FieldPath> = None;
        loop {
            if rest == "-" || rest.starts_with("- ") {
                let dash_col = col;
                let path = self.dash(dash_col, lineno)?;
                let after = &rest[1..];
                let trimmed = after.trim_start();
                col += 1 + (after.len() - trimmed.len());
                rest = trimmed;
                if rest.is_empty() || rest.starts_with('#') {
                    self.pending = Some(Pending {
                        path,
                        col: dash_col,
                        from_key: false,
                    });
                    return None;
                }
                if rest.starts_with('|') || rest.starts_with('>') {
                    return Some(dash_col);
                }
                item = Some(path);
                continue;
            }
            let (key, value) = split_key(rest)?;
            let parent = match item.take() {
                Some(item_path) => {
                    self.stack.push(Frame {
                        col,
                        path: item_path.clone(),
                        seq: false,
                        next_index: 0,
                    });
                    Some(item_path)
                }
                None => self.key_parent(col),
            }?;
            let path = parent.key(&key);
            self.map.entry(path.to_string()).or_insert(lineno);
            return match classify_value(value) {
                ValueKind::Later => {
                    self.pending = Some(Pending {
                        path,
                        col,
                        from_key: true,
                    });
                    None
                }
                ValueKind::BlockScalar => Some(col),
                ValueKind::Inline => None,
            };
        }
    }

    /// A `-` at `col`: returns the path of the list item it starts.
    fn dash(&mut self, col: usize, lineno: usize) -> Option<FieldPath> {
        if let Some(p) = self.pending.take()
            && (col > p.col || (p.from_key && col == p.col))
        {
            self.stack.push(Frame {
                col,
                path: p.path,
                seq: true,
                next_index: 0,
            });
        }
        while let Some(top) = self.stack.last() {
            if top.col > col || (top.col == col && !top.seq) {
                self.stack.pop();
            } else {
                break;
            }
        }
        let top = self.stack.last_mut()?;
        if !(top.seq && top.col == col) {
            return None;
        }
        let path = top.path.index(top.next_index);
        top.next_index += 1;
        self.map.entry(path.to_string()).or_insert(lineno);
        Some(path)
    }

    /// The mapping a key at `col` belongs to.
    fn key_parent(&mut self, col: usize) -> Option<FieldPath> {
        if let Some(p) = self.pending.take()
            && col > p.col
        {
            self.stack.push(Frame {
                col,
                path: p.path,
                seq: false,
                next_index: 0,
            });
        }
        while let Some(top) = self.stack.last() {
            if top.col > col || (top.col == col && top.seq) {
                self.stack.pop();
            } else {
                break;
            }
        }
        match self.stack.last() {
            Some(top) if !top.seq && top.col == col => Some(top.path.clone()),
            Some(_) => None,
            None => {
                self.stack.push(Frame {
                    col,
                    path: FieldPath::root(),
                    seq: false,
                    next_index: 0,
                });
                Some(FieldPath::root())
            }
        }
    }
}

enum ValueKind {
    /// Nothing after the colon (maybe an anchor or tag): the value is on the next lines.
    Later,
    BlockScalar,
    Inline,
}

fn classify_value(value: &str) -> ValueKind {
    let mut tokens = value
        .split_whitespace()
        .skip_while(|t| t.starts_with('&') || t.starts_with('!'));
    match tokens.next() {
        None => ValueKind::Later,
        Some(t) if t.starts_with('#') => ValueKind::Later,
        Some(t) if t.starts_with('|') || t.starts_with('>') => ValueKind::BlockScalar,
        Some(_) => ValueKind::Inline,
    }
}

/// `key: value` → (key, value). Quoted keys are unquoted; anything else is not a key.
fn split_key(rest: &str) -> Option<(String, &str)> {
    let first = rest.chars().next()?;
    if first == '"' || first == '\'' {
        let close = closing_quote(rest, first)?;
        let key = &rest[1..close];
        let after = rest[close + 1..].trim_start();
        let value = after.strip_prefix(':')?;
        if !(value.is_empty() || value.starts_with(' ')) {
            return None;
        }
        let key = if first == '"' {
            serde_json::from_str::<String>(&rest[..=close]).unwrap_or_else(|_| key.to_string())
        } else {
            key.replace("''", "'")
        };
        return Some((key, value.trim()));
    }
    if "[{#&*!|>%@`?".contains(first) {
        return None;
    }
    let pos = match rest.find(": ") {
        Some(pos) => pos,
        None if rest.ends_with(':') => rest.len() - 1,
        None => return None,
    };
    let key = rest[..pos].trim_end();
    if key.is_empty() {
        return None;
    }
    Some((key.to_string(), rest[pos + 1..].trim()))
}

/// Byte offset of the quote that closes the one at offset 0.
fn closing_quote(s: &str, quote: char) -> Option<usize> {
    let mut chars = s.char_indices().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        if quote == '"' && c == '\\' {
            chars.next();
        } else if c == quote {
            // '' inside single quotes is an escaped quote.
            if quote == '\'' && chars.peek().map(|(_, n)| *n) == Some('\'') {
                chars.next();
                continue;
            }
            return Some(i);
        }
    }
    None
}

/// What a JSON scan found: the line of every key and array element, and duplicate keys
/// (which serde_json would silently collapse to the last one).
#[derive(Debug, Default)]
pub(crate) struct JsonIndex {
    pub(crate) lines: HashMap<String, usize>,
    /// (path, first line, duplicate line)
    pub(crate) duplicates: Vec<(FieldPath, usize, usize)>,
}

/// Index a JSON text (already known to be valid, but any input is safe).
pub(crate) fn index_json(text: &str) -> JsonIndex {
    let mut scanner = JsonScanner {
        text,
        pos: 0,
        line: 1,
        index: JsonIndex::default(),
    };
    scanner.value(&FieldPath::root(), 0);
    scanner.index
}

struct JsonScanner<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
    index: JsonIndex,
}

/// Deeper than serde_json accepts anyway; the guard only keeps the scan bounded.
const MAX_JSON_DEPTH: usize = 256;

impl JsonScanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b'\n' => self.line += 1,
                b' ' | b'\t' | b'\r' => {}
                _ => return,
            }
            self.pos += 1;
        }
    }

    /// Stop scanning: used on anything unexpected.
    fn bail(&mut self) {
        self.pos = self.text.len();
    }

    fn value(&mut self, path: &FieldPath, depth: usize) {
        if depth > MAX_JSON_DEPTH {
            return self.bail();
        }
        self.skip_ws();
        match self.peek() {
            Some(b'{') => self.object(path, depth),
            Some(b'[') => self.array(path, depth),
            Some(b'"') => {
                self.string();
            }
            Some(_) => {
                while let Some(b) = self.peek() {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n') {
                        break;
                    }
                    self.pos += 1;
                }
            }
            None => {}
        }
    }

    /// Consume a string literal starting at `"`, returning its decoded text.
    fn string(&mut self) -> Option<String> {
        let start = self.pos;
        let bytes = self.text.as_bytes();
        let mut i = start + 1;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 2,
                b'"' => {
                    self.pos = i + 1;
                    let literal = self.text.get(start..=i)?;
                    return serde_json::from_str(literal).ok();
                }
                b'\n' => {
                    self.bail();
                    return None;
                }
                _ => i += 1,
            }
        }
        self.bail();
        None
    }

    fn object(&mut self, path: &FieldPath, depth: usize) {
        self.pos += 1;
        let mut seen: HashMap<String, usize> = HashMap::new();
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'}') => {
                    self.pos += 1;
                    return;
                }
                Some(b',') => self.pos += 1,
                Some(b'"') => {
                    let line = self.line;
                    let Some(key) = self.string() else {
                        return self.bail();
                    };
                    self.skip_ws();
                    if self.peek() != Some(b':') {
                        return self.bail();
                    }
                    self.pos += 1;
                    let child = path.key(&key);
                    match seen.get(&key) {
                        Some(first) => self.index.duplicates.push((child.clone(), *first, line)),
                        None => {
                            seen.insert(key, line);
                            self.index.lines.entry(child.to_string()).or_insert(line);
                        }
                    }
                    self.value(&child, depth + 1);
                }
                _ => return self.bail(),
            }
        }
    }

    fn array(&mut self, path: &FieldPath, depth: usize) {
        self.pos += 1;
        let mut n = 0;
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b']') => {
                    self.pos += 1;
                    return;
                }
                Some(b',') => self.pos += 1,
                Some(_) => {
                    let child = path.index(n);
                    self.index
                        .lines
                        .entry(child.to_string())
                        .or_insert(self.line);
                    n += 1;
                    let before = self.pos;
                    self.value(&child, depth + 1);
                    if self.pos == before {
                        return self.bail();
                    }
                }
                None => return,
            }
        }
    }
}

/// The first line (1-based) at which `text` nests mappings and lists deeper than `limit`.
///
/// A linear pre-scan that runs before any parser: YAML parsers spend quadratic time on deep
/// flow nesting (and JSON is YAML's flow style). It over-estimates rather than misses: block
/// nesting is counted from indentation and the compact indicators (`- `, `? `, `key: `) of a
/// line, flow nesting from brackets outside quoted scalars and comments, block scalars
/// (`|`, `>`) are skipped. Aliases are not expanded (the parser bounds those itself).
pub(crate) fn too_deep(text: &str, limit: usize) -> Option<usize> {
    let mut scan = DepthScan::default();
    for (i, raw) in text.lines().enumerate() {
        if scan.line(raw, limit) {
            return Some(i + 1);
        }
    }
    None
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Map,
    Seq,
}

#[derive(Default)]
struct DepthScan {
    /// Open block collections: (column, kind), columns non-decreasing.
    stack: Vec<(usize, Block)>,
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// Inside a quoted scalar that continues on the next line.
    quote: Option<u8>,
    /// Inside a block scalar: the column of its parent, and its content indent once known.
    block_scalar: Option<(usize, Option<usize>)>,
}

impl DepthScan {
    fn depth(&self) -> usize {
        self.stack.len() + self.flow
    }

    /// Scan one line; true when the depth went past `limit` on it.
    fn line(&mut self, raw: &str, limit: usize) -> bool {
        let content = raw.trim_start_matches(' ');
        let indent = raw.len() - content.len();
        let blank = content.trim().is_empty();
        if let Some((parent, content_indent)) = self.block_scalar {
            if blank {
                return false;
            }
            match content_indent {
                None if indent > parent => {
                    self.block_scalar = Some((parent, Some(indent)));
                    return false;
                }
                Some(ci) if indent >= ci => return false,
                _ => self.block_scalar = None,
            }
        }
        let bytes = raw.as_bytes();
        let mut pos = indent;
        if let Some(q) = self.quote {
            match skip_quoted(bytes, pos, q) {
                Some(end) => {
                    self.quote = None;
                    pos = end;
                }
                None => return false,
            }
            if self.flow == 0 {
                // The rest of a multi-line quoted scalar's last line: a comment at most.
                return false;
            }
        }
        if self.flow > 0 {
            return self.flow_scan(bytes, pos, limit);
        }
        if blank || content.starts_with('#') || (indent == 0 && content.starts_with('%')) {
            return false;
        }
        if indent == 0 && (content.starts_with("---") || content.starts_with("...")) {
            self.stack.clear();
            pos = 3;
        }
        self.block_scan(bytes, pos, indent, limit)
    }

    /// Record a block collection entry at `col`; true past the limit.
    fn open(&mut self, kind: Block, col: usize, limit: usize) -> bool {
        while self.stack.last().is_some_and(|(c, _)| *c > col) {
            self.stack.pop();
        }
        match self.stack.last() {
            Some(&(c, k)) if c == col && k == kind => {}
            // A key at a dash's column: the list was the value of the key before it.
            Some(&(c, Block::Seq)) if c == col && kind == Block::Map => {
                self.stack.pop();
                if !matches!(self.stack.last(), Some(&(c, Block::Map)) if c == col) {
                    self.stack.push((col, kind));
                }
            }
            _ => self.stack.push((col, kind)),
        }
        self.depth() > limit
    }

    fn block_scan(&mut self, bytes: &[u8], mut pos: usize, indent: usize, limit: usize) -> bool {
        let mut parent = indent;
        loop {
            while pos < bytes.len() && bytes[pos] == b' ' {
                pos += 1;
            }
            let Some(&c) = bytes.get(pos) else {
                return false;
            };
            let next_is_space = bytes.get(pos + 1).is_none_or(|b| *b == b' ' || *b == b'\t');
            match c {
                b'#' => return false,
                b'&' | b'!' => {
                    while pos < bytes.len() && bytes[pos] != b' ' {
                        pos += 1;
                    }
                }
                b'-' | b'?' if next_is_space => {
                    let kind = if c == b'-' { Block::Seq } else { Block::Map };
                    if self.open(kind, pos, limit) {
                        return true;
                    }
                    parent = pos;
                    pos += 1;
                }
                b':' if next_is_space => pos += 1,
                b'[' | b'{' => return self.flow_scan(bytes, pos, limit),
                b'|' | b'>' => {
                    self.block_scalar = Some((parent, None));
                    return false;
                }
                b'"' | b'\'' => match skip_quoted(bytes, pos + 1, c) {
                    None => {
                        self.quote = Some(c);
                        return false;
                    }
                    Some(end) => {
                        let after = end + count_spaces(&bytes[end..]);
                        let is_key = bytes.get(after) == Some(&b':')
                            && bytes.get(after + 1).is_none_or(|b| *b == b' ');
                        if !is_key {
                            return false;
                        }
                        if self.open(Block::Map, pos, limit) {
                            return true;
                        }
                        parent = pos;
                        pos = after + 1;
                    }
                },
                _ => {
                    let rest = std::str::from_utf8(&bytes[pos..]).unwrap_or("");
                    let Some((_, value)) = split_key(rest) else {
                        return false;
                    };
                    if self.open(Block::Map, pos, limit) {
                        return true;
                    }
                    parent = pos;
                    // `value` is a trimmed slice of `rest`: continue where it starts.
                    pos += value.as_ptr() as usize - rest.as_ptr() as usize;
                }
            }
        }
    }

    /// Count brackets from `pos` while inside flow collections (and from an opening bracket).
    fn flow_scan(&mut self, bytes: &[u8], mut pos: usize, limit: usize) -> bool {
        // The last significant byte: a quote only opens a scalar right after one of `[{,:`.
        let mut prev: Option<u8> = None;
        let mut after_space = true;
        while pos < bytes.len() {
            let c = bytes[pos];
            pos += 1;
            match c {
                b' ' | b'\t' | b'\r' => {
                    after_space = true;
                    continue;
                }
                b'#' if after_space => return false,
                b'"' | b'\'' if prev.is_none_or(|p| b"[{,:".contains(&p)) => {
                    match skip_quoted(bytes, pos, c) {
                        Some(end) => pos = end,
                        None => {
                            self.quote = Some(c);
                            return false;
                        }
                    }
                }
                b'[' | b'{' => {
                    self.flow += 1;
                    if self.depth() > limit {
                        return true;
                    }
                }
                b']' | b'}' => {
                    self.flow = self.flow.saturating_sub(1);
                    if self.flow == 0 {
                        return false;
                    }
                }
                _ => {}
            }
            prev = Some(c);
            after_space = false;
        }
        false
    }
}

fn count_spaces(bytes: &[u8]) -> usize {
    bytes.iter().take_while(|b| **b == b' ').count()
}

/// The offset just past the quote `q` that closes a scalar whose text starts at `pos`, or
/// `None` when it does not close on this line.
fn skip_quoted(bytes: &[u8], mut pos: usize, q: u8) -> Option<usize> {
    while pos < bytes.len() {
        let c = bytes[pos];
        if q == b'"' && c == b'\\' {
            pos += 2;
            continue;
        }
        if c == q {
            if q == b'\'' && bytes.get(pos + 1) == Some(&b'\'') {
                pos += 2;
                continue;
            }
            return Some(pos + 1);
        }
        pos += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn yaml_keys_and_items_get_their_lines() {
        let map = index_yaml(YAML);
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
        assert_eq!(line("tasks[1]"), Some(12));
        assert_eq!(line("tasks[1].task_id"), Some(13));
        assert_eq!(line("tasks[1].inputs.k"), Some(15));
        assert_eq!(line("tasks[1].url"), Some(16));
        assert_eq!(line("summary.fields[0]"), Some(19));
    }

    #[test]
    fn indented_sequences_are_indexed() {
        let map = index_yaml("tasks:\n  - task_id: a\n  - task_id: b\n    bogus: 1\nx: 1\n");
        assert_eq!(map.get("tasks[1].bogus"), Some(&4));
        assert_eq!(map.get("x"), Some(&5));
    }

    #[test]
    fn json_keys_elements_and_duplicates() {
        let text = "{\n  \"tasks\": [\n    {\"task_id\": \"a\"},\n    {\n      \"task_id\": \"b\",\n      \"task_id\": \"c\"\n    }\n  ]\n}";
        let ix = index_json(text);
        assert_eq!(ix.lines.get("tasks[0].task_id"), Some(&3));
        assert_eq!(ix.lines.get("tasks[1]"), Some(&4));
        assert_eq!(ix.lines.get("tasks[1].task_id"), Some(&5));
        assert_eq!(ix.duplicates.len(), 1);
        assert_eq!(ix.duplicates[0].1, 5);
        assert_eq!(ix.duplicates[0].2, 6);
    }

    #[test]
    fn nesting_depth_is_estimated_without_parsing() {
        let deep = |n: usize| too_deep(&format!("{}{}", "[".repeat(n), "]".repeat(n)), 64);
        assert_eq!(deep(64), None);
        assert_eq!(deep(65), Some(1));
        assert_eq!(too_deep(YAML, 4), None);
        assert_eq!(too_deep(YAML, 3), Some(15));
        // Block nesting: compact dashes on one line, and keys by indentation.
        assert_eq!(too_deep(&format!("{}x\n", "- ".repeat(65)), 64), Some(1));
        let mut keyed = String::new();
        for i in 0..70 {
            keyed.push_str(&format!("{}k{i}:\n", " ".repeat(i)));
        }
        assert_eq!(too_deep(&keyed, 64), Some(65));
        // A list under a key at the key's own column is a level of its own.
        let mut listed = String::new();
        for i in 0..40 {
            listed.push_str(&format!("{}- k{i}:\n", " ".repeat(2 * i)));
        }
        assert_eq!(too_deep(&listed, 64), Some(33));
        // Brackets in quotes, comments, plain scalars and block scalars do not count.
        let text = format!(
            "a: \"{0}\"\nb: '{0}'\nc: x{0} # {0}\nd: |\n  {0}\n  {0}\ne: {{\"k\": \"{0}\"}}\n",
            "[".repeat(100)
        );
        assert_eq!(too_deep(&text, 64), None);
        // JSON across lines.
        let json = format!("{{\n\"a\":\n{}1{}\n}}", "[\n".repeat(70), "]".repeat(70));
        assert_eq!(too_deep(&json, 64), Some(66));
    }

    #[test]
    fn garbage_does_not_panic() {
        for text in [
            "{\"a\": [1, {\"b\": \"\\",
            "- - - :",
            "\"unterminated: x",
            "{{{{",
            "]]",
        ] {
            let _ = index_json(text);
            let _ = index_yaml(text);
            let _ = too_deep(text, 2);
        }
    }
}
