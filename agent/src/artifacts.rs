//! FetchArtifacts: an ended attempt's files (the actor's, or the evaluator's) as chunks, read on a blocking thread with the
//! rules for untrusted attempt files (`casebatch_attempt::files`): regular files only,
//! symlinks never followed (not even to descend into a directory), each file capped at the
//! agent's `CASEBATCH_MAX_RESULT_BYTES`. A file refused by those rules is left out of the
//! stream and named in the agent's log; the actor's report already classifies a result file
//! that was refused.

use std::io::Read;
use std::path::{Path, PathBuf};

use casebatch_attempt::{attempt_files, files};
use casebatch_proto::runtime_v1::{ArtifactChunk, ArtifactSet};
use tokio::sync::mpsc;
use tonic::Status;

/// The largest chunk sent.
pub(crate) const CHUNK: usize = 1024 * 1024;
/// Files under `output/` sent at most (a harness could create millions).
const MAX_OUTPUT_FILES: usize = 100_000;

/// The files sent, in order: relative path (with `/`) and absolute path.
fn files(dir: &Path, set: ArtifactSet) -> Vec<(String, PathBuf)> {
    let top: &[&str] = match set {
        ArtifactSet::Actor => &[
            attempt_files::RESULT,
            attempt_files::STDOUT,
            attempt_files::STDERR,
            attempt_files::legacy::JOB,
        ],
        // Only the evaluator's own files: the actor's were fetched when it ended.
        ArtifactSet::Evaluator => &[
            attempt_files::EVAL_RESULT,
            attempt_files::EVAL_STDOUT,
            attempt_files::EVAL_STDERR,
        ],
    };
    let mut out: Vec<(String, PathBuf)> = top
        .iter()
        .map(|name| (name.to_string(), dir.join(name)))
        .collect();
    if set == ArtifactSet::Evaluator {
        return out;
    }
    // Depth-first without recursion; entries sorted so the order is stable.
    let mut stack = vec![(
        attempt_files::OUTPUT.to_string(),
        dir.join(attempt_files::OUTPUT),
    )];
    let mut found = Vec::new();
    while let Some((rel, path)) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&path) else {
            tracing::warn!("artifacts: {} is unreadable; left out", path.display());
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries.into_iter().rev() {
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                tracing::warn!(
                    "artifacts: {} has a name that is not UTF-8; left out",
                    e.path().display()
                );
                continue;
            };
            let child_rel = format!("{rel}/{name}");
            // The entry's own type: a symlink is never followed.
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push((child_rel, e.path())),
                Ok(t) if t.is_file() => found.push((child_rel, e.path())),
                _ => tracing::warn!("artifacts: {child_rel} is not a regular file; left out"),
            }
        }
        if found.len() > MAX_OUTPUT_FILES {
            tracing::warn!(
                "artifacts: more than {MAX_OUTPUT_FILES} files under output/; the rest is left out"
            );
            found.truncate(MAX_OUTPUT_FILES);
            break;
        }
    }
    found.sort();
    out.extend(found);
    out
}

/// Sends one file as chunks of at most [`CHUNK`] bytes (one empty chunk for an empty file).
/// `false`: the receiver is gone.
fn send_file(
    rel: &str,
    path: &Path,
    limit: u64,
    tx: &mpsc::Sender<Result<ArtifactChunk, Status>>,
) -> bool {
    let file = match files::open_regular(path, limit) {
        Ok(Some(f)) => f,
        Ok(None) => return true,
        Err(e) => {
            tracing::warn!("artifacts: {rel} left out: {e}");
            return true;
        }
    };
    // Never more than the limit, even from a file that grows while it is read.
    let mut reader = file.take(limit);
    let mut sent_any = false;
    loop {
        let mut buf = vec![0u8; CHUNK];
        let mut n = 0;
        // Fill the chunk (short reads are allowed by `read`).
        while n < CHUNK {
            match reader.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("artifacts: {rel}: read failed after {n} bytes of a chunk: {e}");
                    break;
                }
            }
        }
        if n == 0 && sent_any {
            return true;
        }
        buf.truncate(n);
        let chunk = ArtifactChunk {
            path: rel.to_string(),
            data: buf,
        };
        if tx.blocking_send(Ok(chunk)).is_err() {
            return false;
        }
        sent_any = true;
        if n < CHUNK {
            return true;
        }
    }
}

/// Sends the job entry of the attempt's journal under its wire name, `job.json` (the name
/// the file had before journals; the worker appends it to its own journal). `false`: the
/// receiver is gone.
fn send_job(dir: &Path, tx: &mpsc::Sender<Result<ArtifactChunk, Status>>) -> bool {
    let job = match casebatch_attempt::AttemptJournal::read(dir) {
        Ok(j) => j.job.clone(),
        Err(e) => {
            tracing::warn!("artifacts: the job record left out: {e}");
            None
        }
    };
    let Some(job) = job else {
        return true;
    };
    let chunk = ArtifactChunk {
        path: attempt_files::legacy::JOB.to_string(),
        data: serde_json::to_vec(&job).expect("job records always serialize"),
    };
    tx.blocking_send(Ok(chunk)).is_ok()
}

/// Streams the attempt's files of `set` into `tx` from a blocking thread.
pub(crate) fn stream(
    dir: PathBuf,
    set: ArtifactSet,
    tx: mpsc::Sender<Result<ArtifactChunk, Status>>,
) {
    let limit = files::max_result_bytes();
    tokio::task::spawn_blocking(move || {
        for (rel, path) in files(&dir, set) {
            let sent = if rel == attempt_files::legacy::JOB {
                send_job(&dir, &tx)
            } else {
                send_file(&rel, &path, limit, &tx)
            };
            if !sent {
                return;
            }
        }
    });
}
