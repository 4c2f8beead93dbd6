//! `engine status --json`: the embedded engine of an output root.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What `casebatch engine status` shows about an output root's embedded engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EngineStatus {
    /// The engine's state directory (`<output-dir>/.casebatch-engine`).
    pub state_dir: String,
    /// An engine of this output root is running.
    pub running: bool,
    /// Its frontend address (`host:port`), while it runs.
    pub address: Option<String>,
    /// The dev server's process id, while it runs.
    pub server_pid: Option<u32>,
    /// Its keeper's process id, while the keeper runs.
    pub keeper_pid: Option<u32>,
    /// casebatch processes using it right now.
    pub users: Vec<u32>,
    /// Seconds unused before its keeper stops it, when one was set.
    pub idle_timeout_secs: Option<u64>,
    /// Its Web UI (`http://127.0.0.1:PORT`, loopback only), when it serves one
    /// (`casebatch engine ui`, or `--ui`).
    pub ui_address: Option<String>,
    /// The engine's database file.
    pub db: String,
    /// The engine's log file.
    pub log: String,
}
