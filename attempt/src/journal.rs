//! `attempts/<n>/attempt.jsonl`: everything the engine records about one attempt, in one file.
//!
//! One JSON object per line, each with one key naming what it holds: `spec` (the planned
//! case as provisioned), `job` (the runtime's record of the job it starts), `wrapper` (`[pid,
//! start ticks]`, written by the harness's wrapper before the harness runs), `exit` (the
//! harness's exit status, written by the wrapper), `stage` (one stage's timing), `prepared`,
//! `container`, `evaluation`, `cleanup` (the receipt) and `record` (the attempt's record, at
//! its close). Read back, the last line of each kind counts and the stages add up
//! ([`AttemptJournal`]).
//!
//! Why one appended file and not a file per record: an attempt used to make 15 files and
//! directories and a temporary file for each atomic write, and on an ext4 file system aged
//! by deleted bundles allocating those inodes was a third of all CPU a short case cost.
//! Appending needs no temporary file: a line written by one `write` to a file opened with
//! `O_APPEND` lands whole and never interleaves with another writer's (the worker and the
//! wrapper both write here), so it is as atomic against crashes as the renames were. The
//! flock that serialises an attempt's submits is taken on this file too.
//!
//! Bundles made before this (a `spec.json` beside no `spec` line) are read from their files
//! ([`AttemptJournal::read`] falls back to each of them), so `report`, `retry-failed` and
//! `diff` read old bundles as before, and a job started by an older worker is still adopted.
//!
//! The attempt's own processes can write here (they run as the worker's user and know the
//! directory), so the file is opened as every attempt file is: never through a symlink, never
//! blocking on a FIFO, only a regular file, with a size limit.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::files::{self, FileError};
use crate::layout::attempt_files;
use crate::records::{
    AttemptRecord, CleanupReceipt, ContainerRecord, EvaluationRecord, JobEntry, PreparedRecord,
    SpecRecord, StageTiming,
};

/// Why an attempt's journal (or another record of the attempt) could not be read or written;
/// each names the file.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("failed to read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON of the expected shape: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl From<FileError> for JournalError {
    /// A refused read of an attempt file (not a regular file, too large, replaced) is a read
    /// error naming the file and why.
    fn from(e: FileError) -> Self {
        match e {
            FileError::Io { path, source } => JournalError::Read { path, source },
            FileError::Parse { path, source } => JournalError::Parse { path, source },
            other => JournalError::Read {
                path: other.path().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
            },
        }
    }
}

/// The largest journal read (its records are small; a harness that floods it is refused).
pub const JOURNAL_LIMIT: u64 = 32 * 1024 * 1024;

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    Spec(SpecRecord),
    Job(JobEntry),
    /// `[pid, start ticks]` of the wrapper; ticks `null` when it could not read them.
    Wrapper(u32, Option<u64>),
    Exit(i32),
    Stage(StageTiming),
    /// `null` withdraws an earlier one (an environment released but kept as evidence).
    Prepared(Option<PreparedRecord>),
    Container(ContainerRecord),
    Evaluation(EvaluationRecord),
    Cleanup(CleanupReceipt),
    Record(AttemptRecord),
}

/// An attempt's journal, folded: the last entry of each kind, every stage in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttemptJournal {
    pub spec: Option<SpecRecord>,
    pub job: Option<JobEntry>,
    pub wrapper: Option<(u32, Option<u64>)>,
    pub exit: Option<i32>,
    pub stages: Vec<StageTiming>,
    pub prepared: Option<PreparedRecord>,
    pub container: Option<ContainerRecord>,
    pub evaluation: Option<EvaluationRecord>,
    pub cleanup: Option<CleanupReceipt>,
    pub record: Option<AttemptRecord>,
    /// 1-based numbers of lines that are not an entry this version knows (damage, or a
    /// later version's kind). A last line without its newline is a write cut short and is
    /// not counted.
    #[serde(skip)]
    pub unreadable_lines: Vec<usize>,
}

/// The journal's path in an attempt directory.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(attempt_files::JOURNAL)
}

