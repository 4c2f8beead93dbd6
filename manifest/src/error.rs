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
    /// per problem (`FILE: ...` where the line is unknown).
    fn render(&self) -> String {
        let file = self.file.display();
        let mut out = format!(
            "failed to load manifest {file}: {} problem(s)",
            self.problems.len()
        );
        for p in &self.problems {
            match p.line {
                Some(line) => out.push_str(&format!("\n{file}:{line}: {p}")),
                None => out.push_str(&format!("\n{file}: {p}")),
            }
        }
        out
    }
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
}
