//! The agent's settings and its security rule: without a token it listens on loopback only;
//! any other address needs TLS and a bearer token. The token is read from an environment
//! variable or a file named on the command line (never the value itself), held in memory
//! only as its SHA-256, and never written anywhere.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Identity, ServerTlsConfig};

use casebatch_proto::token::TokenSource;

use crate::AgentError;
use crate::auth::BearerAuth;

/// How the agent's command line spells its token settings, for [`TokenSource`]'s messages.
pub(crate) const FLAGS: (&str, &str) = ("--token-env", "--token-file");

/// `--tls-cert` and `--tls-key`: PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Jobs not yet ended, at most.
    pub max_concurrent: u32,
    /// Sum of the declared memory of jobs not yet ended, at most (MiB).
    pub memory_budget_mb: Option<u64>,
    pub tls: Option<TlsFiles>,
    pub token: Option<TokenSource>,
    /// How long an ended job's row and attempt directory are kept (`None`: forever).
    pub keep_ended: Option<Duration>,
    /// `--sandbox container`: jobs that ask for a container sandbox run in one, on this
    /// host's container engine; without it they are refused.
    pub containers: bool,
}

impl AgentConfig {
    /// Loopback, no TLS, no token, the default envelope.
    pub fn local(listen: SocketAddr, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            listen,
            data_dir: data_dir.into(),
            max_concurrent: crate::DEFAULT_MAX_CONCURRENT,
            memory_budget_mb: None,
            tls: None,
            token: None,
            keep_ended: Some(crate::DEFAULT_KEEP_ENDED),
            containers: false,
        }
    }
}

/// What the checked configuration resolved to: the token (hashed) and the TLS identity.
pub(crate) struct Security {
    token: Option<Token>,
    tls: Option<Identity>,
}

struct Token {
    digest: [u8; 32],
    source: TokenSource,
}

impl Security {
    /// Reads the token and the TLS files and applies the listen rule. Touches nothing.
    pub(crate) fn resolve(config: &AgentConfig) -> Result<Self, AgentError> {
        if config.max_concurrent == 0 {
            return Err(AgentError::Config(
                "--max-concurrent must be at least 1".into(),
            ));
        }
        if config.memory_budget_mb == Some(0) {
            return Err(AgentError::Config(
                "--memory-budget-mb must be at least 1 (leave it out for no budget)".into(),
            ));
        }
        let loopback = config.listen.ip().is_loopback();
        if !loopback {
            let mut missing = Vec::new();
            if config.tls.is_none() {
                missing.push("TLS (--tls-cert PEM --tls-key PEM)");
            }
            if config.token.is_none() {
                missing.push("a bearer token (--token-env VAR or --token-file PATH)");
            }
            if !missing.is_empty() {
                return Err(AgentError::Config(format!(
                    "--listen {} is not a loopback address: an agent reachable from other hosts needs TLS and a bearer token; missing: {}. Or listen on 127.0.0.1 or [::1]",
                    config.listen,
                    missing.join(" and ")
                )));
            }
        }
        let token = config.token.as_ref().map(read_token).transpose()?;
        let tls = config.tls.as_ref().map(read_tls).transpose()?;
        let security = Self { token, tls };
        // Parse the certificate and key now, before anything is started.
        if let Some(tls) = security.tls_config() {
            tonic::transport::Server::builder()
                .tls_config(tls)
                .map_err(|e| {
                    AgentError::Config(format!(
                        "--tls-cert/--tls-key: not a usable PEM certificate chain and private key: {e}"
                    ))
                })?;
        }
        Ok(security)
    }

    /// The variable that holds the token, if it comes from one: never passed to a harness.
    pub(crate) fn token_env(&self) -> Option<String> {
        match self.token.as_ref().map(|t| &t.source) {
            Some(TokenSource::Env(name)) => Some(name.clone()),
            _ => None,
        }
    }

    pub(crate) fn interceptor(&self) -> BearerAuth {
        BearerAuth::new(self.token.as_ref().map(|t| t.digest))
    }

    pub(crate) fn tls_config(&self) -> Option<ServerTlsConfig> {
        // tonic's rustls picks the process's default crypto provider: ring, as everywhere in
        // casebatch (installing twice is harmless).
        let _ = rustls::crypto::ring::default_provider().install_default();
        self.tls
            .clone()
            .map(|identity| ServerTlsConfig::new().identity(identity))
    }
}

/// The shared checks (`casebatch_proto::token`): set, readable, trimmed, header-safe.
fn read_token(source: &TokenSource) -> Result<Token, AgentError> {
    let token = source
        .read(FLAGS)
        .map_err(|e| AgentError::Config(e.to_string()))?;
    Ok(Token {
        digest: crate::auth::digest(token.as_bytes()),
        source: source.clone(),
    })
}

fn read_tls(files: &TlsFiles) -> Result<Identity, AgentError> {
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| {
            AgentError::Config(format!("{flag} {}: failed to read: {e}", path.display()))
        })
    };
    let cert = read("--tls-cert", &files.cert)?;
    let key = read("--tls-key", &files.key)?;
    Ok(Identity::from_pem(cert, key))
}
