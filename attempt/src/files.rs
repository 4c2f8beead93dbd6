//! Reading (and opening) files in an attempt directory, which the attempt's own processes can
//! replace: the harness knows the directory (`CASEBATCH_RESULT` lives in it) and runs as the
//! worker's user, so every file there is untrusted input.
//!
//! Rules, for every read of an attempt file (harness result, evaluator result, logs; the
//! engine's own journal, `attempt.jsonl`, is read by [`crate::journal`] under the
//! same rules):
//! - regular files only: `symlink_metadata` first, so a FIFO, device, socket, directory or
//!   symbolic link is refused without ever being opened (a symlink is refused whatever it
//!   points at: nothing read from an attempt comes from outside its directory);
//! - opened with `O_NOFOLLOW | O_NONBLOCK`, so a file swapped for a symlink or a FIFO after
//!   the check cannot redirect or block the open, and re-checked with `fstat` on the open
//!   descriptor (same device and inode as checked, still a regular file);
//! - read with a size limit: past it the read fails as [`FileError::TooLarge`] without
//!   reading further (a file that grows after the check is cut off at the limit);
//! - parsed straight from the file into the caller's type (`serde_json::from_reader` over a
//!   bounded buffer), so a caller that needs only part of a result never holds the rest.
//!
//! [`read_json`] runs all of that on a blocking thread (`spawn_blocking`), never on the async
//! runtime's threads. [`read_json_now`] is for small engine records polled often (exit status,
//! job record): the non-blocking open and regular-file check make it safe to call inline.
//!
//! The limit for result files is a worker setting, `CASEBATCH_MAX_RESULT_BYTES` (bytes; default
//! 16 MiB): it protects the worker that reads the file, so the worker's operator sets it, not
//! the manifest's author.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use serde::de::DeserializeOwned;

/// Environment variable of the worker: the largest result file it reads, in bytes.
pub const MAX_RESULT_BYTES_ENV: &str = "CASEBATCH_MAX_RESULT_BYTES";
/// Default of [`MAX_RESULT_BYTES_ENV`].
pub const DEFAULT_MAX_RESULT_BYTES: u64 = 16 * 1024 * 1024;
/// Limit for the engine's own small records in an attempt directory.
pub const RECORD_LIMIT: u64 = 1024 * 1024;

static MAX_RESULT_BYTES: LazyLock<u64> = LazyLock::new(|| {
    match std::env::var(MAX_RESULT_BYTES_ENV) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                tracing::warn!(
                    "{MAX_RESULT_BYTES_ENV}={v:?} is not a positive number of bytes; using {DEFAULT_MAX_RESULT_BYTES}"
                );
                DEFAULT_MAX_RESULT_BYTES
            }
        },
        Err(_) => DEFAULT_MAX_RESULT_BYTES,
    }
});

/// The worker's limit for result files (harness and evaluator results, evaluation records).
pub fn max_result_bytes() -> u64 {
    *MAX_RESULT_BYTES
}

/// Why an attempt file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(
        "{path} is a symbolic link; an attempt's files must be regular files inside its directory"
    )]
    Symlink { path: String },
    #[error("{path} is {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error(
        "{path} is larger than the limit of {limit} bytes (worker setting {MAX_RESULT_BYTES_ENV})"
    )]
    TooLarge { path: String, limit: u64 },
    #[error("{path} changed while it was being opened; not read")]
    Replaced { path: String },
    #[error("failed to read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON of the expected shape: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
}

impl FileError {
    /// The file it is about.
    pub fn path(&self) -> &str {
        match self {
            FileError::Symlink { path }
            | FileError::NotRegular { path, .. }
            | FileError::TooLarge { path, .. }
            | FileError::Replaced { path }
            | FileError::Io { path, .. }
            | FileError::Parse { path, .. } => path,
        }
    }

    pub fn is_too_large(&self) -> bool {
        matches!(self, FileError::TooLarge { .. })
    }
}

