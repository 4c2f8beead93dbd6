//! Which Temporal the CLI talks to, and the connected client.
//!
//! With no address configured anywhere, the engine is the embedded dev server of the output
//! root (found or started, and from then on supervised, by `devserver.rs`). An address from
//! `--address` or Temporal's own settings (`TEMPORAL_ADDRESS`, a `temporal.toml` profile)
//! selects cluster mode, with namespace, TLS and API key from the same settings. Secrets are
//! read from there each time and never written to disk.
//!
//! A connection counts only once the server answers real calls: the first one is retried with
//! backoff for up to [`CONNECT_WAIT`] (a dev server accepts TCP connections a moment before
//! its frontend is healthy), so no command starts a worker or a batch against a server that is
//! still coming up. Configuration and authentication errors from a cluster are not retried.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use temporalio_client::envconfig::LoadClientConfigProfileOptions;
use temporalio_client::errors::ClientConnectError;
use temporalio_client::tonic::{self, Code};
use temporalio_client::{
    Client, ClientOptions, Connection, ConnectionOptions, GrpcCompression, WorkflowCountOptions,
};
use temporalio_common::protos::temporal::api::workflowservice::v1::DescribeNamespaceRequest;

use crate::devserver::{DevServer, DevServerError};

/// How long the first connection may take until the server answers a real call.
pub const CONNECT_WAIT: Duration = Duration::from_secs(30);
/// One attempt (connect, then the probe calls): a server that accepts connections but never
/// answers costs no more than this per try.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// On loopback (the embedded engine, a dev server of one's own) gzip saves no network and
/// costs CPU at both ends of every call: 3 % of the runner's samples in a batch of short
/// cases went to making compressors. Off loopback the client's default (gzip) stays.
const LOOPBACK_COMPRESSION: GrpcCompression = GrpcCompression::None;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    DevServer(#[from] DevServerError),
    #[error("failed to read Temporal client settings: {0}")]
    Config(String),
    #[error(
        "refusing to connect to {address} without TLS: plaintext (unauthenticated) connections are only allowed on loopback. Configure TLS (TEMPORAL_TLS*, TEMPORAL_API_KEY or a temporal.toml profile) and an https:// or bare host:port address"
    )]
    Insecure { address: String },
    #[error("failed to connect to Temporal at {address}: {message}")]
    Connect { address: String, message: String },
    /// Nothing final went wrong, but nothing answered within the bound either: a caller that
    /// is a service (a worker replica) may wait longer.
    #[error(
        "failed to connect to Temporal at {address}: no answer within {secs}s (last error: {last}); check the address and that the server is up"
    )]
    Unreachable {
        address: String,
        secs: u64,
        last: String,
    },
    #[error(
        "failed to reach the embedded Temporal dev server at {address}: it did not answer within {secs}s (last error: {last}); its log is {log}"
    )]
    NotServing {
        address: String,
        secs: u64,
        last: String,
        log: String,
    },
}

/// Where the engine is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineTarget {
    /// The dev server under this output root, with its Web UI on a loopback port when `ui`.
    Embedded { output_root: PathBuf, ui: bool },
    /// A cluster; `None` fields come from Temporal's environment/profile settings.
    Cluster {
        address: Option<String>,
        namespace: Option<String>,
        profile: Option<String>,
    },
}

impl EngineTarget {
    /// Cluster mode when an address is configured anywhere; the embedded default otherwise.
    pub fn resolve(
        output_root: &Path,
        address: Option<String>,
        namespace: Option<String>,
        profile: Option<String>,
    ) -> Self {
        let env_address = std::env::var("TEMPORAL_ADDRESS")
            .ok()
            .filter(|a| !a.is_empty());
        if address.is_some() || env_address.is_some() || profile.is_some() {
            EngineTarget::Cluster {
                address,
                namespace,
                profile,
            }
        } else {
            EngineTarget::Embedded {
                output_root: output_root.to_path_buf(),
                ui: false,
            }
        }
    }
}

/// A connected client, plus the dev server when embedded (supervised while this is held).
pub struct Engine {
    pub client: Client,
    pub address: String,
    pub namespace: String,
    pub embedded: Option<DevServer>,
}

