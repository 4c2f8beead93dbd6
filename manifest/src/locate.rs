//! Lines of the fields of a JSON text, so problems can say where they are.
//!
//! serde_json keeps no positions, so after a successful parse the text is scanned once more
//! by a small tokenizer, which also finds duplicate keys (serde_json keeps the last silently).
//! It is tolerant: anything it does not understand is skipped, never an error or a panic.
//! YAML needs none of this: its parser reports positions (`yaml_syntax`).

use std::collections::HashMap;

use crate::report::FieldPath;

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

/// The first line (1-based) at which JSON text nests arrays and objects deeper than `limit`:
/// brackets counted outside strings, in linear time, before any parser recurses into them.
pub(crate) fn json_too_deep(text: &str, limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut line = 1;
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if b == b'\n' {
            line += 1;
        }
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn json_nesting_depth_is_counted_without_parsing() {
        let deep = |n: usize| json_too_deep(&format!("{}{}", "[".repeat(n), "]".repeat(n)), 64);
        assert_eq!(deep(64), None);
        assert_eq!(deep(65), Some(1));
        // Across lines, and brackets inside strings (escaped quotes too) do not count.
        let json = format!("{{\n\"a\":\n{}1{}\n}}", "[\n".repeat(70), "]".repeat(70));
        assert_eq!(json_too_deep(&json, 64), Some(66));
        let quoted = format!("{{\"k\": \"\\\"{}\"}}", "[".repeat(100));
        assert_eq!(json_too_deep(&quoted, 64), None);
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
            let _ = json_too_deep(text, 2);
        }
    }
}
