//! Writing an attempt's files, as an agent streams them, into the attempt directory of the
//! bundle. The agent is a remote party and the files are its harness's: every path is checked
//! before anything is written.
//!
//! - Only the attempt's own files: `result.json`, `stdout.log`, `stderr.log`, `output/**`,
//!   the evaluator's result and logs, and `job.json` (the agent's job record, which becomes
//!   a `job` entry of the attempt's journal, not a file). An absolute path, `..`, `.`, or any
//!   other name is refused (the bundle's own records beside them, `attempt.jsonl`, ..., are
//!   never overwritten).
//! - Never through a symlink: every directory on the way must be a real directory (checked
//!   with `symlink_metadata`, created one level at a time), and each file is written to a
//!   fresh temp file beside its target and renamed over it, which replaces a planted link
//!   instead of following it.
//! - At most [`casebatch_attempt::files::max_result_bytes`] per file: a log past it keeps its
//!   beginning, any other file past it is not written.
//!
//! A refused or oversized file is reported in [`Fetched`]; the rest is still written.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use casebatch_attempt::{Entry, attempt_files, journal};

/// Files of the attempt directory an agent may send (besides `output/**`).
const TOP_LEVEL: &[&str] = &[
    attempt_files::RESULT,
    attempt_files::STDOUT,
    attempt_files::STDERR,
    attempt_files::legacy::JOB,
    attempt_files::EVAL_RESULT,
    attempt_files::EVAL_STDOUT,
    attempt_files::EVAL_STDERR,
];
const LOGS: &[&str] = &[
    attempt_files::STDOUT,
    attempt_files::STDERR,
    attempt_files::EVAL_STDOUT,
    attempt_files::EVAL_STDERR,
];

/// What a fetch wrote, and what it did not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Paths written whole (relative to the attempt directory).
    pub written: Vec<String>,
    /// `(path, why)`: files not written, or written cut off at the limit.
    pub refused: Vec<(String, String)>,
    /// The harness's result was past the limit and is not in the bundle.
    pub result_too_large: bool,
}

/// The relative path an agent named, if it is one of the attempt's files.
pub fn checked_path(path: &str) -> Result<PathBuf, String> {
    let p = Path::new(path);
    if path.is_empty() {
        return Err("an empty path".into());
    }
    if p.is_absolute() {
        return Err("an absolute path".into());
    }
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::ParentDir => return Err("a path with `..`".into()),
            _ => return Err("a path with `.` or a root".into()),
        }
    }
    let allowed = match parts.as_slice() {
        [one] => TOP_LEVEL.iter().any(|t| one.to_str() == Some(t)),
        [first, _, ..] => first.to_str() == Some(attempt_files::OUTPUT),
        [] => false,
    };
    if !allowed {
        return Err(format!(
            "not a file of the attempt ({} or {}/...)",
            TOP_LEVEL.join(", "),
            attempt_files::OUTPUT
        ));
    }
    Ok(parts.iter().collect())
}

/// The directory `rel`'s file goes in, under `root`, created as needed; `Err` if anything on
/// the way is not a real directory (a symlink above all).
fn real_parent(root: &Path, rel: &Path) -> Result<PathBuf, String> {
    let mut dir = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(dir);
    };
    for part in parent.components() {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "{} is not a real directory (a symlink or a file is there)",
                    dir.display()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // create_dir never follows a link; one planted since the check fails it.
                fs::create_dir(&dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            Err(e) => return Err(format!("cannot inspect {}: {e}", dir.display())),
        }
    }
    Ok(dir)
}

/// Where a received file goes.
enum Dest {
    /// A temp file beside its target, renamed over it when complete.
    File(tempfile::NamedTempFile),
    /// The agent's job record: kept in memory, appended to the journal when complete.
    JobEntry(Vec<u8>),
}

/// One file being received.
struct Receiving {
    rel: String,
    target: PathBuf,
    dest: Dest,
    len: u64,
    /// Past the limit: a log stops growing, anything else is dropped at the end.
    over: bool,
}

/// Receives an agent's chunks into `dir`. A chunk with a new path starts a new file (an
/// empty path continues the current one); [`Sink::finish`] completes the last.
pub struct Sink {
    dir: PathBuf,
    limit: u64,
    current: Option<Receiving>,
    /// A refused path's chunks are skipped until the next path.
    skipping: Option<String>,
    out: Fetched,
}