fn werr(path: &Path) -> impl Fn(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Write {
        path: path.display().to_string(),
        source,
    }
}

/// Opens (creating) the journal for appending; refuses anything but a regular file.
pub fn open_for_append(dir: &Path) -> Result<File, JournalError> {
    let path = path(dir);
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(flags::NOFOLLOW_NONBLOCK_CLOEXEC)
        .open(&path)
        .map_err(werr(&path))?;
    let m = file.metadata().map_err(werr(&path))?;
    if !m.file_type().is_file() {
        return Err(werr(&path)(std::io::Error::other("not a regular file")));
    }
    Ok(file)
}

/// Appends entries in one write (so they land whole and together).
pub fn append(dir: &Path, entries: &[Entry]) -> Result<(), JournalError> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut lines = Vec::new();
    for e in entries {
        serde_json::to_writer(&mut lines, e).expect("journal entries always serialize");
        lines.push(b'\n');
    }
    open_for_append(dir)?
        .write_all(&lines)
        .map_err(werr(&path(dir)))
}

/// Appends one JSON object as a line to `path` (a log such as `events.jsonl`). A single
/// `write` of a line opened with `O_APPEND` lands whole, so concurrent writers do not
/// interleave.
pub fn append_jsonl<T: Serialize>(path: &Path, value: &T) -> Result<(), JournalError> {
    let mut line = serde_json::to_vec(value).expect("log lines always serialize");
    line.push(b'\n');
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(&line))
        .map_err(werr(path))
}

impl AttemptJournal {
    /// Reads an attempt's journal (and, for an attempt begun before journals, its files).
    /// Nothing there reads as empty. `Err` when the journal or a record file is there but
    /// cannot be read (not a regular file, too large, an I/O error).
    ///
    /// Shared: this process keeps what it read, and reading again folds only what was
    /// appended since (the `seen` module). A reader that wants to change it takes a copy
    /// (`Arc::unwrap_or_clone`).
    pub fn read(dir: &Path) -> Result<Arc<Self>, JournalError> {
        let mut journal = seen::read(&path(dir))?.unwrap_or_default();
        if journal.spec.is_none() {
            Arc::make_mut(&mut journal).fill_from_files(dir)?;
        }
        Ok(journal)
    }

