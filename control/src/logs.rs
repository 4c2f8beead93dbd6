//! `batch logs`: one attempt's logs from the bundle, as written, and followed while its job
//! runs. Reads files only (no engine): the local runtime writes the logs straight into the
//! attempt's directory; an agent's or a container's arrive there when the attempt settles.
//!
//! The attempt's own processes can write into its directory, so the logs are opened as every
//! attempt file is (a regular file, never through a symlink; `files::open_regular`), and a
//! case is named by its id in the plan, never by a path.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use casebatch_attempt::files::open_regular;
use casebatch_bundle::{AttemptJournal, BundleError, attempt_files};

use crate::error::{ControlError, Result};
use crate::location::BatchLocation;

/// How often a followed attempt's files are looked at again: as a person watches them.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// Whose logs: the harness's (the actor) or the evaluator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogsOf {
    Harness,
    Evaluator,
}

/// What to print.
#[derive(Debug, Clone)]
pub struct LogsRequest {
    pub case_id: String,
    /// `None`: the case's latest attempt (with `follow`, its first once one starts).
    pub attempt: Option<u32>,
    pub of: LogsOf,
    /// Keep printing what is written until the attempt's job has ended.
    pub follow: bool,
}

/// What was printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogsShown {
    /// The attempt's logs (what there was of them).
    Attempt(u32),
    /// The case has not started an attempt yet (without `follow`).
    NoAttemptYet,
}

/// Copies the attempt's stdout log to `out` and its stderr log to `err`; with `follow`, goes
/// on until the attempt's job has ended and everything it wrote is copied.
pub fn logs(
    location: &BatchLocation,
    request: &LogsRequest,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<LogsShown> {
    let (bundle, plan) = location.open()?;
    let case = plan
        .cases
        .iter()
        .find(|c| c.case_id == request.case_id)
        .ok_or_else(|| ControlError::UnknownCase {
            case_id: request.case_id.clone(),
            within: format!("batch {}", plan.batch_id),
            hint: crate::error::ONE_CASE,
        })?;
    let attempts = bundle.case(&case.case_dir).join("attempts");
    let attempt = loop {
        match (request.attempt, latest_attempt(&attempts)) {
            (Some(n), latest) if n > 0 && latest.is_some_and(|l| n <= l) => break n,
            (Some(n), latest) if !request.follow || n == 0 => {
                return Err(ControlError::BadArgument {
                    what: "--attempt",
                    value: format!("{n} (case {} has {})", case.case_id, latest.unwrap_or(0)),
                    hint: "attempts count from 1; leave --attempt out for the latest",
                });
            }
            (None, Some(latest)) => break latest,
            (None, None) if !request.follow => return Ok(LogsShown::NoAttemptYet),
            // Following an attempt not begun yet: wait for it.
            _ => std::thread::sleep(FOLLOW_EVERY),
        }
    };
    let dir = bundle.attempt(&case.case_dir, attempt);
    let names = match request.of {
        LogsOf::Harness => (attempt_files::STDOUT, attempt_files::STDERR),
        LogsOf::Evaluator => (attempt_files::EVAL_STDOUT, attempt_files::EVAL_STDERR),
    };
    let mut streams = [
        Stream::new(dir.join(names.0)),
        Stream::new(dir.join(names.1)),
    ];
    loop {
        // Whether it had ended is read before the last copy, so nothing written before the
        // end is left out.
        let ended = !request.follow || ended(&dir, request.of)?;
        let [o, e] = &mut streams;
        o.copy_new(out)?;
        e.copy_new(err)?;
        if ended {
            return Ok(LogsShown::Attempt(attempt));
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
}

/// The highest attempt number under a case's `attempts/`.
fn latest_attempt(attempts: &Path) -> Option<u32> {
    std::fs::read_dir(attempts)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .max()
}

/// The attempt's job (or its evaluator) has ended, or the attempt was closed without one.
fn ended(dir: &Path, of: LogsOf) -> Result<bool> {
    let j = AttemptJournal::read(dir).map_err(BundleError::from)?;
    Ok(j.record.is_some()
        || match of {
            LogsOf::Harness => j.exit.is_some(),
            LogsOf::Evaluator => j.evaluation.is_some(),
        })
}

/// One log file, read from where the last copy stopped.
struct Stream {
    path: PathBuf,
    file: Option<File>,
}

impl Stream {
    fn new(path: PathBuf) -> Self {
        Self { path, file: None }
    }

    /// Copies what was written since the last call (nothing while the file is absent).
    fn copy_new(&mut self, to: &mut dyn Write) -> Result<()> {
        if self.file.is_none() {
            self.file = open_regular(&self.path, u64::MAX).map_err(BundleError::from)?;
        }
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = file.read(&mut buf).map_err(|source| {
                ControlError::from(casebatch_bundle::BundleError::Read {
                    path: self.path.display().to_string(),
                    source,
                })
            })?;
            if n == 0 {
                break;
            }
            // A closed pipe (`batch logs … | head`) ends the copy quietly.
            if to.write_all(&buf[..n]).is_err() {
                return Ok(());
            }
        }
        let _ = to.flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_attempt::journal::{Entry, append};

    #[test]
    fn a_stream_copies_only_what_is_new_and_waits_for_a_file_not_written_yet() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let mut s = Stream::new(path.clone());
        let mut out = Vec::new();
        s.copy_new(&mut out).unwrap();
        assert!(out.is_empty());
        std::fs::write(&path, "one\n").unwrap();
        s.copy_new(&mut out).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"two\n").unwrap();
        s.copy_new(&mut out).unwrap();
        s.copy_new(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "one\ntwo\n");
    }

    #[test]
    fn a_log_that_is_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("stdout.log"))
            .unwrap();
        let err = Stream::new(dir.path().join("stdout.log"))
            .copy_new(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
    }

    #[test]
    fn the_harness_has_ended_at_its_exit_status_and_the_evaluator_at_its_evaluation() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!ended(dir.path(), LogsOf::Harness).unwrap());
        append(dir.path(), &[Entry::Exit(0)]).unwrap();
        assert!(ended(dir.path(), LogsOf::Harness).unwrap());
        assert!(!ended(dir.path(), LogsOf::Evaluator).unwrap());
    }

    #[test]
    fn attempts_are_numbered_directories() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(latest_attempt(dir.path()), None);
        for n in ["1", "2", "10", "notes"] {
            std::fs::create_dir(dir.path().join(n)).unwrap();
        }
        assert_eq!(latest_attempt(dir.path()), Some(10));
    }
}
