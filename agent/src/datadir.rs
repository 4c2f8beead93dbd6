//! The data directory: created private to the agent's user, held by one agent at a time
//! (`agent.lock`, an exclusive `flock` released when the holder dies, with its pid inside for
//! the refusal message), and its readiness file `agent.addr`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::AgentError;

pub(crate) const LOCK: &str = "agent.lock";
pub(crate) const ADDR: &str = "agent.addr";
pub(crate) const TABLE: &str = "jobs.sqlite";
pub(crate) const BATCHES: &str = "batches";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> AgentError + '_ {
    move |source| AgentError::DataDir {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates the data dir (mode 0700 when new) and returns its absolute path.
pub(crate) fn prepare(dir: &Path) -> Result<PathBuf, AgentError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    std::fs::canonicalize(dir).map_err(io_err(dir))
}

/// The data dir's lock, held for the agent's life.
pub(crate) struct DataDirLock {
    _lock: Flock<File>,
}

impl DataDirLock {
    pub(crate) fn take(dir: &Path) -> Result<Self, AgentError> {
        let path = dir.join(LOCK);
        // O_CLOEXEC (std's default): a job's process never inherits the lock, so a job that
        // outlives its agent does not keep the next agent out.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_err(&path))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                let mut f: &File = &lock;
                f.set_len(0).map_err(io_err(&path))?;
                f.rewind().map_err(io_err(&path))?;
                writeln!(f, "{}", std::process::id()).map_err(io_err(&path))?;
                Ok(Self { _lock: lock })
            }
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                Err(AgentError::InUse {
                    data_dir: dir.to_path_buf(),
                    pid: text.trim().parse().ok(),
                })
            }
            Err((_, e)) => Err(AgentError::DataDir {
                path,
                source: std::io::Error::from(e),
            }),
        }
    }
}

/// Written once the agent serves: `<ip>:<port>` and a newline, atomically (write, rename).
pub(crate) fn write_addr(dir: &Path, addr: SocketAddr) -> Result<(), AgentError> {
    let path = dir.join(ADDR);
    let tmp = dir.join(format!("{ADDR}.tmp"));
    std::fs::write(&tmp, format!("{addr}\n")).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_err(&path))
}

/// A stale `agent.addr` would announce an agent that is not serving.
pub(crate) fn remove_addr(dir: &Path) -> Result<(), AgentError> {
    let path = dir.join(ADDR);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&path)(e)),
        _ => Ok(()),
    }
}
