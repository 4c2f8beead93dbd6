//! Atomic JSON writes (temp file + rename), so a crash never leaves a half-written record.
//!
//! Records are not fsynced: the rename makes them atomic against process crashes (the failure
//! model of a batch: SIGKILLed workers, restarted engines), and forcing every record to disk
//! costs more than the rest of a case's bookkeeping together. Durable state lives in Temporal.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::BundleError;

/// `value` as pretty JSON, atomically ([`write_atomic`]). Streamed into the temp file: a batch
/// file of 100,000 cases is never held as one buffer beside the records it is made of.
pub fn write_json_atomic<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), BundleError> {
    prepare_json_atomic(path, value)?.persist()
}

/// [`write_json_atomic`] up to its rename: the file is written and takes its place when
/// [`Prepared::persist`] is called, or is removed when it is dropped.
pub(crate) fn prepare_json_atomic<T: Serialize + ?Sized>(
    path: &Path,
    value: &T,
) -> Result<Prepared, BundleError> {
    prepare_atomic(path, |out| {
        let mut out = std::io::BufWriter::new(out);
        serde_json::to_writer_pretty(&mut out, value).map_err(std::io::Error::from)?;
        out.write_all(b"\n")?;
        out.flush()
    })
}

/// `bytes`, atomically ([`write_atomic`]).
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<(), BundleError> {
    write_atomic(path, |out| out.write_all(bytes))
}

/// Writes through `fill` into a fresh temp file beside `path`, then renames it over `path`.
/// The temp file is created exclusively under a random name (`tempfile`: `O_CREAT|O_EXCL`,
/// which never follows a symlink, retried under a new name if taken), so a file planted at its
/// name by an attempt's processes is never written through; the rename replaces whatever entry
/// `path` was (a symlink or FIFO included) without opening it. A failed write removes the temp
/// file.
fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> Result<(), BundleError> {
    prepare_atomic(path, fill)?.persist()
}

/// A file written beside its path, not yet renamed over it.
pub(crate) struct Prepared {
    tmp: tempfile::NamedTempFile,
    path: std::path::PathBuf,
}

impl Prepared {
    /// Renames the file over its path.
    pub(crate) fn persist(self) -> Result<(), BundleError> {
        let path = self.path;
        self.tmp.persist(&path).map_err(|e| BundleError::Write {
            path: path.display().to_string(),
            source: e.error,
        })?;
        Ok(())
    }
}

/// [`write_atomic`] up to its rename.
fn prepare_atomic(
    path: &Path,
    fill: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> Result<Prepared, BundleError> {
    let werr = |source| BundleError::Write {
        path: path.display().to_string(),
        source,
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(parent).map_err(werr)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        // tempfile's default is 0600; bundle files keep the mode a plain create gives them
        // (0666 less the umask), as readers of a bundle expect.
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(parent)
        .map_err(werr)?;
    fill(tmp.as_file_mut()).map_err(werr)?;
    Ok(Prepared {
        tmp,
        path: path.to_path_buf(),
    })
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, BundleError> {
    let bytes = fs::read(path).map_err(|source| BundleError::Read {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| BundleError::Parse {
        path: path.display().to_string(),
        source,
    })
}

/// [`read_json`] of a record that may not have been written yet: `None` only when nothing is
/// at `path`. Anything else that stops the read (a directory where the file belongs, a file
/// where a directory belongs, truncated or invalid JSON) is an error naming the file, so a
/// damaged record is never taken for one not written yet: a finished case for a queued one.
pub fn read_json_if_present<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, BundleError> {
    match fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BundleError::Read {
            path: path.display().to_string(),
            source,
        }),
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| BundleError::Parse {
                    path: path.display().to_string(),
                    source,
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn bytes_land_intact_and_nothing_else_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("trace.bin");
        let bytes: Vec<u8> = (0..=255u8).collect();
        write_bytes_atomic(&path, &bytes).unwrap();
        write_bytes_atomic(&path, &bytes).unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes);
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
        // Not tempfile's 0600: what a plain create gives (0666 less the umask).
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o600, 0o600);
    }

    #[test]
    fn only_a_missing_record_reads_as_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        let read = |p: &Path| read_json_if_present::<serde_json::Value>(p);
        assert!(read(&path).unwrap().is_none());
        assert!(
            read(&dir.path().join("no-dir/result.json"))
                .unwrap()
                .is_none()
        );
        fs::write(&path, b"{\"state\": \"succ").unwrap();
        let truncated = read(&path).unwrap_err().to_string();
        assert!(
            truncated.contains(&path.display().to_string()),
            "{truncated}"
        );
        assert!(truncated.contains("EOF while parsing"), "{truncated}");
        fs::remove_file(&path).unwrap();
        fs::create_dir(&path).unwrap();
        let directory = read(&path).unwrap_err().to_string();
        assert!(directory.contains("Is a directory"), "{directory}");
        // A file where a directory belongs is damage too, not absence.
        let under_file = path.join("x.json");
        fs::remove_dir(&path).unwrap();
        fs::write(&path, b"{}").unwrap();
        assert!(read(&under_file).is_err());
        fs::write(&path, b"{\"ok\": true}").unwrap();
        assert_eq!(read(&path).unwrap(), Some(serde_json::json!({"ok": true})));
    }

    #[test]
    fn a_planted_symlink_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"keep").unwrap();
        let path = dir.path().join("result.json");
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        write_json_atomic(&path, &serde_json::json!({"ok": true})).unwrap();
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_file());
        assert_eq!(fs::read(&outside).unwrap(), b"keep");
        let back: serde_json::Value = read_json(&path).unwrap();
        assert_eq!(back, serde_json::json!({"ok": true}));
    }
}
