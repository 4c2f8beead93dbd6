//! Atomic JSON writes (temp file + rename), so a crash never leaves a half-written record.
//!
//! Records are not fsynced: the rename makes them atomic against process crashes (the failure
//! model of a batch: SIGKILLed workers, restarted engines), and forcing every record to disk
//! costs more than the rest of a case's bookkeeping together. Durable state lives in Temporal.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::BundleError;

pub fn write_json_atomic<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), BundleError> {
    let mut bytes = serde_json::to_vec_pretty(value).expect("bundle records always serialize");
    bytes.push(b'\n');
    write_bytes_atomic(path, &bytes)
}

/// Writes `bytes` to a fresh temp file beside `path`, then renames it over `path`. The temp
/// file is created exclusively (`O_CREAT|O_EXCL`, which never follows a symlink), so a file
/// planted at its name by an attempt's processes is replaced, not written through; the rename
/// replaces whatever entry `path` was (a symlink or FIFO included) without opening it.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<(), BundleError> {
    let werr = |source| BundleError::Write {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(werr)?;
    }
    // Unique per host, process and call: replicas in containers share low pids.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.{seq}.tmp",
        host.trim(),
        std::process::id()
    ));
    let create = || {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
    };
    let mut f = match create() {
        // Left by an earlier process with the same pid, or planted: replace the entry.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            fs::remove_file(&tmp).map_err(werr)?;
            create()
        }
        other => other,
    }
    .map_err(werr)?;
    f.write_all(bytes).map_err(werr)?;
    fs::rename(&tmp, path).map_err(werr)
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

/// Appends one JSON object as a line. A single `write` of a line opened with O_APPEND lands
/// whole, so concurrent writers do not interleave.
pub fn append_jsonl<T: Serialize>(path: &Path, value: &T) -> Result<(), BundleError> {
    let werr = |source| BundleError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut line = serde_json::to_vec(value).expect("events always serialize");
    line.push(b'\n');
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(werr)?;
    f.write_all(&line).map_err(werr)
}
