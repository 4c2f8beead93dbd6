//! The error a refused manifest produces: every problem found, each with a place and a fix.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

/// One thing wrong with a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Problem {
    /// 1-based line in the manifest, where known.
    pub line: Option<usize>,
    /// Field path such as `tasks[3].task_id` or `defaults.concurrency`.
    pub field: String,
    pub message: String,
    /// A concrete next step for the user.
    pub fix: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (fix: {})", self.field, self.message, self.fix)
    }
}

/// A manifest was refused. Holds all problems at once so users fix them in one pass.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.render())]
pub struct ManifestError {
    /// The manifest as the caller named it.
    pub file: PathBuf,
    pub problems: Vec<Problem>,
}

impl ManifestError {
    pub(crate) fn new(file: impl Into<PathBuf>, problems: Vec<Problem>) -> Self {
        ManifestError {
            file: file.into(),
            problems,
        }
    }

    /// `failed to load manifest FILE: N problem(s)` then `FILE:LINE: FIELD: MESSAGE (fix: ...)`
    /// per problem (`FILE: ...` where the line is unknown). The same problem on many list
    /// elements (twelve tasks with one unknown field) is shown once, at its first place,
    /// followed by `  and N more like it: LINES` naming where the others are.
    fn render(&self) -> String {
        let file = self.file.display();
        let mut out = format!(
            "failed to load manifest {file}: {} problem(s)",
            self.problems.len()
        );
        for (p, others) in group_alike(&self.problems) {
            match p.line {
                Some(line) => out.push_str(&format!("\n{file}:{line}: {p}")),
                None => out.push_str(&format!("\n{file}: {p}")),
            }
            if !others.is_empty() {
                let lines: Vec<String> = others
                    .iter()
                    .filter_map(|o| o.line.map(|l| l.to_string()))
                    .collect();
                let mut places = Vec::new();
                if !lines.is_empty() {
                    places.push(format!("lines {}", lines.join(", ")));
                }
                places.extend(
                    others
                        .iter()
                        .filter(|o| o.line.is_none())
                        .map(|o| o.field.clone()),
                );
                out.push_str(&format!(
                    "\n  and {} more like it, at {}",
                    others.len(),
                    places.join("; ")
                ));
            }
        }
        out
    }
}

/// Problems in order, each with the later ones that say the same thing about another element
/// of the same list: equal once list indices are blanked out of field, message and fix.
fn group_alike(problems: &[Problem]) -> Vec<(&Problem, Vec<&Problem>)> {
    let key = |p: &Problem| [&p.field, &p.message, &p.fix].map(|text| without_indices(text));
    let mut groups: Vec<(&Problem, Vec<&Problem>)> = Vec::new();
    let mut at: std::collections::HashMap<[String; 3], usize> = std::collections::HashMap::new();
    for p in problems {
        let k = key(p);
        // Only problems about list elements group: two fields of one object never do.
        if k[0] != p.field
            && let Some(&i) = at.get(&k)
        {
            groups[i].1.push(p);
            continue;
        }
        at.insert(k, groups.len());
        groups.push((p, Vec::new()));
    }
    groups
}

/// `tasks[12].colour` → `tasks[].colour`.
fn without_indices(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 && rest[digits..].starts_with(']') {
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// Pseudo-field for problems with the file as a whole.
pub(crate) const FILE_FIELD: &str = "(file)";
/// Pseudo-field for syntax errors.
pub(crate) const SYNTAX_FIELD: &str = "(syntax)";

/// The refusal of mappings and lists nested past [`crate::limits::MAX_NESTING_DEPTH`], at `line`.
pub(crate) fn too_deep_problem(line: usize) -> Problem {
    Problem {
        line: Some(line),
        field: SYNTAX_FIELD.into(),
        message: format!(
            "mappings and lists are nested more than {} levels deep here",
            crate::limits::MAX_NESTING_DEPTH
        ),
        fix: "flatten the structure (a manifest needs a handful of levels); deep data belongs \
              in a file the harness reads, named in `inputs`"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_lists_every_problem_with_file_and_line() {
        let err = ManifestError::new(
            "m.yaml",
            vec![
                Problem {
                    line: Some(4),
                    field: "tasks[1].task_id".into(),
                    message: "duplicate".into(),
                    fix: "rename".into(),
                },
                Problem {
                    line: None,
                    field: "batch_id".into(),
                    message: "missing".into(),
                    fix: "add it".into(),
                },
            ],
        );
        assert_eq!(
            err.to_string(),
            "failed to load manifest m.yaml: 2 problem(s)\n\
             m.yaml:4: tasks[1].task_id: duplicate (fix: rename)\n\
             m.yaml: batch_id: missing (fix: add it)"
        );
    }

    #[test]
    fn the_same_problem_on_many_elements_is_shown_once_with_their_places() {
        let unknown = |i: usize, line: Option<usize>| Problem {
            line,
            field: format!("tasks[{i}].colour"),
            message: "unknown field `colour`".into(),
            fix: format!("remove tasks[{i}].colour"),
        };
        let mut problems: Vec<Problem> = (0..12).map(|i| unknown(i, Some(5 + 2 * i))).collect();
        problems.insert(
            3,
            Problem {
                line: Some(9),
                field: "tasks[2].task_id".into(),
                message: "duplicate case id \"a\"".into(),
                fix: "rename".into(),
            },
        );
        problems.push(unknown(12, None));
        let err = ManifestError::new("m.yaml", problems);
        assert_eq!(
            err.to_string(),
            "failed to load manifest m.yaml: 14 problem(s)\n\
             m.yaml:5: tasks[0].colour: unknown field `colour` (fix: remove tasks[0].colour)\n  \
             and 12 more like it, at lines 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27; \
             tasks[12].colour\n\
             m.yaml:9: tasks[2].task_id: duplicate case id \"a\" (fix: rename)"
        );
        assert_eq!(without_indices("a[1][22].b [x] [3"), "a[][].b [x] [3");
    }
}
