//! An attempt's scratch space on its host, outside the bundle: the harness's fresh working
//! directory and the input file `CASEBATCH_INPUT` names. Neither is evidence (the input is
//! in the attempt's spec; a working directory is the harness's own business), so neither
//! costs the bundle an inode; both are removed by the attempt's cleanup.
//!
//! The root is `CASEBATCH_SCRATCH_DIR` or `<temp dir>/casebatch-<uid>`, made `0700` and
//! refused unless it is a real directory of this user: other users of a shared temp directory
//! must not read inputs or plant links there. An attempt's entries are named after its marker
//! and directory ([`crate::cgroup::name_for`]), and the job record names the working directory
//! it used, so a worker that adopts the job (whatever its own root) evaluates and cleans up
//! in the same place.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// Environment variable of the worker (and agent): where attempts' scratch space goes.
pub const SCRATCH_DIR_ENV: &str = "CASEBATCH_SCRATCH_DIR";

static ROOT: LazyLock<PathBuf> = LazyLock::new(|| match std::env::var_os(SCRATCH_DIR_ENV) {
    Some(dir) if !dir.is_empty() => PathBuf::from(dir),
    _ => std::env::temp_dir().join(format!("casebatch-{}", own_uid())),
});

/// The host's scratch root (not created here).
pub fn root() -> &'static Path {
    &ROOT
}

/// This process's user (`/proc/self` belongs to it).
fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

/// Where one attempt's scratch entries go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scratch {
    /// The working directory.
    pub workdir: PathBuf,
    /// The input file, beside it.
    pub input: PathBuf,
}

impl Scratch {
    /// The attempt's entries under this host's root (what its job record then names).
    pub fn for_attempt(marker: &str, attempt_dir: &Path) -> Self {
        Self::at(root().join(crate::cgroup::name_for(marker, attempt_dir)))
    }

    /// The entries of the working directory `workdir` (the input file is beside it).
    pub fn at(workdir: PathBuf) -> Self {
        let mut input = workdir.clone().into_os_string();
        input.push(".input.json");
        Self {
            workdir,
            input: input.into(),
        }
    }

    /// Makes the root (if needed) and a fresh, empty working directory.
    pub fn create(&self) -> std::io::Result<()> {
        ensure_root(root())?;
        // Fresh: whatever an earlier provision of the attempt left is not carried over.
        if self.workdir.exists() {
            std::fs::remove_dir_all(&self.workdir)?;
        }
        std::fs::DirBuilder::new().mode(0o700).create(&self.workdir)
    }

    /// Removes both; what is already gone is fine.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
        let _ = std::fs::remove_file(&self.input);
    }
}

fn ensure_root(root: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(root)?;
    let refuse = |why: &str| {
        Err(std::io::Error::other(format!(
            "scratch directory {}: {why} (set {SCRATCH_DIR_ENV} to a directory of your own)",
            root.display()
        )))
    };
    if !m.is_dir() {
        return refuse("not a directory");
    }
    if m.uid() != own_uid() {
        return refuse("owned by another user");
    }
    if m.permissions().mode() & 0o022 != 0 {
        return refuse("writable by other users");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_others_can_write_or_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ensure_root(&open).is_err());
        let link = dir.path().join("link");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(ensure_root(&link).is_err());
        let fresh = dir.path().join("a/b");
        ensure_root(&fresh).unwrap();
        assert_eq!(
            std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
