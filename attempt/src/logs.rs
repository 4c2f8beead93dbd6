//! The log cap: each of an attempt's `stdout.log` and `stderr.log` keeps at most the job's
//! cap (`resources.log_mb`, 64 MiB by default). Past it the middle is dropped: the first and
//! last parts are kept (how a harness started, and the error it usually ends with) around one
//! line saying how many bytes went.
//!
//! The harness writes its logs itself (an appending file descriptor, so a job outlives its
//! worker), so nothing sits between it and the file to cut it short. Instead, while the job
//! runs, the watcher frees the disk blocks of a log's middle once it passes twice its cap
//! ([`bound_running`]), and when the job ends the log is rewritten to its cap ([`cap`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use casebatch_proto::LogsCapped;

use crate::{Attempt, attempt_files};

/// Room kept under the cap for the marker line, so a capped log is within its cap and capping
/// it again changes nothing.
const MARKER_ROOM: u64 = 256;
/// Hole punching frees whole file-system blocks only.
const BLOCK: u64 = 4096;

/// Caps both logs of an ended job; `None` when neither passed the cap. A log that cannot be
/// capped is left as it is (it is evidence) and said in the worker's log.
pub fn cap_attempt(a: &Attempt) -> Option<LogsCapped> {
    let cap_bytes = a.job.log_cap_bytes();
    let dropped = |name: &str| {
        let path = a.file(name);
        cap(&path, cap_bytes).unwrap_or_else(|e| {
            tracing::warn!(log = %path.display(), "the log could not be capped: {e}");
            0
        })
    };
    let (stdout_dropped, stderr_dropped) = (
        dropped(attempt_files::STDOUT),
        dropped(attempt_files::STDERR),
    );
    (stdout_dropped > 0 || stderr_dropped > 0).then_some(LogsCapped {
        cap_bytes,
        stdout_dropped,
        stderr_dropped,
    })
}

/// Bounds the disk both logs of a running job take (see [`bound_running`]).
pub fn bound_running_attempt(a: &Attempt) {
    let cap_bytes = a.job.log_cap_bytes();
    for name in [attempt_files::STDOUT, attempt_files::STDERR] {
        let _ = bound_running(&a.file(name), cap_bytes);
    }
}

/// While the harness may still write: once the log holds more than twice `cap` bytes on
/// disk, the blocks of its middle are freed (a hole: the file keeps its length, so the
/// harness's appends land where they would have). Only what [`cap`] drops anyway is freed.
pub fn bound_running(path: &Path, cap: u64) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    if meta.blocks() * 512 <= cap.saturating_mul(2) {
        return Ok(());
    }
    let (head, tail) = kept(cap);
    let start = head.div_ceil(BLOCK) * BLOCK;
    let end = meta.len().saturating_sub(tail) / BLOCK * BLOCK;
    if end <= start {
        return Ok(());
    }
    let file = OpenOptions::new().write(true).open(path)?;
    let mode = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
        | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(&file, mode, start as i64, (end - start) as i64).map_err(io::Error::from)
}

/// Rewrites an ended job's log to at most `cap` bytes: its first and last parts around a
/// marker line. Returns the bytes dropped (0: the log was within its cap, and is untouched).
/// The new log replaces the old one by a rename, so a crash leaves one or the other whole.
pub fn cap(path: &Path, cap: u64) -> io::Result<u64> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    if len <= cap {
        return Ok(0);
    }
    let (head, tail) = kept(cap);
    let dropped = len - head - tail;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let marker = format!(
        "\n[casebatch: {dropped} bytes of {name} dropped here: it passed its cap of {cap} \
         bytes (resources.log_mb); the first {head} and the last {tail} are kept]\n"
    );

    let partial = path.with_extension("log.capping");
    let mut from = File::open(path)?;
    let mut to = File::create(&partial)?;
    io::copy(&mut (&mut from).take(head), &mut to)?;
    to.write_all(marker.as_bytes())?;
    from.seek(SeekFrom::Start(len - tail))?;
    io::copy(&mut from.take(tail), &mut to)?;
    to.sync_all()?;
    std::fs::rename(&partial, path)?;
    Ok(dropped)
}

/// The bytes kept of a capped log's start and of its end.
fn kept(cap: u64) -> (u64, u64) {
    let body = cap.saturating_sub(MARKER_ROOM);
    (body / 2, body - body / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered_lines(path: &Path, lines: u32) -> Vec<u8> {
        let text: String = (0..lines).map(|i| format!("line {i:06}\n")).collect();
        std::fs::write(path, &text).unwrap();
        text.into_bytes()
    }

    #[test]
    fn a_log_within_its_cap_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let text = numbered_lines(&path, 100);
        assert_eq!(cap(&path, text.len() as u64).unwrap(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), text);
        assert_eq!(cap(&dir.path().join("absent.log"), 10).unwrap(), 0);
    }

    #[test]
    fn a_log_past_its_cap_keeps_its_start_and_end_around_a_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let text = numbered_lines(&path, 10_000); // 120,000 bytes
        let limit = 4096;
        let dropped = cap(&path, limit).unwrap();

        let capped = std::fs::read(&path).unwrap();
        assert!(capped.len() as u64 <= limit, "{} bytes", capped.len());
        let (head, tail) = kept(limit);
        assert_eq!(dropped, text.len() as u64 - head - tail);
        assert_eq!(capped[..head as usize], text[..head as usize]);
        assert_eq!(
            capped[capped.len() - tail as usize..],
            text[text.len() - tail as usize..]
        );
        let shown = String::from_utf8_lossy(&capped);
        assert!(
            shown.contains(&format!(
                "[casebatch: {dropped} bytes of stdout.log dropped here: it passed its cap of \
                 4096 bytes"
            )),
            "{shown}"
        );
        assert!(shown.ends_with("line 009999\n"));
        // Capping again changes nothing: the capped log is within its cap.
        assert_eq!(cap(&path, limit).unwrap(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), capped);
        assert!(!dir.path().join("stdout.log.capping").exists());
    }

    #[test]
    fn a_running_log_past_twice_its_cap_frees_its_middle_and_keeps_its_length() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let text = numbered_lines(&path, 100_000); // 1.2 MB
        let limit = 64 * 1024;
        bound_running(&path, limit).unwrap();

        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            meta.len(),
            text.len() as u64,
            "the harness's appends land as before"
        );
        assert!(
            meta.blocks() * 512 <= 3 * limit,
            "{} bytes still on disk",
            meta.blocks() * 512
        );
        // The capped log reads the same as if nothing had been freed.
        let mut expected = tempfile::NamedTempFile::new_in(dir.path()).unwrap();
        expected.write_all(&text).unwrap();
        cap(&path, limit).unwrap();
        cap(expected.path(), limit).unwrap();
        let (a, b) = (
            std::fs::read(&path).unwrap(),
            std::fs::read(expected.path()).unwrap(),
        );
        let strip = |v: &[u8]| {
            String::from_utf8_lossy(v).replace(
                &*expected.path().file_name().unwrap().to_string_lossy(),
                "stdout.log",
            )
        };
        assert_eq!(strip(&a), strip(&b));
    }
}