    /// [`Self::read`], with unreadable lines an error naming the file and the first of them:
    /// for readers of a finished bundle, where damage must not pass for an attempt in flight.
    pub fn read_strict(dir: &Path) -> Result<Arc<Self>, JournalError> {
        let journal = Self::read(dir)?;
        if let Some(line) = journal.unreadable_lines.first() {
            return Err(JournalError::Read {
                path: path(dir).display().to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("line {line} is not an entry of the attempt's record"),
                ),
            });
        }
        Ok(journal)
    }

    /// Folds the complete lines of `bytes`, which follow the `lines` lines folded before;
    /// returns the bytes and the lines folded in all. A last line without its newline is a
    /// write cut short, or one still being written: it is left for the next read.
    fn fold_lines(&mut self, bytes: &[u8], lines: usize) -> (u64, usize) {
        let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let mut number = lines;
        for line in bytes[..complete].split_inclusive(|b| *b == b'\n') {
            number += 1;
            let line = &line[..line.len() - 1];
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<Entry>(line) {
                Ok(entry) => self.apply(entry),
                Err(_) => self.unreadable_lines.push(number),
            }
        }
        (complete as u64, number)
    }

    fn apply(&mut self, entry: Entry) {
        match entry {
            Entry::Spec(v) => self.spec = Some(v),
            Entry::Job(v) => self.job = Some(v),
            Entry::Wrapper(pid, ticks) => self.wrapper = Some((pid, ticks)),
            Entry::Exit(code) => self.exit = Some(code),
            Entry::Stage(t) => self.stages.push(t),
            Entry::Prepared(p) => self.prepared = p,
            Entry::Container(v) => self.container = Some(v),
            Entry::Evaluation(e) => self.evaluation = Some(e),
            Entry::Cleanup(c) => self.cleanup = Some(c),
            Entry::Record(r) => self.record = Some(r),
        }
    }

    /// An attempt begun before journals keeps a file per record: each read where the
    /// journal has none of that kind.
    fn fill_from_files(&mut self, dir: &Path) -> Result<(), JournalError> {
        use attempt_files::legacy;
        fn fill<T: DeserializeOwned>(
            slot: &mut Option<T>,
            path: PathBuf,
        ) -> Result<(), JournalError> {
            if slot.is_none() {
                *slot = read_json_file(&path)?;
            }
            Ok(())
        }
        let Some(spec) = read_json_file(&dir.join(legacy::SPEC))? else {
            // Not an older attempt either (or not provisioned yet): its job may still be
            // one an older worker started without a spec of its own (an agent's directory).
            fill(&mut self.job, dir.join(legacy::JOB))?;
            return Ok(());
        };
        self.spec = Some(spec);
        fill(&mut self.job, dir.join(legacy::JOB))?;
        fill(&mut self.prepared, dir.join(legacy::PREPARED))?;
        fill(&mut self.container, dir.join(legacy::CONTAINER))?;
        fill(&mut self.evaluation, dir.join(legacy::EVALUATION))?;
        fill(&mut self.cleanup, dir.join(legacy::CLEANUP))?;
        fill(&mut self.record, dir.join(legacy::RECORD))?;
        if self.wrapper.is_none()
            && let Some(text) = read_text_file(&dir.join(legacy::WRAPPER_PID))?
        {
            let mut words = text.split_whitespace();
            if let Some(pid) = words.next().and_then(|w| w.parse().ok()) {
                self.wrapper = Some((pid, words.next().and_then(|w| w.parse().ok())));
            }
        }
        if self.exit.is_none()
            && let Some(text) = read_text_file(&dir.join(legacy::EXIT))?
        {
            // Complete once its newline is there.
            self.exit = text.strip_suffix('\n').and_then(|t| t.trim().parse().ok());
        }
        if self.stages.is_empty()
            && let Some(text) = read_text_file(&dir.join(legacy::STAGES))?
        {
            self.stages = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
        }
        Ok(())
    }
}