/// Writing failed on the worker's side (the bundle's disk): the whole fetch failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to write {path}: {message}")]
pub struct WriteError {
    pub path: String,
    pub message: String,
}

impl Sink {
    pub fn new(dir: &Path, limit: u64) -> Result<Self, WriteError> {
        let err = |message: String| WriteError {
            path: dir.display().to_string(),
            message,
        };
        fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        let m = fs::symlink_metadata(dir).map_err(|e| err(e.to_string()))?;
        if !m.file_type().is_dir() {
            return Err(err("the attempt directory is not a real directory".into()));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            limit,
            current: None,
            skipping: None,
            out: Fetched::default(),
        })
    }

    pub fn chunk(&mut self, path: &str, data: &[u8]) -> Result<(), WriteError> {
        let same = path.is_empty()
            || self.current.as_ref().is_some_and(|c| c.rel == path)
            || self.skipping.as_deref() == Some(path);
        if !same {
            self.complete()?;
            self.skipping = None;
            match checked_path(path).and_then(|rel| self.begin(path, &rel)) {
                Ok(r) => self.current = Some(r),
                Err(why) => {
                    self.out
                        .refused
                        .push((path.to_string(), format!("refused: {why}")));
                    self.skipping = Some(path.to_string());
                }
            }
        }
        let limit = self.limit;
        let Some(cur) = self.current.as_mut() else {
            return Ok(());
        };
        if cur.over {
            return Ok(());
        }
        let room = limit.saturating_sub(cur.len);
        let take = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        match &mut cur.dest {
            Dest::File(tmp) => tmp.write_all(&data[..take]).map_err(|e| WriteError {
                path: cur.target.display().to_string(),
                message: e.to_string(),
            })?,
            Dest::JobEntry(bytes) => bytes.extend_from_slice(&data[..take]),
        }
        cur.len += take as u64;
        cur.over = take < data.len();
        Ok(())
    }

    fn begin(&self, path: &str, rel: &Path) -> Result<Receiving, String> {
        if path == attempt_files::legacy::JOB {
            return Ok(Receiving {
                rel: path.to_string(),
                target: journal::path(&self.dir),
                dest: Dest::JobEntry(Vec::new()),
                len: 0,
                over: false,
            });
        }
        let parent = real_parent(&self.dir, rel)?;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            // As every bundle file: what a plain create gives (0666 less the umask).
            .permissions(fs::Permissions::from_mode(0o666))
            .tempfile_in(&parent)
            .map_err(|e| format!("cannot create a file in {}: {e}", parent.display()))?;
        Ok(Receiving {
            rel: path.to_string(),
            target: parent.join(name),
            dest: Dest::File(tmp),
            len: 0,
            over: false,
        })
    }

    /// Renames the current file into place (or drops it, past the limit).
    fn complete(&mut self) -> Result<(), WriteError> {
        let Some(cur) = self.current.take() else {
            return Ok(());
        };
        let is_log = LOGS.contains(&cur.rel.as_str());
        if cur.over {
            let why = format!("larger than the limit of {} bytes", self.limit);
            if !is_log {
                if cur.rel == attempt_files::RESULT {
                    self.out.result_too_large = true;
                }
                self.out
                    .refused
                    .push((cur.rel, format!("not written: {why}")));
                return Ok(());
            }
            self.out
                .refused
                .push((cur.rel.clone(), format!("cut off: {why}")));
        }
        let tmp = match cur.dest {
            Dest::File(tmp) => tmp,
            Dest::JobEntry(bytes) => {
                match serde_json::from_slice(&bytes) {
                    Ok(job) => {
                        journal::append(&self.dir, &[Entry::Job(job)]).map_err(|e| WriteError {
                            path: cur.target.display().to_string(),
                            message: e.to_string(),
                        })?
                    }
                    Err(e) => {
                        self.out
                            .refused
                            .push((cur.rel, format!("not a job record: {e}")));
                        return Ok(());
                    }
                }
                self.out.written.push(cur.rel);
                return Ok(());
            }
        };
        // A directory at the target's name stays; the file is reported, not forced.
        if fs::symlink_metadata(&cur.target).is_ok_and(|m| m.file_type().is_dir()) {
            self.out
                .refused
                .push((cur.rel, "refused: a directory is at its name".into()));
            return Ok(());
        }
        tmp.persist(&cur.target).map_err(|e| WriteError {
            path: cur.target.display().to_string(),
            message: e.error.to_string(),
        })?;
        self.out.written.push(cur.rel);
        Ok(())
    }

    pub fn finish(mut self) -> Result<Fetched, WriteError> {
        self.complete()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(dir: &Path, limit: u64, chunks: &[(&str, &[u8])]) -> Fetched {
        let mut sink = Sink::new(dir, limit).unwrap();
        for (path, data) in chunks {
            sink.chunk(path, data).unwrap();
        }
        sink.finish().unwrap()
    }

    fn refused(f: &Fetched) -> Vec<&str> {
        f.refused.iter().map(|(p, _)| p.as_str()).collect()
    }

    #[test]
    fn the_attempts_files_land_and_chunks_join() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("attempt");
        let f = receive(
            &dir,
            1024,
            &[
                ("result.json", b"{\"status\":"),
                ("", b"\"finished\"}"),
                ("output/deep/a.txt", b"a"),
                ("output/deep/a.txt", b"b"),
                ("stdout.log", b""),
            ],
        );
        assert_eq!(
            f.written,
            ["result.json", "output/deep/a.txt", "stdout.log"]
        );
        assert!(f.refused.is_empty());
        assert_eq!(
            fs::read(dir.join("result.json")).unwrap(),
            b"{\"status\":\"finished\"}"
        );
        assert_eq!(fs::read(dir.join("output/deep/a.txt")).unwrap(), b"ab");
        assert_eq!(fs::read(dir.join("stdout.log")).unwrap(), b"");
        // Nothing but the files: no temp files left behind.
        let mut names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["output", "result.json", "stdout.log"]);
    }

    #[test]
    fn paths_out_of_the_attempt_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("attempt");
        let f = receive(
            &dir,
            1024,
            &[
                ("../x", b"escaped"),
                ("/etc/passwd", b"root::0:0"),
                ("output/../../y", b"escaped"),
                ("./result.json", b"{}"),
                ("attempt.json", b"{}"),
                ("output", b"not a dir"),
                ("stderr.log", b"kept"),
            ],
        );
        assert_eq!(
            refused(&f),
            [
                "../x",
                "/etc/passwd",
                "output/../../y",
                "./result.json",
                "attempt.json",
                "output"
            ]
        );
        assert_eq!(f.written, ["stderr.log"]);
        assert!(!root.path().join("x").exists() && !root.path().join("y").exists());
        assert!(!dir.join("attempt.json").exists());
        assert!(f.refused[0].1.contains(".."), "{:?}", f.refused);
        assert!(f.refused[1].1.contains("absolute"), "{:?}", f.refused);
    }

    #[test]
    fn a_planted_symlink_is_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("attempt");
        let outside = root.path().join("outside");
        fs::create_dir_all(&dir).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("keep"), b"keep").unwrap();
        // A directory on the way that is a link out of the attempt.
        std::os::unix::fs::symlink(&outside, dir.join("output")).unwrap();
        // A file name that is a link to a file outside.
        std::os::unix::fs::symlink(outside.join("keep"), dir.join("result.json")).unwrap();
        let f = receive(
            &dir,
            1024,
            &[("output/keep", b"overwritten"), ("result.json", b"{}")],
        );
        assert_eq!(refused(&f), ["output/keep"]);
        assert!(
            f.refused[0].1.contains("not a real directory"),
            "{:?}",
            f.refused
        );
        assert_eq!(f.written, ["result.json"]);
        assert_eq!(fs::read(outside.join("keep")).unwrap(), b"keep");
        let m = fs::symlink_metadata(dir.join("result.json")).unwrap();
        assert!(m.file_type().is_file(), "the link was replaced by the file");
        assert_eq!(fs::read(dir.join("result.json")).unwrap(), b"{}");
    }

    #[test]
    fn the_limit_cuts_logs_and_drops_other_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("attempt");
        let f = receive(
            &dir,
            4,
            &[
                ("stdout.log", b"abc"),
                ("", b"defgh"),
                ("result.json", b"{\"x\":1}"),
                ("output/big.bin", b"12345"),
                ("output/ok.bin", b"1234"),
            ],
        );
        assert_eq!(f.written, ["stdout.log", "output/ok.bin"]);
        assert_eq!(refused(&f), ["stdout.log", "result.json", "output/big.bin"]);
        assert!(f.result_too_large);
        assert_eq!(fs::read(dir.join("stdout.log")).unwrap(), b"abcd");
        assert!(!dir.join("result.json").exists());
        assert!(!dir.join("output/big.bin").exists());
    }
}
