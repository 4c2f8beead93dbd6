//! An attempt's scratch space on its host, outside the bundle: the harness's fresh working
//! directory, the input file `CASEBATCH_INPUT` names, and the directory `TMPDIR` names for
//! the attempt's processes. None is evidence (the input is in the attempt's spec; working and
//! temporary files are the harness's own business), so none costs the bundle an inode; all
//! are removed by the attempt's cleanup, so what a killed harness leaves in its temporary
//! directory (a browser's profile lock) does not pile up in the host's.
//!
//! The root is `CASEBATCH_SCRATCH_DIR` or `<temp dir>/casebatch-<uid>`, made `0700` and
//! refused unless it is a real directory of this user: other users of a shared temp directory
//! must not read inputs or plant links there. An attempt's entries are named after its marker
//! and directory ([`crate::host_name`]), and the job record names the working directory
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

/// This process's user (`/proc/self` belongs to it), read once: every attempt's scratch
/// root is checked against it.
fn own_uid() -> u32 {
    static UID: LazyLock<u32> =
        LazyLock::new(|| std::fs::metadata("/proc/self").map_or(0, |m| m.uid()));
    *UID
}

/// Where one attempt's scratch entries go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scratch {
    /// The working directory.
    pub workdir: PathBuf,
    /// The input file, beside it.
    pub input: PathBuf,
    /// The temporary directory, beside it under a short name: programs bind Unix sockets
    /// under `TMPDIR` (a browser's profile lock, Python's multiprocessing), and a socket's
    /// path is limited to 107 bytes, which a name carrying the batch id would eat.
    pub tmp: PathBuf,
}

impl Scratch {
    /// The attempt's entries under this host's root (what its job record then names).
    pub fn for_attempt(marker: &str, attempt_dir: &Path) -> Self {
        Self::at(root().join(crate::host_name(marker, attempt_dir)))
    }

    /// The attempt's entries as its job recorded them (else where this host puts them): a
    /// worker that adopts the job, whatever its own root, works in the same place.
    pub fn recorded(job: Option<&crate::records::JobRecord>, env: &crate::Attempt) -> Self {
        match job.and_then(|j| j.scratch.clone()) {
            Some(workdir) => Self::at(workdir),
            None => env.scratch(),
        }
    }

    /// The entries of the working directory `workdir` (the others are beside it).
    pub fn at(workdir: PathBuf) -> Self {
        let mut input = workdir.clone().into_os_string();
        input.push(".input.json");
        let short = crate::fnv1a(workdir.as_os_str().as_encoded_bytes());
        Self {
            input: input.into(),
            tmp: workdir.with_file_name(format!("{short:016x}.tmp")),
            workdir,
        }
    }

    /// Makes the root (if needed) and a fresh, empty working and temporary directory.
    pub fn create(&self) -> std::io::Result<()> {
        ensure_root(root())?;
        for dir in [&self.workdir, &self.tmp] {
            let make = || std::fs::DirBuilder::new().mode(0o700).create(dir);
            match make() {
                // Fresh: whatever an earlier provision of the attempt left is not carried over.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::remove_dir_all(dir)?;
                    make()?;
                }
                made => made?,
            }
        }
        Ok(())
    }

    /// Removes all three; what is already gone is fine.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
        let _ = std::fs::remove_dir_all(&self.tmp);
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
    fn an_attempts_entries_sit_side_by_side_and_its_tmpdir_has_a_short_name() {
        let long_marker = format!("{}/0/1", "b".repeat(150));
        let s = Scratch::at(PathBuf::from("/scratch").join(crate::host_name(
            &long_marker,
            Path::new("/bundles/b/cases/c/attempts/1"),
        )));
        assert!(s.workdir.as_os_str().len() > 150);
        assert_eq!(s.input.parent(), Some(Path::new("/scratch")));
        assert_eq!(s.tmp.parent(), Some(Path::new("/scratch")));
        assert_eq!(
            s.tmp.as_os_str().len(),
            "/scratch/".len() + 16 + ".tmp".len()
        );
        assert_eq!(
            Scratch::at(s.workdir.clone()),
            s,
            "derived from the workdir alone"
        );
    }

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

    #[test]
    fn a_second_create_starts_from_empty_directories_and_leaves_a_links_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let s = Scratch::at(dir.path().join("work"));
        s.create().unwrap();
        std::fs::write(s.workdir.join("left-over"), "x").unwrap();
        // An earlier provision's TMPDIR replaced by a link: the link goes, not what it names.
        let kept = dir.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(kept.join("file"), "y").unwrap();
        std::fs::remove_dir(&s.tmp).unwrap();
        std::os::unix::fs::symlink(&kept, &s.tmp).unwrap();
        s.create().unwrap();
        for made in [&s.workdir, &s.tmp] {
            let m = std::fs::symlink_metadata(made).unwrap();
            assert!(m.is_dir(), "{made:?}");
            assert_eq!(m.permissions().mode() & 0o777, 0o700, "{made:?}");
            assert_eq!(std::fs::read_dir(made).unwrap().count(), 0, "{made:?}");
        }
        assert_eq!(std::fs::read_to_string(kept.join("file")).unwrap(), "y");
        s.remove();
        assert!(!s.workdir.exists() && !s.tmp.exists());
    }
}