fn read_text_file(path: &Path) -> Result<Option<String>, JournalError> {
    let Some((file, meta)) = files::open_regular_with_metadata(path, JOURNAL_LIMIT)? else {
        return Ok(None);
    };
    let mut bytes = sized_buffer(meta.len());
    file.take(JOURNAL_LIMIT)
        .read_to_end(&mut bytes)
        .map_err(|source| JournalError::Read {
            path: path.display().to_string(),
            source,
        })?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

fn read_json_file<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, JournalError> {
    let Some(text) = read_text_file(path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| JournalError::Parse {
            path: path.display().to_string(),
            source,
        })
}

/// An empty buffer with room for `len` bytes and one more: `read_to_end` into it takes one
/// read for the bytes and one that returns nothing, where an empty `Vec` takes a 32-byte
/// probe and then a read per doubling (seven for a 2 KiB journal).
fn sized_buffer(len: u64) -> Vec<u8> {
    Vec::with_capacity(usize::try_from(len.min(JOURNAL_LIMIT)).unwrap_or(0) + 1)
}

/// Journals this process has read, and how far. A journal only grows (every writer
/// appends), so reading one again folds only the lines appended since: an attempt's journal
/// is read about nine times while it runs (each step asks for the state the one before left),
/// and parsing it whole every time was about a seventh of a worker's user CPU. The file is
/// still opened on every read, so a journal on a network file system is as fresh as before
/// (the open revalidates it); one that is not the file seen (another inode) or is shorter
/// than what was folded is read from its start. Bounded: the [`KEEP`](seen::KEEP) journals
/// read last, and no more than [`BYTES`](seen::BYTES) of them (a case's input is in its spec,
/// and some inputs are large).
mod seen {
    use std::collections::{HashMap, VecDeque};
    use std::fs::File;
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, LazyLock, Mutex};

    use super::JournalError;
    use super::{AttemptJournal, JOURNAL_LIMIT};
    use crate::files;

    /// Far more than the attempts a worker runs at once (512 at the widest).
    pub(super) const KEEP: usize = 2048;
    /// Bytes of journal text kept, all journals together (parsed, a few times that).
    pub(super) const BYTES: u64 = 16 * 1024 * 1024;

    struct Seen {
        /// Device and inode of the file folded.
        file: (u64, u64),
        /// Bytes folded: to the end of the last complete line.
        upto: u64,
        /// Lines folded: the next line's number is one more.
        lines: usize,
        /// Shared with the readers it was handed to: a fold copies it only while one of them
        /// still holds it (a journal holds the case's input; copying it twice a read was about
        /// 4 % of a worker's CPU).
        journal: Arc<AttemptJournal>,
    }

    #[derive(Default)]
    struct Journals {
        by_path: HashMap<PathBuf, Seen>,
        /// Oldest first, for eviction.
        order: VecDeque<PathBuf>,
        /// The bytes folded of every journal kept.
        bytes: u64,
    }

    impl Journals {
        fn insert(&mut self, path: &Path, seen: Seen) {
            if seen.upto > BYTES {
                // Read whole each time rather than crowd out every other journal.
                return;
            }
            self.bytes += seen.upto;
            match self.by_path.insert(path.to_path_buf(), seen) {
                Some(before) => self.bytes -= before.upto,
                None => self.order.push_back(path.to_path_buf()),
            }
            self.trim();
        }

        /// Accounts for `by` more bytes folded into the journal kept for `path`.
        fn grew(&mut self, path: &Path, by: u64) {
            self.bytes += by;
            if self.by_path.get(path).is_some_and(|s| s.upto > BYTES)
                && let Some(gone) = self.by_path.remove(path)
            {
                self.bytes -= gone.upto;
                self.order.retain(|p| p != path);
            }
            self.trim();
        }

        fn trim(&mut self) {
            while self.order.len() > KEEP || self.bytes > BYTES {
                let Some(oldest) = self.order.pop_front() else {
                    break;
                };
                if let Some(gone) = self.by_path.remove(&oldest) {
                    self.bytes -= gone.upto;
                }
            }
        }
    }

    static SEEN: LazyLock<Mutex<Journals>> = LazyLock::new(Mutex::default);

    fn journals() -> std::sync::MutexGuard<'static, Journals> {
        SEEN.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The journal at `path`, folded; `None` when there is none.
    pub(super) fn read(path: &Path) -> Result<Option<Arc<AttemptJournal>>, JournalError> {
        let Some((mut file, meta)) = files::open_regular_with_metadata(path, JOURNAL_LIMIT)? else {
            return Ok(None);
        };
        let id = (meta.dev(), meta.ino());
        let from = match journals().by_path.get(path) {
            Some(s) if s.file == id && s.upto == meta.len() => return Ok(Some(s.journal.clone())),
            Some(s) if s.file == id && s.upto < meta.len() => s.upto,
            _ => 0,
        };
        let bytes = read_from(&mut file, path, from, meta.len())?;
        if from > 0 {
            let mut journals = journals();
            // Folded where it is kept, unless another read moved the fold meanwhile.
            if let Some(s) = journals
                .by_path
                .get_mut(path)
                .filter(|s| s.file == id && s.upto == from)
            {
                let (folded, lines) = Arc::make_mut(&mut s.journal).fold_lines(&bytes, s.lines);
                s.upto += folded;
                s.lines = lines;
                let journal = s.journal.clone();
                journals.grew(path, folded);
                return Ok(Some(journal));
            }
        }
        let bytes = if from == 0 {
            bytes
        } else {
            read_from(&mut file, path, 0, meta.len())?
        };
        let mut journal = AttemptJournal::default();
        let (upto, lines) = journal.fold_lines(&bytes, 0);
        let journal = Arc::new(journal);
        journals().insert(
            path,
            Seen {
                file: id,
                upto,
                lines,
                journal: journal.clone(),
            },
        );
        Ok(Some(journal))
    }

    /// The bytes of `file` from `from` (to `len`, as its `fstat` said, or on to the limit).
    fn read_from(
        file: &mut File,
        path: &Path,
        from: u64,
        len: u64,
    ) -> Result<Vec<u8>, JournalError> {
        let read_err = |source| JournalError::Read {
            path: path.display().to_string(),
            source,
        };
        let mut bytes = super::sized_buffer(len - from);
        file.seek(SeekFrom::Start(from)).map_err(read_err)?;
        file.take(JOURNAL_LIMIT + 1 - from)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        Ok(bytes)
    }

    #[cfg(test)]
    pub(super) fn remembers(path: &Path) -> bool {
        journals().by_path.contains_key(path)
    }
}