fn kind_of(ft: &std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file no larger than `limit`; `Ok(None)` when
/// it does not exist. Never blocks on a FIFO, never follows a symlink.
pub fn open_regular(path: &Path, limit: u64) -> Result<Option<File>, FileError> {
    Ok(open_regular_with_metadata(path, limit)?.map(|(file, _)| file))
}

/// [`open_regular`], with what the open descriptor's `fstat` said.
pub fn open_regular_with_metadata(
    path: &Path,
    limit: u64,
) -> Result<Option<(File, std::fs::Metadata)>, FileError> {
    let p = || path.display().to_string();
    let before = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(FileError::Io { path: p(), source }),
    };
    check(path, &before, limit)?;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags::O_NOFOLLOW | libc_flags::O_NONBLOCK | libc_flags::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: it became a symlink after the check.
        Err(e) if e.raw_os_error() == Some(libc_flags::ELOOP) => {
            return Err(FileError::Symlink { path: p() });
        }
        Err(source) => return Err(FileError::Io { path: p(), source }),
    };
    let after = file
        .metadata()
        .map_err(|source| FileError::Io { path: p(), source })?;
    check(path, &after, limit)?;
    if (after.dev(), after.ino()) != (before.dev(), before.ino()) {
        return Err(FileError::Replaced { path: p() });
    }
    Ok(Some((file, after)))
}

fn check(path: &Path, m: &std::fs::Metadata, limit: u64) -> Result<(), FileError> {
    let ft = m.file_type();
    if ft.is_symlink() {
        return Err(FileError::Symlink {
            path: path.display().to_string(),
        });
    }
    if !ft.is_file() {
        return Err(FileError::NotRegular {
            path: path.display().to_string(),
            kind: kind_of(&ft),
        });
    }
    if m.len() > limit {
        return Err(FileError::TooLarge {
            path: path.display().to_string(),
            limit,
        });
    }
    Ok(())
}

/// Reads and parses a JSON attempt file, inline. `Ok(None)` when it does not exist.
pub fn read_json_now<T: DeserializeOwned>(path: &Path, limit: u64) -> Result<Option<T>, FileError> {
    let Some(file) = open_regular(path, limit)? else {
        return Ok(None);
    };
    // At most `limit + 1` bytes are ever read, whatever the file's size said at the check.
    let mut reader = BufReader::new(file.take(limit + 1));
    let parsed = serde_json::from_reader::<_, T>(&mut reader);
    // More than `limit` bytes came through: the file grew past the limit after the check.
    if reader.get_ref().limit() == 0 {
        return Err(FileError::TooLarge {
            path: path.display().to_string(),
            limit,
        });
    }
    parsed.map(Some).map_err(|source| {
        if source.is_io() {
            FileError::Io {
                path: path.display().to_string(),
                source: source.into(),
            }
        } else {
            FileError::Parse {
                path: path.display().to_string(),
                source,
            }
        }
    })
}

/// Reads a small text attempt file (exit status, pid file), inline.
pub fn read_text_now(path: &Path, limit: u64) -> Result<Option<String>, FileError> {
    let Some(file) = open_regular(path, limit)? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| FileError::Io {
            path: path.display().to_string(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(FileError::TooLarge {
            path: path.display().to_string(),
            limit,
        });
    }
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The first line of an attempt's log (its first 4 KiB at most, at most 300 characters), on
/// a blocking thread, for a failure's message. `None` when the log is missing, empty, or not
/// a regular file.
pub async fn first_line(path: PathBuf) -> Option<String> {
    const HEAD: u64 = 4096;
    const CHARS: usize = 300;
    let read = move || {
        // Its size does not matter: only the head is read.
        let file = open_regular(&path, u64::MAX).ok()??;
        let mut head = Vec::new();
        file.take(HEAD).read_to_end(&mut head).ok()?;
        let text = String::from_utf8_lossy(&head);
        let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
        Some(line.chars().take(CHARS).collect::<String>())
    };
    tokio::task::spawn_blocking(read).await.ok().flatten()
}

/// [`read_json_now`] on a blocking thread: the async runtime's threads never touch the file.
pub async fn read_json<T: DeserializeOwned + Send + 'static>(
    path: PathBuf,
    limit: u64,
) -> Result<Option<T>, FileError> {
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || read_json_now(&path, limit))
        .await
        .unwrap_or_else(|e| {
            Err(FileError::Io {
                path: shown,
                source: std::io::Error::other(e.to_string()),
            })
        })
}

