//! Who may stop the embedded engine, and when: leases of the casebatch processes using it,
//! and the keeper process that stops it once nobody has used it for a while.
//!
//! A runner that is SIGKILLed cannot stop the dev server it started, and the server would run
//! for good. So the server runs as the child of a keeper (`casebatch engine keep`, hidden),
//! which stops it once no lease has been live for the idle timeout ([`IDLE_ENV`], default
//! [`DEFAULT_IDLE`]). The server is also asked to die with its keeper (a parent-death signal
//! set by `setpriv`), where the kernel delivers it (some sandboxes do not); a server whose
//! keeper was killed is stopped by its last user, or taken over by the next command.
//!
//! Every casebatch process that uses the engine holds a lease, a file
//! `users/<pid>-<start ticks>-<n>` in the engine's state directory, taken and released under the
//! state lock. A lease whose process is gone (killed) no longer counts. The last process to
//! release its lease stops the engine right away, also one that only found it running: it
//! took it over. The idle timeout only matters after a crash, and leaves a moment for a
//! `resume` to reuse the running engine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use casebatch_attempt::local::procfs::ProcessId;

/// Seconds an engine with no live lease keeps running before its keeper stops it.
pub const IDLE_ENV: &str = "CASEBATCH_ENGINE_IDLE_SECS";
pub const DEFAULT_IDLE: Duration = Duration::from_secs(120);
const USERS_DIR: &str = "users";
/// Where the keeper writes its server's pid (the runner records it in `engine.json`).
pub(crate) const SERVER_PID_FILE: &str = "server.pid";
const POLL: Duration = Duration::from_secs(1);

/// The idle timeout this process passes to a keeper it starts.
pub fn idle_timeout() -> Duration {
    std::env::var(IDLE_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(DEFAULT_IDLE, Duration::from_secs)
}

/// This process's use of the engine. Take and release it under the state lock.
#[derive(Debug)]
pub(crate) struct Lease {
    path: PathBuf,
}

impl Lease {
    pub(crate) fn take(state_dir: &Path) -> std::io::Result<Self> {
        // One per use: a process that connects twice holds two leases, released apart.
        static TAKEN: AtomicU32 = AtomicU32::new(0);
        let me = ProcessId::this()
            .ok_or_else(|| std::io::Error::other("cannot read this process's start time"))?;
        let dir = state_dir.join(USERS_DIR);
        std::fs::create_dir_all(&dir)?;
        let n = TAKEN.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{}-{}-{n}", me.pid, me.start_ticks));
        std::fs::write(&path, b"")?;
        Ok(Self { path })
    }

    pub(crate) fn release(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The processes holding a live lease on the engine; leases of dead processes are removed.
pub fn live_users(state_dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(state_dir.join(USERS_DIR)) else {
        return Vec::new();
    };
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let parsed = name.to_str().and_then(|n| {
            let mut parts = n.split('-');
            Some(ProcessId {
                pid: parts.next()?.parse().ok()?,
                start_ticks: parts.next()?.parse().ok()?,
            })
        });
        match parsed {
            Some(p) if p.is_alive() => live.push(p.pid),
            _ => {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    live.sort_unstable();
    live.dedup();
    live
}

/// `casebatch engine keep`: runs `server` (the dev server's command) as its child until the
/// server exits, the keeper is killed (the server dies with it), or no lease has been live
/// for `idle`. Returns the exit code. `lock` takes the engine's state lock (the guard it
/// returns holds it), under which the last check before stopping is made.
pub fn keep<G>(
    state_dir: &Path,
    mut server: Command,
    idle: Duration,
    lock: impl Fn() -> Option<G>,
) -> i32 {
    let mut child = match server.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("casebatch engine keeper: failed to start the dev server: {e}");
            return 1;
        }
    };
    let pid_file = state_dir.join(SERVER_PID_FILE);
    let tmp = state_dir.join(format!("{SERVER_PID_FILE}.tmp"));
    if std::fs::write(&tmp, child.id().to_string())
        .and_then(|()| std::fs::rename(&tmp, &pid_file))
        .is_err()
    {
        let _ = child.kill();
        return 1;
    }
    let mut idle_since: Option<Instant> = None;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.code().unwrap_or(1),
            Ok(None) => {}
            Err(_) => return 1,
        }
        if !live_users(state_dir).is_empty() {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= idle {
            // Under the state lock: a command arriving now either took its lease first (the
            // engine stays) or finds it stopped and starts its own.
            if let Some(_lock) = lock()
                && live_users(state_dir).is_empty()
            {
                eprintln!(
                    "casebatch engine keeper: no casebatch process has used this engine for {}s: stopping it",
                    idle.as_secs()
                );
                let _ = child.kill();
                let _ = child.wait();
                return 0;
            }
            idle_since = None;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_counts_while_its_process_lives_and_a_dead_ones_is_swept() {
        let dir = tempfile::tempdir().unwrap();
        let lease = Lease::take(dir.path()).unwrap();
        assert_eq!(live_users(dir.path()), vec![std::process::id()]);
        // A lease left by a process that is gone (a recycled pid has another start time).
        let me = ProcessId::this().unwrap();
        let stale = dir
            .path()
            .join(USERS_DIR)
            .join(format!("{}-{}-0", me.pid, me.start_ticks + 1));
        std::fs::write(&stale, b"").unwrap();
        assert_eq!(live_users(dir.path()), vec![std::process::id()]);
        assert!(!stale.exists(), "the dead process's lease is swept");
        lease.release();
        assert!(live_users(dir.path()).is_empty());
    }
}