mod flags {
    use nix::fcntl::OFlag;
    pub const NOFOLLOW_NONBLOCK_CLOEXEC: i32 =
        OFlag::O_NOFOLLOW.bits() | OFlag::O_NONBLOCK.bits() | OFlag::O_CLOEXEC.bits();
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::Stage;

    fn spec(case: serde_json::Value) -> SpecRecord {
        SpecRecord {
            schema_version: crate::RECORD_SCHEMA_VERSION.into(),
            key: casebatch_proto::AttemptKey {
                batch_id: "b".into(),
                case_index: 0,
                attempt: 1,
                bundle_dir: "/nowhere".into(),
                memory_boost_mb: None,
                runtime: None,
            },
            case,
            simulated: false,
        }
    }

    fn job(state: crate::JobState, pid: Option<u32>) -> JobEntry {
        JobEntry::Process(crate::JobRecord {
            schema_version: crate::RECORD_SCHEMA_VERSION.into(),
            marker: "b/0/1".into(),
            state,
            pid,
            start_ticks: None,
            started_at_ms: 1,
            started_at_boot_ms: None,
            timeout_seconds: 60,
            memory: crate::local::memlimit::MemoryLimit::None,
            tracking: Default::default(),
            starts: 1,
            owner: None,
            recovered: false,
            scratch: None,
        })
    }

    fn json<T: Serialize>(value: &T) -> String {
        serde_json::to_string(value).unwrap()
    }

    fn pid_of(j: &AttemptJournal) -> Option<u32> {
        j.job.as_ref()?.process()?.pid
    }

    fn timing(stage: Stage, at: u64) -> StageTiming {
        StageTiming {
            stage,
            started_at_ms: at,
            ended_at_ms: at + 1,
            duration_ms: 1,
            resumed: None,
        }
    }