/// Opens (creating if needed) a log file of an attempt for appending: a later start never
/// truncates what an earlier one wrote. Refuses anything but a regular file, like the reads.
pub fn open_log(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc_flags::O_NOFOLLOW | libc_flags::O_NONBLOCK | libc_flags::O_CLOEXEC)
        .open(path)?;
    let m = file.metadata()?;
    if !m.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{} is {}, not a regular file",
            path.display(),
            kind_of(&m.file_type())
        )));
    }
    // The descriptor becomes a child's stdout: give it ordinary blocking semantics.
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(&file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(file)
}

/// The open(2) flags used here, from nix (the project does not depend on libc directly).
mod libc_flags {
    use nix::fcntl::OFlag;
    pub const O_NOFOLLOW: i32 = OFlag::O_NOFOLLOW.bits();
    pub const O_NONBLOCK: i32 = OFlag::O_NONBLOCK.bits();
    pub const O_CLOEXEC: i32 = OFlag::O_CLOEXEC.bits();
    pub const ELOOP: i32 = nix::errno::Errno::ELOOP as i32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct R {
        a: u32,
    }

    #[test]
    fn a_regular_file_is_read_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        assert!(read_json_now::<R>(&p, 100).unwrap().is_none());
        std::fs::write(&p, r#"{"a": 7}"#).unwrap();
        assert_eq!(read_json_now::<R>(&p, 100).unwrap(), Some(R { a: 7 }));
        std::fs::write(&p, "nope").unwrap();
        assert!(matches!(
            read_json_now::<R>(&p, 100),
            Err(FileError::Parse { .. })
        ));
    }

    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let t = Instant::now();
        let err = read_json_now::<R>(&p, 100).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(1), "must not block");
        assert!(
            matches!(err, FileError::NotRegular { kind: "a FIFO", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("a FIFO, not a regular file"));
        // Opened directly (the race after the check), the non-blocking open does not hang
        // and fstat refuses it.
        assert!(open_log(&p).is_err());
    }

    #[test]
    fn a_symlink_is_refused_even_to_a_regular_file_and_dev_zero() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.json");
        std::fs::write(&target, r#"{"a": 1}"#).unwrap();
        let p = dir.path().join("r.json");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert!(matches!(
            read_json_now::<R>(&p, 100),
            Err(FileError::Symlink { .. })
        ));
        let z = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &z).unwrap();
        assert!(matches!(
            read_json_now::<R>(&z, 100),
            Err(FileError::Symlink { .. })
        ));
        // A log path planted as a symlink is not written through.
        assert!(open_log(&z).is_err());
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let err = read_json_now::<R>(Path::new("/dev/zero"), 100).unwrap_err();
        assert!(
            matches!(
                err,
                FileError::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_json_now::<R>(dir.path(), 100),
            Err(FileError::NotRegular {
                kind: "a directory",
                ..
            })
        ));
    }

    #[test]
    fn a_file_past_the_limit_is_too_large_even_when_valid() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        let big = format!(r#"{{"a": 1, "pad": "{}"}}"#, "x".repeat(1000));
        std::fs::write(&p, &big).unwrap();
        let err = read_json_now::<R>(&p, 100).unwrap_err();
        assert!(err.is_too_large(), "{err}");
        assert!(err.to_string().contains(MAX_RESULT_BYTES_ENV));
        assert_eq!(
            read_json_now::<R>(&p, big.len() as u64).unwrap(),
            Some(R { a: 1 }),
            "exactly at the limit is fine"
        );
        assert!(read_text_now(&p, 10).unwrap_err().is_too_large());
    }

    #[test]
    fn a_file_that_grows_past_the_limit_while_read_is_cut_off() {
        // The read stops at limit + 1 bytes whatever the file's size said at the check.
        let data = format!(r#"{{"a": 1}}{}"#, " ".repeat(200));
        let mut reader = BufReader::new(std::io::Cursor::new(data.into_bytes()).take(101));
        let _ = serde_json::from_reader::<_, R>(&mut reader);
        assert_eq!(reader.get_ref().limit(), 0);
    }

    #[tokio::test]
    async fn the_async_read_runs_off_the_runtime_threads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(&p, r#"{"a": 3}"#).unwrap();
        assert_eq!(read_json::<R>(p, 100).await.unwrap(), Some(R { a: 3 }));
    }
}
