//! batch_v1 manifests: runspec paths confined to the manifest's tree, single runs only.

mod common;

use std::path::{Path, PathBuf};

use casebatch_manifest::{ManifestFormat, RuntimeKind};
use common::*;

/// A manifest directory `root/m/` with a file outside it (`root/secret.yaml`) and two
/// valid runspecs inside.
struct Tree {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    dir: PathBuf,
}

impl Tree {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let dir = root.join("m");
        write(&root, "secret.yaml", "query: outside the tree\n");
        write(&dir, "cases/a.yaml", "query: first\nmax_steps: 3\n");
        write(
            &dir,
            "cases/b.json",
            "{\"query\": \"second\", \"harness\": [\"./own.sh\"]}\n",
        );
        // The default harness next to the manifest, b's own next to its runspec.
        program(&dir, "run.sh");
        program(&dir, "cases/own.sh");
        Tree {
            _tmp: tmp,
            root,
            dir,
        }
    }

    /// Write `batch.yaml` with these `(label, runspec)` cases.
    fn manifest(&self, cases: &[(&str, &str)]) -> PathBuf {
        let mut text = String::from(
            "schema_version: batch_v1\ndefaults:\n  harness: ./run.sh\nbatch:\n  cases:\n",
        );
        for (label, runspec) in cases {
            text.push_str(&format!("    - label: {label}\n      runspec: {runspec}\n"));
        }
        write(&self.dir, "batch.yaml", &text)
    }
}

fn line_of_case(i: usize) -> Option<usize> {
    // Cases start at line 6; each takes two lines; `runspec:` is the second.
    Some(6 + 2 * i + 1)
}

#[test]
fn a_valid_batch_v1_plans_with_resolved_runspecs() {
    let tree = Tree::new();
    let path = tree.manifest(&[("first", "cases/a.yaml"), ("second", "./cases/b.json")]);
    let plan = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.provenance.format, ManifestFormat::BatchV1);
    assert_eq!(plan.batch_id, "batch", "batch id defaults to the file stem");
    assert_eq!(plan.cases.len(), 2);
    let a = &plan.cases[0];
    assert_eq!(a.case_id, "first");
    assert_eq!(a.input["query"], "first");
    assert_eq!(a.input["max_steps"], 3);
    assert_eq!(a.runtime, RuntimeKind::LocalProcess);
    assert_eq!(
        a.source.runspec.as_deref(),
        Some(tree.dir.join("cases/a.yaml").to_str().unwrap())
    );
    assert_eq!(a.source.line, Some(6));
    // The case's own harness wins over the default; a program path resolves against the
    // directory of the file that writes it: the manifest's, or the runspec's.
    assert_eq!(
        serde_json::to_value(&a.harness).unwrap(),
        serde_json::json!(tree.dir.join("run.sh").display().to_string())
    );
    let b = &plan.cases[1];
    assert_eq!(
        serde_json::to_value(&b.harness).unwrap(),
        serde_json::json!([tree.dir.join("cases/own.sh").display().to_string()])
    );
}

#[test]
fn dot_dot_escapes_are_refused() {
    let tree = Tree::new();
    let path = tree.manifest(&[("a", "../secret.yaml"), ("b", "cases/../../secret.yaml")]);
    let err = load(&path).unwrap_err();
    let p = says(
        &err,
        "batch.cases[0].runspec",
        "escapes the manifest's directory through `..`",
    );
    assert_eq!(p.line, line_of_case(0));
    says(&err, "batch.cases[1].runspec", "escapes");
}