    #[test]
    fn the_last_entry_of_each_kind_counts_and_stages_add_up() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(*AttemptJournal::read(d).unwrap(), AttemptJournal::default());
        append(d, &[Entry::Spec(spec(serde_json::json!(1)))]).unwrap();
        append(d, &[Entry::Job(job(crate::JobState::Starting, None))]).unwrap();
        append(
            d,
            &[
                Entry::Job(job(crate::JobState::Running, Some(42))),
                Entry::Stage(timing(Stage::Provision, 1)),
                Entry::Stage(timing(Stage::Submit, 2)),
            ],
        )
        .unwrap();
        // As the wrapper writes them, from a shell.
        std::fs::OpenOptions::new()
            .append(true)
            .open(path(d))
            .unwrap()
            .write_all(b"{\"wrapper\":[42,null]}\n{\"exit\":3}\n")
            .unwrap();
        let j = AttemptJournal::read(d).unwrap();
        assert_eq!(
            j.job.as_ref().and_then(|j| j.process()).map(|r| r.state),
            Some(crate::JobState::Running)
        );
        assert_eq!(j.wrapper, Some((42, None)));
        assert_eq!(j.exit, Some(3));
        assert_eq!(
            j.stages.iter().map(|t| t.stage).collect::<Vec<_>>(),
            [Stage::Provision, Stage::Submit]
        );
        assert!(j.unreadable_lines.is_empty());
    }

    #[test]
    fn a_write_cut_short_is_skipped_and_damage_is_named_when_strict() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        append(d, &[Entry::Exit(0)]).unwrap();
        let mut f = open_for_append(d).unwrap();
        f.write_all(b"{\"exit\":").unwrap();
        let j = AttemptJournal::read_strict(d).unwrap();
        assert_eq!(j.exit, Some(0), "a torn last line is a write cut short");
        f.write_all(b" oops}\n{\"exit\":5}\n").unwrap();
        let j = AttemptJournal::read(d).unwrap();
        assert_eq!((j.exit, j.unreadable_lines.clone()), (Some(5), vec![2]));
        let err = AttemptJournal::read_strict(d).unwrap_err().to_string();
        assert!(
            err.contains("attempt.jsonl") && err.contains("line 2"),
            "{err}"
        );
    }

    #[test]
    fn an_attempt_from_before_journals_reads_from_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("spec.json"), json(&spec(serde_json::json!(1)))).unwrap();
        std::fs::write(
            d.join("job.json"),
            json(&job(crate::JobState::Running, Some(7))),
        )
        .unwrap();
        std::fs::write(d.join("wrapper.pid"), "7 99\n").unwrap();
        std::fs::write(d.join("exit_status"), "2\n").unwrap();
        let stage = serde_json::to_string(&timing(Stage::Await, 5)).unwrap();
        std::fs::write(d.join("stages.jsonl"), format!("{stage}\n")).unwrap();
        let j = AttemptJournal::read(d).unwrap();
        assert_eq!(j.spec.as_ref().unwrap().case, 1);
        assert_eq!(pid_of(&j), Some(7));
        assert_eq!((j.wrapper, j.exit), (Some((7, Some(99))), Some(2)));
        assert_eq!(j.stages.len(), 1);
        // A job record written by an older agent, where no spec is kept.
        let agent = tempfile::tempdir().unwrap();
        let old = json(&job(crate::JobState::Running, Some(8)));
        std::fs::write(agent.path().join("job.json"), old).unwrap();
        assert_eq!(
            pid_of(&AttemptJournal::read(agent.path()).unwrap()),
            Some(8)
        );
    }

    #[test]
    fn a_journal_replaced_by_a_symlink_or_fifo_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink("/dev/zero", path(d)).unwrap();
        assert!(AttemptJournal::read(d).is_err());
        assert!(append(d, &[Entry::Exit(0)]).is_err());
        std::fs::remove_file(path(d)).unwrap();
        nix::unistd::mkfifo(&path(d), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(AttemptJournal::read(d).is_err());
        assert!(append(d, &[Entry::Exit(0)]).is_err());
    }

    /// The journal as a read of the whole file folds it, for comparing.
    fn folded_whole(d: &Path) -> AttemptJournal {
        let mut j = AttemptJournal::default();
        j.fold_lines(&std::fs::read(path(d)).unwrap(), 0);
        j
    }

    #[test]
    fn a_journal_read_again_folds_what_was_appended_since_as_a_whole_read_would() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut wrapper = open_for_append(d).unwrap();
        append(d, &[Entry::Spec(spec(serde_json::json!(1)))]).unwrap();
        let first = AttemptJournal::read(d).unwrap();
        assert_eq!(*first, folded_whole(d));
        append(d, &[Entry::Job(job(crate::JobState::Starting, None))]).unwrap();
        // Half a line from the wrapper, then damage, then whole lines.
        wrapper.write_all(b"{\"wrapper\":[42,").unwrap();
        let torn = AttemptJournal::read(d).unwrap();
        assert_eq!((torn.job.is_some(), torn.wrapper), (true, None));
        wrapper
            .write_all(b"7]}\nnot json\n\n{\"exit\":3}\n")
            .unwrap();
        append(d, &[Entry::Stage(timing(Stage::Await, 9))]).unwrap();
        let again = AttemptJournal::read(d).unwrap();
        assert_eq!(*again, folded_whole(d));
        assert_eq!(
            (again.wrapper, again.exit, again.unreadable_lines.clone()),
            (Some((42, Some(7))), Some(3), vec![4])
        );
        assert_eq!(again.spec, first.spec);
        assert_eq!(AttemptJournal::read(d).unwrap(), again, "nothing appended");
    }

    #[test]
    fn a_journal_is_shared_while_unchanged_and_folded_in_place_once_its_readers_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        append(d, &[Entry::Spec(spec(serde_json::json!(1)))]).unwrap();
        let held = AttemptJournal::read(d).unwrap();
        assert!(Arc::ptr_eq(&held, &AttemptJournal::read(d).unwrap()));
        // A reader still holds it: the fold leaves that reader's snapshot as it was.
        append(d, &[Entry::Exit(3)]).unwrap();
        let after = AttemptJournal::read(d).unwrap();
        assert_eq!((held.exit, after.exit), (None, Some(3)));
        // Nobody holds it: the next fold changes it where it is kept, without a copy.
        let at = Arc::as_ptr(&after);
        drop((held, after));
        append(d, &[Entry::Exit(4)]).unwrap();
        let last = AttemptJournal::read(d).unwrap();
        assert_eq!(Arc::as_ptr(&last), at);
        assert_eq!(*last, folded_whole(d));
    }

    #[test]
    fn a_journal_replaced_or_cut_shorter_is_read_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        append(d, &[Entry::Exit(1), Entry::Exit(2)]).unwrap();
        assert_eq!(AttemptJournal::read(d).unwrap().exit, Some(2));
        // Another file in its place, as long as the one read: another inode.
        let other = d.join("other");
        std::fs::write(&other, b"{\"exit\":7}\n{\"exit\":8}\n").unwrap();
        std::fs::rename(&other, path(d)).unwrap();
        assert_eq!(AttemptJournal::read(d).unwrap().exit, Some(8));
        // The same file, shorter than what was folded.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path(d))
            .unwrap();
        f.set_len(0).unwrap();
        drop(f);
        append(d, &[Entry::Exit(5)]).unwrap();
        assert_eq!(*AttemptJournal::read(d).unwrap(), folded_whole(d));
        assert_eq!(AttemptJournal::read(d).unwrap().exit, Some(5));
    }

    #[test]
    fn only_the_journals_read_last_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let attempts: Vec<PathBuf> = (0..=seen::KEEP)
            .map(|i| {
                let d = dir.path().join(i.to_string());
                std::fs::create_dir(&d).unwrap();
                append(&d, &[Entry::Exit(0)]).unwrap();
                AttemptJournal::read(&d).unwrap();
                d
            })
            .collect();
        assert!(!seen::remembers(&path(&attempts[0])));
        assert!(seen::remembers(&path(&attempts[seen::KEEP])));
    }

    #[test]
    fn a_journal_larger_than_what_is_kept_is_read_whole_and_crowds_out_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (small, large) = (dir.path().join("small"), dir.path().join("large"));
        for d in [&small, &large] {
            std::fs::create_dir(d).unwrap();
        }
        append(&small, &[Entry::Exit(0)]).unwrap();
        AttemptJournal::read(&small).unwrap();
        let input = "x".repeat(seen::BYTES as usize);
        append(
            &large,
            &[Entry::Spec(spec(serde_json::json!({"input": input})))],
        )
        .unwrap();
        assert!(AttemptJournal::read(&large).unwrap().spec.is_some());
        assert!(!seen::remembers(&path(&large)));
        assert!(seen::remembers(&path(&small)));
        append(&large, &[Entry::Exit(4)]).unwrap();
        assert_eq!(AttemptJournal::read(&large).unwrap().exit, Some(4));
    }

    #[test]
    fn the_oldest_journals_go_once_those_kept_hold_too_many_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let input = "x".repeat(seen::BYTES as usize * 2 / 5);
        let read: Vec<PathBuf> = ["a", "b", "c"]
            .iter()
            .map(|name| {
                let d = dir.path().join(name);
                std::fs::create_dir(&d).unwrap();
                append(
                    &d,
                    &[Entry::Spec(spec(serde_json::json!({"input": input})))],
                )
                .unwrap();
                AttemptJournal::read(&d).unwrap();
                d
            })
            .collect();
        let kept: Vec<bool> = read.iter().map(|d| seen::remembers(&path(d))).collect();
        assert_eq!(kept, [false, true, true]);
    }
}