impl Engine {
    /// Connects once the server answers, finding or starting the embedded dev server when
    /// that is the target.
    ///
    /// Boxed in a plain function so that the connection's code is compiled once, here: an
    /// `async fn` is compiled in each crate that awaits it, and Temporal's `Connection::connect`
    /// builds a gRPC client for every one of its services' 200-odd methods.
    pub fn connect(
        target: &EngineTarget,
    ) -> Pin<Box<dyn Future<Output = Result<Self, EngineError>> + Send + '_>> {
        Box::pin(Self::connect_when_serving(target))
    }

    async fn connect_when_serving(target: &EngineTarget) -> Result<Self, EngineError> {
        match target {
            EngineTarget::Embedded { output_root, ui } => {
                // Blocking: may wait for the state lock and for a new server's port to open.
                let (root, ui) = (output_root.clone(), *ui);
                let server = tokio::task::spawn_blocking(move || DevServer::ensure_with(&root, ui))
                    .await
                    .map_err(|e| EngineError::Config(format!("engine start-up failed: {e}")))??;
                let url: temporalio_client::Url = server
                    .address
                    .parse()
                    .map_err(|e| EngineError::Config(format!("{e}")))?;
                let conn = ConnectionOptions::new(url)
                    .connect_timeout(ATTEMPT_TIMEOUT)
                    .grpc_compression(LOOPBACK_COMPRESSION)
                    .build();
                // On failure `server` is dropped, which stops a server this process started.
                let client = connect_until_serving(conn, "default", Mode::Embedded)
                    .await
                    .map_err(|f| EngineError::NotServing {
                        address: server.address.clone(),
                        secs: CONNECT_WAIT.as_secs(),
                        last: f.message(),
                        log: server.log.display().to_string(),
                    })?;
                Ok(Self {
                    client,
                    address: server.address.clone(),
                    namespace: "default".into(),
                    embedded: Some(server),
                })
            }
            EngineTarget::Cluster {
                address,
                namespace,
                profile,
            } => {
                let mut opts = LoadClientConfigProfileOptions::default();
                opts.config_file_profile = profile.clone();
                let (mut conn, client_opts) = ClientOptions::load_from_config(opts)
                    .map_err(|e| EngineError::Config(e.to_string()))?;
                if let Some(a) = address {
                    // A bare host:port takes its scheme from the TLS settings, so an address
                    // flag can never silently downgrade a TLS connection to plaintext.
                    let scheme = if conn.tls_options.is_some() {
                        "https"
                    } else {
                        "http"
                    };
                    let with_scheme = if a.contains("://") {
                        a.clone()
                    } else {
                        format!("{scheme}://{a}")
                    };
                    conn.target = with_scheme
                        .parse()
                        .map_err(|e| EngineError::Config(format!("bad address {a}: {e}")))?;
                }
                let ns = namespace.clone().unwrap_or(client_opts.namespace.clone());
                let addr = conn.target.to_string();
                let loopback = matches!(
                    conn.target.host_str(),
                    Some("127.0.0.1" | "localhost" | "[::1]" | "::1")
                );
                // An API key over plaintext would leak the key: off loopback, TLS is required.
                let plaintext = conn.tls_options.is_none() || conn.target.scheme() == "http";
                if !loopback && plaintext {
                    return Err(EngineError::Insecure { address: addr });
                }
                if conn.connect_timeout.is_none() {
                    conn.connect_timeout = Some(ATTEMPT_TIMEOUT);
                }
                if loopback {
                    conn.grpc_compression = LOOPBACK_COMPRESSION;
                }
                let client = connect_until_serving(conn, &ns, Mode::Cluster)
                    .await
                    .map_err(|f| match f {
                        Failure::Fatal(message) => EngineError::Connect {
                            address: addr.clone(),
                            message,
                        },
                        Failure::TimedOut(last) => EngineError::Unreachable {
                            address: addr.clone(),
                            secs: CONNECT_WAIT.as_secs(),
                            last,
                        },
                    })?;
                Ok(Self {
                    client,
                    address: addr,
                    namespace: ns,
                    embedded: None,
                })
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Our own dev server: any error within the bound means "still starting".
    Embedded,
    /// A cluster: configuration and authentication errors are final.
    Cluster,
}

/// Why an attempt, or the first connection as a whole, failed.
#[derive(Debug)]
enum Failure {
    /// Retrying cannot help (bad configuration, credentials, unknown namespace).
    Fatal(String),
    /// For an attempt: worth retrying. For the connection: the bound ran out; the last error.
    TimedOut(String),
}

impl Failure {
    fn message(self) -> String {
        match self {
            Failure::Fatal(m) | Failure::TimedOut(m) => m,
        }
    }
}

/// Connects and probes until the server answers, with backoff, within [`CONNECT_WAIT`].
async fn connect_until_serving(
    conn: ConnectionOptions,
    namespace: &str,
    mode: Mode,
) -> Result<Client, Failure> {
    let deadline = Instant::now() + CONNECT_WAIT;
    let mut backoff = FIRST_BACKOFF;
    let mut client: Option<Client> = None;
    loop {
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .min(ATTEMPT_TIMEOUT);
        let tried =
            tokio::time::timeout(budget, attempt(&mut client, &conn, namespace, mode)).await;
        let last = match tried {
            Ok(Ok(())) => return Ok(client.expect("connected")),
            Ok(Err(Failure::Fatal(m))) => return Err(Failure::Fatal(m)),
            Ok(Err(Failure::TimedOut(m))) => m,
            Err(_) => format!("no answer within {:.1}s", budget.as_secs_f32()),
        };
        if Instant::now() + backoff >= deadline {
            return Err(Failure::TimedOut(last));
        }
        tracing::debug!("Temporal at {} is not serving yet: {last}", conn.target);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One try: connect (unless connected by an earlier try), then real calls. An error that is
/// worth retrying comes back as `TimedOut`.
async fn attempt(
    client: &mut Option<Client>,
    conn: &ConnectionOptions,
    namespace: &str,
    mode: Mode,
) -> Result<(), Failure> {
    if client.is_none() {
        *client = Some(dial(conn.clone(), namespace, mode).await?);
    }
    let c = client.as_ref().expect("connected");
    let request = DescribeNamespaceRequest {
        namespace: namespace.to_string(),
        ..Default::default()
    };
    let described = c
        .connection()
        .workflow_service()
        .describe_namespace(tonic::Request::new(request))
        .await;
    match (described, mode) {
        (Ok(_), _) => {}
        (Err(s), Mode::Embedded) => return Err(Failure::TimedOut(status_text(&s))),
        // The server answered; a worker's credentials need not read namespace metadata.
        (Err(s), Mode::Cluster) if s.code() == Code::PermissionDenied => {}
        (Err(s), Mode::Cluster) if s.code() == Code::NotFound => {
            return Err(Failure::Fatal(format!(
                "namespace {namespace:?} does not exist there (set --namespace or TEMPORAL_NAMESPACE)"
            )));
        }
        (Err(s), Mode::Cluster) => return Err(classify(&s)),
    }
    if mode == Mode::Embedded {
        // Visibility answers too: a command's first real call (describe, count, list) must
        // not be mistaken for "no such batch".
        c.count_workflows("", WorkflowCountOptions::default())
            .await
            .map_err(|e| Failure::TimedOut(e.to_string()))?;
    }
    Ok(())
}

async fn dial(conn: ConnectionOptions, namespace: &str, mode: Mode) -> Result<Client, Failure> {
    let connection = Connection::connect(conn).await.map_err(|e| match e {
        ClientConnectError::TonicTransportError(t) => Failure::TimedOut(transport_text(&t)),
        // Connect makes a first call (GetSystemInfo): a dev server answers it with
        // "Frontend is not healthy yet" while it starts.
        ClientConnectError::SystemInfoCallError(s) if mode == Mode::Embedded => {
            Failure::TimedOut(status_text(&s))
        }
        ClientConnectError::SystemInfoCallError(s) => classify(&s),
        ClientConnectError::DnsResolutionError { host, source } => {
            Failure::TimedOut(format!("cannot resolve {host}: {source}"))
        }
        other => Failure::Fatal(other.to_string()),
    })?;
    Client::new(connection, ClientOptions::new(namespace).build())
        .map_err(|e| Failure::Fatal(e.to_string()))
}

/// A cluster's answer: transient codes are retried, the rest are final.
fn classify(s: &tonic::Status) -> Failure {
    match s.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Internal
        | Code::Unknown
        | Code::Cancelled => Failure::TimedOut(status_text(s)),
        Code::Unauthenticated | Code::PermissionDenied => Failure::Fatal(format!(
            "not authorized ({}); check TEMPORAL_API_KEY or the TLS client certificate",
            s.message()
        )),
        _ => Failure::Fatal(status_text(s)),
    }
}

fn status_text(s: &tonic::Status) -> String {
    if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        format!("{:?}: {}", s.code(), s.message())
    }
}

/// The innermost cause (e.g. "Connection refused") rather than "transport error".
fn transport_text(e: &tonic::transport::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = s.to_string();
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workflow task held open while more events arrive than the server buffers by default
    /// (100) is not force-closed on the embedded engine: its completion is accepted, and the
    /// worker keeps the run in its cache instead of replaying its whole history.
    #[tokio::test]
    async fn the_embedded_engine_waits_out_a_long_workflow_task() {
        use temporalio_common::protos::temporal::api::common::v1::{
            WorkflowExecution, WorkflowType,
        };
        use temporalio_common::protos::temporal::api::taskqueue::v1::TaskQueue;
        use temporalio_common::protos::temporal::api::workflowservice::v1::{
            PollWorkflowTaskQueueRequest, RespondWorkflowTaskCompletedRequest,
            SignalWorkflowExecutionRequest, StartWorkflowExecutionRequest,
        };
        use tonic::Request;

        /// The server, stopped however the test ends.
        struct Server(std::process::Child);
        impl Drop for Server {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        // The embedded engine's command line; its keeper would be this test binary.
        let dir = tempfile::tempdir().unwrap();
        let port = crate::devserver::free_port().unwrap();
        let bin = crate::temporal_bin::resolve();
        let _server = Server(
            crate::devserver::server_command(&bin, port, None, dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let url: temporalio_client::Url = format!("http://127.0.0.1:{port}").parse().unwrap();
        let conn = ConnectionOptions::new(url)
            .connect_timeout(ATTEMPT_TIMEOUT)
            .build();
        let client = connect_until_serving(conn, "default", Mode::Embedded)
            .await
            .unwrap();
        let mut service = client.connection().workflow_service();
        let queue = TaskQueue {
            name: "held".into(),
            ..Default::default()
        };
        service
            .start_workflow_execution(Request::new(StartWorkflowExecutionRequest {
                namespace: "default".into(),
                workflow_id: "held".into(),
                workflow_type: Some(WorkflowType {
                    name: "held".into(),
                }),
                task_queue: Some(queue.clone()),
                request_id: "held-start".into(),
                ..Default::default()
            }))
            .await
            .unwrap();
        let task = service
            .poll_workflow_task_queue(Request::new(PollWorkflowTaskQueueRequest {
                namespace: "default".into(),
                task_queue: Some(queue),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(!task.task_token.is_empty(), "the task was handed out");
        // While the task is out, each signal is buffered: twice the server's default.
        for i in 0..200 {
            service
                .signal_workflow_execution(Request::new(SignalWorkflowExecutionRequest {
                    namespace: "default".into(),
                    workflow_execution: Some(WorkflowExecution {
                        workflow_id: "held".into(),
                        run_id: String::new(),
                    }),
                    signal_name: "nudge".into(),
                    request_id: format!("nudge-{i}"),
                    ..Default::default()
                }))
                .await
                .unwrap();
        }
        let completed = service
            .respond_workflow_task_completed(Request::new(RespondWorkflowTaskCompletedRequest {
                namespace: "default".into(),
                task_token: task.task_token,
                ..Default::default()
            }))
            .await;
        assert!(
            completed.is_ok(),
            "the server force-closed the task: {completed:?}"
        );
    }

    #[tokio::test]
    async fn nothing_listening_gives_up_after_the_bound_with_the_last_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url: temporalio_client::Url = format!("http://127.0.0.1:{port}").parse().unwrap();
        let conn = ConnectionOptions::new(url)
            .connect_timeout(ATTEMPT_TIMEOUT)
            .build();
        let started = Instant::now();
        let failure = connect_until_serving(conn, "default", Mode::Cluster)
            .await
            .expect_err("nothing listens there");
        let waited = started.elapsed();
        assert!(
            waited >= CONNECT_WAIT - MAX_BACKOFF && waited <= CONNECT_WAIT + ATTEMPT_TIMEOUT,
            "bounded: {waited:?}"
        );
        match failure {
            Failure::TimedOut(m) => assert!(m.to_lowercase().contains("refused"), "{m}"),
            Failure::Fatal(m) => panic!("a refused connection is worth retrying: {m}"),
        }
    }
}
