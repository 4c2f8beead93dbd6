//! `casebatch agent`: a host that runs attempts' jobs for any worker, over gRPC
//! (`casebatch.runtime.v1.Runtime`, see `proto/proto/casebatch/runtime/v1/runtime.proto`), and
//! outlives the workers that submit to it.
//!
//! Owns the server side of the runtime protocol: the job table (SQLite, [`table`]), the
//! envelope (max concurrent jobs, declared-memory budget), authentication (a bearer token,
//! TLS), the data directory's lock and readiness file. Jobs run through the same executor seam
//! a worker uses (`casebatch_attempt::Executor`): the local-process machinery of
//! `casebatch-attempt` (wrapper, process group, job intents in the attempt's journal, memory
//! limits, cleanup), or a container with `--sandbox container`; this crate never starts or
//! signals a process itself. What reaches it is proto's (a submit is an attempt key and a
//! `JobSpec`, contract v2; a request of another contract version is refused naming both), what
//! runs it is the attempt crate's: it depends on neither the manifest nor the bundle crate. It
//! must not know Temporal, manifests, or the bundle's layout beyond an attempt's own files.
//!
//! ```text
//! D/agent.lock                 flock held for the agent's life (its pid inside)
//! D/agent.addr                 the bound address, written once serving (readiness)
//! D/jobs.sqlite                the job table (WAL)
//! D/batches/<batch>-<hash>/cases/<case_dir>/attempts/<n>/   each job's attempt directory
//! ```
//!
//! Lifecycle of a job (`jobs.rs`): Submit admits it under one lock (envelope checked, row
//! `starting` inserted), a task provisions and submits it with `LocalProcess` (row `running`
//! with the wrapper's pid and start time), then awaits it (row `ended` with the actor's
//! report). An agent that restarts on the same data directory gives every row not `ended`
//! its task again: `LocalProcess` finds what the earlier life started by the attempt's
//! journal (job, wrapper and exit entries) and `/proc`, so nothing is lost and nothing runs
//! twice.
//! An ended job is evaluated on request (Evaluate: the job's evaluator, run once inside the
//! job's cgroup and recorded in its row; `evaluations.rs`). An ended job's row and attempt
//! directory are removed `--keep-ended` after it ended (`retention.rs`), cleaned up first when
//! no worker did.
//!
//! Harness environment: as for `local-process`, an allowlist; `pass_env` names are read from
//! the *agent's* environment (export them where the agent runs), never from the worker's.
//! The agent's own token variable is never passed to a harness.

mod artifacts;
mod auth;
mod config;
mod datadir;
mod evaluations;
mod jobs;
mod retention;
mod service;
pub mod table;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use casebatch_proto::runtime_v1::runtime_server::RuntimeServer;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

pub use casebatch_proto::token::TokenSource;
pub use config::{AgentConfig, TlsFiles};
pub use retention::{DEFAULT_KEEP_ENDED, parse_keep_ended};

/// Default of `--max-concurrent`.
pub const DEFAULT_MAX_CONCURRENT: u32 = 64;
/// How long a stopping agent waits for open connections before it exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the agent could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A flag, token or certificate is missing or unusable.
    #[error("{0}")]
    Config(String),
    #[error(
        "data dir {} is in use by another casebatch agent ({}); stop it, or give this agent another --data-dir",
        data_dir.display(),
        pid.map_or("pid unknown".to_string(), |p| format!("pid {p}"))
    )]
    InUse { data_dir: PathBuf, pid: Option<u32> },
    #[error("failed to use the data dir {}: {source}", path.display())]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to open the job table {}: {source}", path.display())]
    Table {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the job table {} has schema version {found}, but this agent knows versions up to {latest}: a newer casebatch agent wrote it; run that version (or a later one) on this data dir, or give this agent another --data-dir",
        path.display()
    )]
    TableTooNew {
        path: PathBuf,
        found: i64,
        latest: u32,
    },
    #[error("failed to listen on {addr} (--listen): {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent's server failed: {0}")]
    Serve(String),
}

/// What an agent's `/metrics` shows. Cloning shares the agent's job table.
#[derive(Clone)]
pub struct AgentMetrics(Arc<jobs::Jobs>);

impl AgentMetrics {
    /// The Prometheus text exposition: `casebatch_agent_jobs{state}`, the envelope's use and
    /// limits, jobs re-attached at start.
    pub async fn render(&self) -> String {
        self.0.exposition().await
    }
}

