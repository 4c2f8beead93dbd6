//! Which Temporal the CLI talks to, and the connected client.
//!
//! With no address configured anywhere, the engine is the embedded dev server of the output
//! root. An address from `--address` or Temporal's own settings (`TEMPORAL_ADDRESS`, a
//! `temporal.toml` profile) selects cluster mode, with namespace, TLS and API key from the
//! same settings. Secrets are read from there each time and never written to disk.

use std::path::{Path, PathBuf};

use temporalio_client::envconfig::LoadClientConfigProfileOptions;
use temporalio_client::{
    Client, ClientOptions, Connection, ConnectionOptions, WorkflowCountOptions,
};

use crate::devserver::{DevServer, DevServerError};

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
}

/// Where the engine is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineTarget {
    /// The dev server under this output root.
    Embedded { output_root: PathBuf },
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
            }
        }
    }
}

/// A connected client, plus the dev server when embedded (kept alive by holding this).
pub struct Engine {
    pub client: Client,
    pub address: String,
    pub namespace: String,
    pub embedded: Option<DevServer>,
}

impl Engine {
    /// Connects, starting the embedded dev server when needed.
    pub async fn connect(target: &EngineTarget) -> Result<Self, EngineError> {
        match target {
            EngineTarget::Embedded { output_root } => {
                let server = DevServer::ensure(output_root)?;
                let url: temporalio_client::Url = server
                    .address
                    .parse()
                    .map_err(|e| EngineError::Config(format!("{e}")))?;
                let conn = ConnectionOptions::new(url).build();
                let client = dial(conn, "default").await?;
                wait_until_serving(&client, &server.address).await?;
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
                let client = dial(conn, &ns).await?;
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

/// A dev server accepts connections a moment before its namespace is ready; the first real
/// call must not be mistaken for "no such batch" or an unreachable engine.
async fn wait_until_serving(client: &Client, address: &str) -> Result<(), EngineError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match client
            .count_workflows("", WorkflowCountOptions::default())
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => {
                return Err(EngineError::Connect {
                    address: address.to_string(),
                    message: format!("the dev server never became ready: {e}"),
                });
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}

async fn dial(conn: ConnectionOptions, namespace: &str) -> Result<Client, EngineError> {
    let address = conn.target.to_string();
    let connection = Connection::connect(conn)
        .await
        .map_err(|e| EngineError::Connect {
            address: address.clone(),
            message: e.to_string(),
        })?;
    Client::new(connection, ClientOptions::new(namespace).build()).map_err(|e| {
        EngineError::Connect {
            address,
            message: e.to_string(),
        }
    })
}
