//! Collecting problems while a manifest is read: field paths, their lines, and sub-files.
//!
//! Parsing never stops at the first problem; every check pushes into a [`Report`] and the
//! caller decides at the end whether anything was wrong.

use std::collections::HashMap;
use std::fmt;

use crate::error::Problem;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A path into a manifest document, displayed as `tasks[3].task_id`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(Vec<Seg>);

impl FieldPath {
    pub(crate) fn root() -> Self {
        FieldPath(Vec::new())
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_string()));
        FieldPath(segs)
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        FieldPath(segs)
    }

    pub(crate) fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The name of the field the path ends at (`None` at a list element or the root).
    pub(crate) fn last_key(&self) -> Option<&str> {
        match self.0.last()? {
            Seg::Key(k) => Some(k),
            Seg::Index(_) => None,
        }
    }

    /// The path itself, then each shorter prefix: used to fall back to the nearest known line.
    fn prefixes(&self) -> impl Iterator<Item = FieldPath> + '_ {
        (1..=self.0.len())
            .rev()
            .map(|n| FieldPath(self.0[..n].to_vec()))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(document)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => f.write_str(k)?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// Maps field paths to 1-based lines of one source text.
#[derive(Debug, Default)]
pub(crate) enum Locator {
    /// Nothing known (for example values that came from command-line flags).
    #[default]
    Unknown,
    /// Everything is on one line (a JSONL record).
    Fixed(usize),
    /// Path (as displayed) to the line where its key or list item starts.
    Index(HashMap<String, usize>),
}

impl Locator {
    /// Exact line of `path`, or of its nearest located ancestor.
    pub(crate) fn line(&self, path: &FieldPath) -> Option<usize> {
        match self {
            Locator::Unknown => None,
            Locator::Fixed(line) => Some(*line),
            Locator::Index(map) => path
                .prefixes()
                .find_map(|p| map.get(&p.to_string()).copied()),
        }
    }
}

/// Problems found so far in one source text.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) problems: Vec<Problem>,
    locator: Locator,
}

impl Report {
    pub(crate) fn new(locator: Locator) -> Self {
        Report {
            problems: Vec::new(),
            locator,
        }
    }

    /// Point at a source text once it has been parsed.
    pub(crate) fn set_locator(&mut self, locator: Locator) {
        self.locator = locator;
    }

    pub(crate) fn line_of(&self, path: &FieldPath) -> Option<usize> {
        self.locator.line(path)
    }

    /// A problem at `path`, located through this report's source text.
    pub(crate) fn at(
        &mut self,
        path: &FieldPath,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        let line = self.line_of(path);
        self.at_line(line, path.to_string(), message, fix);
    }

    /// A problem whose line the caller already knows.
    pub(crate) fn at_line(
        &mut self,
        line: Option<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.problems.push(Problem {
            line,
            field: field.into(),
            message: message.into(),
            fix: fix.into(),
        });
    }

    pub(crate) fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// Take over the problems of another file (a runspec, a defaults file). Their lines refer
    /// to that file, so they move into the message and `anchor` (the line in this file that
    /// referenced it, if any) becomes the problem's line.
    pub(crate) fn absorb(
        &mut self,
        sub: Report,
        file_label: &str,
        prefix: &FieldPath,
        anchor: Option<usize>,
    ) {
        for p in sub.problems {
            let field = join_field(prefix, &p.field);
            let place = match p.line {
                Some(line) => format!("in {file_label} line {line}"),
                None => format!("in {file_label}"),
            };
            self.problems.push(Problem {
                line: anchor,
                field,
                message: format!("{place}: {}", p.message),
                fix: p.fix,
            });
        }
    }
}

/// `prefix` + a sub-file's field; the sub-file's pseudo-fields like `(syntax)` collapse
/// into the prefix.
fn join_field(prefix: &FieldPath, field: &str) -> String {
    if prefix.is_root() {
        return field.to_string();
    }
    if field.starts_with('(') || field.is_empty() {
        return prefix.to_string();
    }
    if field.starts_with('[') {
        format!("{prefix}{field}")
    } else {
        format!("{prefix}.{field}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_display_like_the_manifest() {
        let p = FieldPath::root().key("tasks").index(3).key("task_id");
        assert_eq!(p.to_string(), "tasks[3].task_id");
        assert_eq!(FieldPath::root().to_string(), "(document)");
    }

    #[test]
    fn absorbed_problems_name_the_sub_file() {
        let mut sub = Report::new(Locator::Fixed(7));
        sub.at(&FieldPath::root().key("qurey"), "unknown field", "rename");
        let mut main = Report::default();
        let prefix = FieldPath::root()
            .key("batch")
            .key("cases")
            .index(0)
            .key("runspec");
        main.absorb(sub, "cases/a.yaml", &prefix, Some(3));
        let p = &main.problems[0];
        assert_eq!(p.line, Some(3));
        assert_eq!(p.field, "batch.cases[0].runspec.qurey");
        assert_eq!(p.message, "in cases/a.yaml line 7: unknown field");
    }
}