/// A started agent: data dir locked, job table open, jobs re-attached, socket bound. Serving
/// starts with [`Agent::serve`].
pub struct Agent {
    addr: SocketAddr,
    data_dir: PathBuf,
    listener: tokio::net::TcpListener,
    jobs: Arc<jobs::Jobs>,
    security: config::Security,
    keep_ended: Option<Duration>,
    _lock: datadir::DataDirLock,
}

impl Agent {
    /// Checks the configuration (nothing is touched when it is refused), takes the data dir,
    /// opens the job table, binds, re-attaches every job not ended, and writes `agent.addr`.
    pub async fn start(config: AgentConfig) -> Result<Self, AgentError> {
        let security = config::Security::resolve(&config)?;
        let data_dir = datadir::prepare(&config.data_dir)?;
        let lock = datadir::DataDirLock::take(&data_dir)?;
        datadir::remove_addr(&data_dir)?;
        let table_path = data_dir.join(datadir::TABLE);
        let table = table::Table::open(&table_path).map_err(|e| match e {
            table::OpenError::Sqlite(source) => AgentError::Table {
                path: table_path.clone(),
                source,
            },
            table::OpenError::Newer { found, latest } => AgentError::TableTooNew {
                path: table_path.clone(),
                found,
                latest,
            },
        })?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| AgentError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| AgentError::Bind {
            addr: config.listen,
            source,
        })?;
        let jobs = Arc::new(jobs::Jobs::new(
            table,
            jobs::Envelope {
                max_concurrent: config.max_concurrent,
                memory_budget_mb: config.memory_budget_mb,
            },
            data_dir.join(datadir::BATCHES),
            security.token_env(),
            config
                .containers
                .then(casebatch_container::ContainerRuntime::default),
        ));
        jobs.reattach().await.map_err(|e| AgentError::Table {
            path: table_path,
            source: e,
        })?;
        datadir::write_addr(&data_dir, addr)?;
        Ok(Self {
            addr,
            data_dir,
            listener,
            jobs,
            security,
            keep_ended: config.keep_ended,
            _lock: lock,
        })
    }

    /// The address actually bound (`--listen 127.0.0.1:0` picks a port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Its metrics (jobs by state, envelope use), rendered at each scrape: give it to a
    /// metrics listener before [`Agent::serve`] consumes the agent.
    pub fn metrics(&self) -> AgentMetrics {
        AgentMetrics(self.jobs.clone())
    }

    /// Jobs of the table that were not ended when this agent started, now awaited again.
    pub fn reattached(&self) -> u32 {
        self.jobs.reattached()
    }

    /// Serves until `shutdown` completes, then stops accepting, ends open Watch streams
    /// (UNAVAILABLE: watch again) and returns. Running jobs keep running: they outlive the
    /// agent, and the next agent on this data dir re-attaches them.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        let Agent {
            addr: _,
            data_dir,
            listener,
            jobs,
            security,
            keep_ended,
            _lock,
        } = self;
        // Dropped with this call: retention runs while the agent serves.
        let pruner =
            keep_ended.map(|keep| AbortOnDrop(tokio::spawn(retention::run(jobs.clone(), keep))));
        let mut builder = Server::builder();
        if let Some(tls) = security.tls_config() {
            builder = builder.tls_config(tls).map_err(|e| {
                AgentError::Config(format!("failed to use --tls-cert/--tls-key: {e}"))
            })?;
        }
        let service = service::RuntimeService::new(jobs.clone());
        let svc = RuntimeServer::with_interceptor(service, security.interceptor());
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let stopper = jobs.clone();
        let signal = async move {
            shutdown.await;
            stopper.stopping().send_replace(true);
        };
        let serve = builder.serve_with_incoming_shutdown(svc, incoming, signal);
        let mut stopped = jobs.stopping().subscribe();
        let result = tokio::select! {
            r = serve => r.map_err(|e| AgentError::Serve(e.to_string())),
            _ = async {
                let _ = stopped.wait_for(|s| *s).await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {
                tracing::warn!("connections still open {SHUTDOWN_GRACE:?} after the stop signal; stopping anyway");
                Ok(())
            }
        };
        drop(pruner);
        let _ = datadir::remove_addr(&data_dir);
        result
    }
}

/// A background task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
