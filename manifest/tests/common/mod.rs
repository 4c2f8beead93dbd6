//! Helpers shared by the integration tests: temporary manifests and readable assertions.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use casebatch_manifest::{LoadOptions, ManifestError, Plan, Problem, load_plan};

/// The workspace's `examples/` folder.
pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// Write `text` to `dir/name` (creating parent folders) and return the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// An executable stub at `dir/rel`: a program a manifest names by path must exist and be
/// executable (the harness preflight), as it would in a real workspace.
pub fn program(dir: &Path, rel: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = write(dir, rel, "#!/bin/sh\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The programs the manifests of these tests name by relative path, next to them.
pub const PROGRAMS: &[&str] = &["run.sh", "run", "x", "manifest.sh", "own.sh"];

/// Stubs of [`PROGRAMS`] in `dir`.
pub fn programs(dir: &Path) {
    for name in PROGRAMS {
        program(dir, name);
    }
}

/// A fresh temp dir holding [`PROGRAMS`], for a test that writes its manifests there.
pub fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    programs(dir.path());
    dir
}

pub fn load(path: &Path) -> Result<Plan, ManifestError> {
    load_plan(path, &LoadOptions::default())
}

/// A manifest in a fresh temp dir (with [`PROGRAMS`]), loaded with default options; must be
/// refused.
pub fn refuse(name: &str, text: &str) -> ManifestError {
    let dir = tempfile::tempdir().unwrap();
    programs(dir.path());
    let path = write(dir.path(), name, text);
    match load(&path) {
        Ok(plan) => panic!("{name} was accepted: {plan:#?}"),
        Err(e) => e,
    }
}

/// A manifest in a fresh temp dir (with [`PROGRAMS`]), loaded with default options; must be
/// accepted.
pub fn accept(name: &str, text: &str) -> Plan {
    let dir = tempfile::tempdir().unwrap();
    programs(dir.path());
    let path = write(dir.path(), name, text);
    load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The one problem about `field`, with the whole error shown on failure.
pub fn problem<'a>(err: &'a ManifestError, field: &str) -> &'a Problem {
    let found: Vec<&Problem> = err.problems.iter().filter(|p| p.field == field).collect();
    assert_eq!(found.len(), 1, "expected one problem at {field}:\n{err}");
    found[0]
}

/// Assert that `p` says `needle` in its message (the whole error shown on failure).
pub fn says(err: &ManifestError, field: &str, needle: &str) -> Problem {
    let p = problem(err, field);
    assert!(
        p.message.contains(needle),
        "problem at {field} does not mention {needle:?}:\n{err}"
    );
    assert!(!p.fix.is_empty(), "problem at {field} has no fix:\n{err}");
    p.clone()
}

/// A tasks manifest with a harness, so only the tasks part varies.
pub fn with_tasks(tasks: &str) -> String {
    format!("batch_id: t\ndefaults:\n  harness: ./run.sh\ntasks:\n{tasks}")
}