#[test]
fn absolute_paths_outside_are_refused_and_inside_accepted() {
    let tree = Tree::new();
    let outside = tree.root.join("secret.yaml");
    let inside = tree.dir.join("cases/a.yaml");
    let path = tree.manifest(&[
        ("a", outside.to_str().unwrap()),
        ("b", inside.to_str().unwrap()),
    ]);
    let err = load(&path).unwrap_err();
    says(
        &err,
        "batch.cases[0].runspec",
        "outside the manifest's directory",
    );
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[cfg(unix)]
#[test]
fn symlinks_resolving_outside_are_refused() {
    let tree = Tree::new();
    std::os::unix::fs::symlink(
        tree.root.join("secret.yaml"),
        tree.dir.join("cases/link.yaml"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&tree.root, tree.dir.join("up")).unwrap();
    // A symlink that stays inside is fine.
    std::os::unix::fs::symlink(tree.dir.join("cases/a.yaml"), tree.dir.join("alias.yaml")).unwrap();
    let path = tree.manifest(&[
        ("a", "cases/link.yaml"),
        ("b", "up/secret.yaml"),
        ("c", "alias.yaml"),
    ]);
    let err = load(&path).unwrap_err();
    says(&err, "batch.cases[0].runspec", "through a symlink");
    says(&err, "batch.cases[1].runspec", "through a symlink");
    assert_eq!(err.problems.len(), 2, "{err}");
}

#[test]
fn missing_runspec_and_directories_are_refused() {
    let tree = Tree::new();
    let path = tree.manifest(&[("a", "cases/nope.yaml"), ("b", "cases"), ("c", "''")]);
    let err = load(&path).unwrap_err();
    says(&err, "batch.cases[0].runspec", "does not exist");
    says(&err, "batch.cases[1].runspec", "is a directory");
    says(&err, "batch.cases[2].runspec", "empty");
}

#[test]
fn sweeps_are_refused() {
    let tree = Tree::new();
    write(&tree.dir, "cases/list.yaml", "- query: one\n- query: two\n");
    write(
        &tree.dir,
        "cases/matrix.yaml",
        "query: q\nmatrix:\n  model: [a, b]\n",
    );
    write(
        &tree.dir,
        "cases/sweep.json",
        "{\"sweep\": {\"seed\": [1, 2]}}",
    );
    write(&tree.dir, "cases/tasks.yaml", "tasks:\n  - task_id: x\n");
    let path = tree.manifest(&[
        ("a", "cases/list.yaml"),
        ("b", "cases/matrix.yaml"),
        ("c", "cases/sweep.json"),
        ("d", "cases/tasks.yaml"),
    ]);
    let err = load(&path).unwrap_err();
    for i in 0..4 {
        let p = says(&err, &format!("batch.cases[{i}].runspec"), "is a sweep");
        assert!(
            p.message
                .contains("batch_v1 needs a single-run spec per case"),
            "{err}"
        );
        assert_eq!(p.line, line_of_case(i));
    }
}

#[test]
fn duplicate_labels_and_runspecs_are_refused() {
    let tree = Tree::new();
    let path = tree.manifest(&[
        ("same", "cases/a.yaml"),
        ("same", "cases/b.json"),
        ("other", "cases/../cases/a.yaml"),
    ]);
    let err = load(&path).unwrap_err();
    let p = says(&err, "batch.cases[1].label", "duplicate case id \"same\"");
    assert_eq!(p.line, Some(8));
    says(
        &err,
        "batch.cases[2].runspec",
        "already used by batch.cases[0].runspec at line 7",
    );
}

#[test]
fn runspec_problems_name_the_runspec_file() {
    let tree = Tree::new();
    write(
        &tree.dir,
        "cases/bad.yaml",
        "query: q\nmax_stpes: 3\ntask_id: nope\nruntime: local-process\nharness: ''\n",
    );
    write(&tree.dir, "cases/broken.yaml", "query: [\n");
    let path = tree.manifest(&[("a", "cases/bad.yaml"), ("b", "cases/broken.yaml")]);
    let err = load(&path).unwrap_err();
    let p = says(
        &err,
        "batch.cases[0].runspec.max_stpes",
        "in cases/bad.yaml line 2: unknown field",
    );
    assert_eq!(p.line, line_of_case(0));
    assert!(p.fix.contains("`max_steps`"));
    says(&err, "batch.cases[0].runspec.task_id", "label");
    says(&err, "batch.cases[0].runspec.harness", "empty");
    says(&err, "batch.cases[1].runspec", "malformed YAML");
}

#[test]
fn wrong_schema_version_and_shape() {
    let tree = Tree::new();
    let path = write(
        &tree.dir,
        "v2.yaml",
        "schema_version: batch_v2\nbatch:\n  cases:\n    - label: a\n      runspec: cases/a.yaml\n      extra: 1\n  summary:\n    fields: ['']\n",
    );
    let err = load(&path).unwrap_err();
    says(&err, "schema_version", "unsupported schema_version");
    says(&err, "batch.cases[0].extra", "unknown field");
    says(&err, "batch.summary.fields[0]", "empty");
    let path = write(
        &tree.dir,
        "empty.yaml",
        "schema_version: batch_v1\nbatch:\n  cases: []\n",
    );
    let err = load(&path).unwrap_err();
    says(&err, "batch.cases", "empty");
}

#[test]
fn runspecs_resolve_relative_to_the_manifest_not_the_cwd() {
    let tree = Tree::new();
    let path = tree.manifest(&[("a", "cases/a.yaml")]);
    // A relative manifest path from another directory would also work; here just check that
    // the resolved path is absolute and under the manifest's directory.
    let plan = load(&path).unwrap();
    let runspec = plan.cases[0].source.runspec.clone().unwrap();
    assert!(Path::new(&runspec).is_absolute());
    assert!(Path::new(&runspec).starts_with(&tree.dir));
}
