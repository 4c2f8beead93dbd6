//! What planning is handed, whichever shape the manifest has: the manifest's declarations
//! ([`Loaded`], one [`CaseDecl`] per case), the defaults file's ([`FileDefaults`]) and the
//! command line's ([`LoadOptions`], public at the crate root), gathered in [`PlanInput`].
//!
//! Each shape (`yaml`, `jsonl`, `batch_v1`) reads its own layout and produces these; planning
//! reads only these, so it never depends on a shape and the shapes never depend on it. Nothing
//! here is resolved yet: no layer is merged and no runtime name is looked up.

use std::path::{Path, PathBuf};

use crate::model::{Defaults, Epoch, ManifestFormat, RunSpec, SummarySpec};
use crate::report::FieldPath;
use crate::runtimes::Table;

/// What every manifest shape produces before planning.
pub(crate) struct Loaded {
    pub(crate) format: ManifestFormat,
    /// The batch id written in the manifest, and where.
    pub(crate) batch_id: Option<(String, FieldPath)>,
    pub(crate) defaults: Defaults,
    pub(crate) summary: SummarySpec,
    /// The manifest's own `runtimes:` table.
    pub(crate) runtimes: Table,
    pub(crate) cases: Vec<CaseDecl>,
}

/// One declared case, not yet combined with the defaults.
#[derive(Clone)]
pub(crate) struct CaseDecl {
    pub(crate) id: String,
    /// Where the id is written (`tasks[3].task_id`, `batch.cases[0].label`, `id`).
    pub(crate) id_path: FieldPath,
    /// The case as a whole.
    pub(crate) path: FieldPath,
    /// Where the case's own settings live (the runspec for batch_v1).
    pub(crate) spec_path: FieldPath,
    pub(crate) line: Option<usize>,
    pub(crate) spec: RunSpec,
    pub(crate) runspec: Option<String>,
    /// Set by planning on each run of a task that runs several times (`epochs`).
    pub(crate) epoch: Option<Epoch>,
}

/// Everything besides the loaded manifest that the plan depends on.
pub(crate) struct PlanInput<'a> {
    pub(crate) manifest: &'a Path,
    pub(crate) bytes: &'a [u8],
    pub(crate) opts: &'a LoadOptions,
    pub(crate) file_defaults: FileDefaults,
    /// The `--runtimes` file's table, and the file.
    pub(crate) runtimes_file: Option<(Table, &'a Path)>,
}

/// The settings of `--defaults-file`, and where its `runtime` name is written (the name is
/// checked against the runtimes table later, when the table is known).
#[derive(Debug, Default)]
pub(crate) struct FileDefaults {
    pub(crate) defaults: Defaults,
    /// Its `summary:`, when written in the manifest's shape: the summary of a batch whose
    /// manifest sets none (a JSONL task list has no place for one).
    pub(crate) summary: Option<SummarySpec>,
    pub(crate) file: PathBuf,
    pub(crate) runtime_line: Option<usize>,
    /// Where its `harness` and `evaluator` are written (a program they name is checked once
    /// the cases that inherit them are known).
    pub(crate) harness_line: Option<usize>,
    pub(crate) evaluator_line: Option<usize>,
}

/// How to load a manifest: what command-line flags said.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// `--batch-id`. Wins over the manifest's own; required for JSONL and batch_v1 unless the
    /// file stem is a valid id.
    pub batch_id: Option<String>,
    /// Settings from flags (`--concurrency`/`--parallelism`, `--max-retries`, `--runtime`,
    /// `--harness`, ...). Flags win over the manifest's defaults; a task's own fields win
    /// over flags.
    pub overrides: Defaults,
    /// A YAML/JSON file of defaults (a `defaults:` object and optionally `summary:`, or the
    /// defaults' fields at its top level): the settings of a JSONL manifest. Lowest
    /// precedence; also honoured for the other shapes.
    pub defaults_file: Option<PathBuf>,
    /// Soft threshold: more cases only add a warning to
    /// [`Plan::warnings`](crate::Plan::warnings).
    pub max_cases: Option<usize>,
    /// `--runtimes FILE`: a YAML/JSON file whose only key is `runtimes:`, merged with the
    /// manifest's own table (a name may be declared in only one of them). Any shape.
    pub runtimes_file: Option<PathBuf>,
}
