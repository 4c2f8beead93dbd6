//! Where an agent is and how to talk to it: a runtimes-table entry checked into an
//! [`AgentTarget`] (endpoint, token source, TLS CA), the channels cached per endpoint, and the
//! bearer token put on each call.
//!
//! Plaintext only on loopback, as for Temporal: a token sent over plaintext off the host could
//! be read on the way. The token is read on the worker for every call (so a rotated Secret is
//! picked up without a restart), put straight into the call's metadata, and never logged,
//! written or echoed in a message.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use casebatch_manifest::model::{RuntimeKind, RuntimeSpec};
use casebatch_proto::runtime_v1::runtime_client::RuntimeClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri};

use super::error::AgentError;
use casebatch_proto::token::TokenSource;

/// How long opening a connection may take before the agent counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on idle and streaming connections: a dead agent host (no RST) is noticed
/// within about this long instead of a Watch hanging forever.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// How a runtimes-table entry spells its token settings, for [`TokenSource`]'s messages.
pub const TABLE_KEYS: (&str, &str) = ("token_env", "token_file");

/// A runtimes-table entry of kind `agent`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTarget {
    /// The entry's name in the runtimes table.
    pub name: String,
    pub endpoint: String,
    /// Where the worker reads the bearer token; `None`: calls carry none.
    pub token: Option<TokenSource>,
    pub tls_ca: Option<PathBuf>,
    /// The entry's `unreachable_grace_s`: replaces every outage grace of the client.
    pub unreachable_grace: Option<std::time::Duration>,
}

impl AgentTarget {
    /// The entry that case `case` names (`PlannedCase::runtime_name`, resolved into
    /// `AttemptEnv::runtime_spec`).
    pub fn of(
        case: &str,
        name: Option<&str>,
        spec: Option<&RuntimeSpec>,
    ) -> Result<Self, AgentError> {
        let name = name.ok_or_else(|| {
            AgentError::Config(format!(
                "case {case} runs on an agent but names no runtime: set `runtime: <name>` to \
                 an entry of the runtimes table"
            ))
        })?;
        let spec = spec.ok_or_else(|| {
            AgentError::Config(format!(
                "case {case} names runtime `{name}`, which the batch's runtimes table does not \
                 have"
            ))
        })?;
        Self::from_spec(name, spec)
    }

    /// Checks an entry: kind `agent`, an `https://` endpoint or an `http://` one on loopback,
    /// at most one token source.
    pub fn from_spec(name: &str, spec: &RuntimeSpec) -> Result<Self, AgentError> {
        let field = |f: &str| format!("runtimes.{name}.{f}");
        let config = AgentError::Config;
        if spec.kind != RuntimeKind::Agent {
            return Err(config(format!(
                "runtime `{name}` is of kind {}, not agent",
                spec.kind.as_str()
            )));
        }
        let endpoint = spec.endpoint.as_deref().map(str::trim).unwrap_or_default();
        if endpoint.is_empty() {
            return Err(config(format!(
                "{} is not set: an agent runtime needs https://HOST:PORT (or http://HOST:PORT \
                 on loopback)",
                field("endpoint")
            )));
        }
        let uri: Uri = endpoint.parse().map_err(|e| {
            config(format!(
                "{} {endpoint:?} is not a URL ({e}): write https://HOST:PORT",
                field("endpoint")
            ))
        })?;
        let host = uri.host().unwrap_or_default();
        if host.is_empty() {
            return Err(config(format!(
                "{} {endpoint:?} names no host: write https://HOST:PORT",
                field("endpoint")
            )));
        }
        match uri.scheme_str() {
            Some("https") => {}
            Some("http") if is_loopback(host) => {}
            Some("http") => {
                return Err(config(format!(
                    "{} {endpoint:?} is plaintext http to a host that is not loopback: \
                     plaintext is allowed on loopback only, so the token and the jobs cannot \
                     be read on the way; use https:// (and tls_ca if the agent's certificate \
                     is not signed by a system root)",
                    field("endpoint")
                )));
            }
            _ => {
                return Err(config(format!(
                    "{} {endpoint:?} must start with https:// (or http:// on loopback)",
                    field("endpoint")
                )));
            }
        }
        let token = match (&spec.token_env, &spec.token_file) {
            (Some(_), Some(_)) => {
                return Err(config(format!(
                    "runtime `{name}` sets both token_env and token_file: keep one"
                )));
            }
            (Some(var), None) => Some(TokenSource::Env(var.clone())),
            (None, Some(file)) => Some(TokenSource::File(file.into())),
            (None, None) => None,
        };
        Ok(Self {
            name: name.to_string(),
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            tls_ca: spec.tls_ca.as_ref().map(PathBuf::from),
            unreachable_grace: spec.unreachable_grace_s.map(std::time::Duration::from_secs),
        })
    }

    /// How long to keep retrying this agent while it is unreachable: its entry's
    /// `unreachable_grace_s`, else the client's `default` for the call.
    pub fn grace_or(&self, default: std::time::Duration) -> std::time::Duration {
        self.unreachable_grace.unwrap_or(default)
    }

    /// `runtime `NAME` at ENDPOINT`, the way every message names the agent.
    pub fn named(&self) -> String {
        format!("runtime `{}` at {}", self.name, self.endpoint)
    }

    fn is_https(&self) -> bool {
        self.endpoint.starts_with("https://")
    }

    /// A request carrying the bearer token (read now), with `timeout` as its deadline.
    pub fn request<T>(
        &self,
        message: T,
        timeout: Option<Duration>,
    ) -> Result<tonic::Request<T>, AgentError> {
        let mut request = tonic::Request::new(message);
        if let Some(t) = timeout {
            request.set_timeout(t);
        }
        if let Some(source) = &self.token {
            let token = source
                .read(TABLE_KEYS)
                .map_err(|e| AgentError::Auth(format!("runtime `{}`: {e}", self.name)))?;
            // Printable ASCII (checked by `read`) is always a valid header value.
            let value = MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
                AgentError::Auth(format!(
                    "runtime `{}`: the token in {} is not a valid header value",
                    self.name,
                    source.describe()
                ))
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// `localhost` or a loopback address (`127.0.0.0/8`, `::1`).
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// One channel per agent, opened lazily and reused by every call to it: a channel multiplexes
/// calls over one HTTP/2 connection and reconnects by itself after the agent restarts.
#[derive(Default)]
pub struct Channels(Mutex<HashMap<(String, Option<PathBuf>), Channel>>);

impl Channels {
    pub fn client(&self, target: &AgentTarget) -> Result<RuntimeClient<Channel>, AgentError> {
        let key = (target.endpoint.clone(), target.tls_ca.clone());
        if let Some(ch) = self.0.lock().expect("lock").get(&key) {
            return Ok(RuntimeClient::new(ch.clone()));
        }
        let channel = open(target)?;
        // A racing caller may have opened one too: keep the first, so all share it.
        let channel = self
            .0
            .lock()
            .expect("lock")
            .entry(key)
            .or_insert(channel)
            .clone();
        Ok(RuntimeClient::new(channel))
    }
}

fn open(target: &AgentTarget) -> Result<Channel, AgentError> {
    let bad = |what: String| AgentError::Config(format!("{}: {what}", target.named()));
    let mut endpoint = Endpoint::from_shared(target.endpoint.clone())
        .map_err(|e| bad(format!("not a usable endpoint: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true);
    if target.is_https() {
        let tls = match &target.tls_ca {
            // A private CA replaces the system roots: only it may vouch for the agent.
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| bad(format!("cannot read its tls_ca {}: {e}", path.display())))?;
                if !pem
                    .windows(b"-----BEGIN CERTIFICATE-----".len())
                    .any(|w| w == b"-----BEGIN CERTIFICATE-----")
                {
                    return Err(bad(format!(
                        "its tls_ca {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        path.display()
                    )));
                }
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
            }
            None => ClientTlsConfig::new().with_enabled_roots(),
        };
        endpoint = endpoint
            .tls_config(tls.timeout(CONNECT_TIMEOUT))
            .map_err(|e| bad(format!("TLS setup failed: {e}")))?;
    }
    Ok(endpoint.connect_lazy())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(endpoint: &str) -> RuntimeSpec {
        RuntimeSpec {
            kind: RuntimeKind::Agent,
            endpoint: Some(endpoint.into()),
            token_env: None,
            token_file: None,
            tls_ca: None,
            max_concurrent: None,
            memory_budget_mb: None,
            breaker_failures: None,
            breaker_cooldown_s: None,
            unreachable_grace_s: None,
            queue_limit: None,
            partition: None,
            account: None,
            qos: None,
            constraint: None,
            extra_args: Vec::new(),
        }
    }

    fn config_message(r: Result<AgentTarget, AgentError>) -> String {
        match r {
            Err(AgentError::Config(m)) => m,
            other => panic!("expected a config refusal, got {other:?}"),
        }
    }

    #[test]
    fn plaintext_is_refused_off_loopback_and_allowed_on_it() {
        for ok in [
            "http://127.0.0.1:7070",
            "http://127.3.2.1:7070",
            "http://localhost:7070",
            "http://[::1]:7070",
            "https://agent.example:7070",
        ] {
            let t = AgentTarget::from_spec("a", &spec(ok)).unwrap();
            assert_eq!(t.endpoint, ok);
        }
        for refused in [
            "http://10.0.0.5:7070",
            "http://agent.example:7070",
            "http://[::2]:1",
        ] {
            let m = config_message(AgentTarget::from_spec("gpu", &spec(refused)));
            assert!(m.contains("runtimes.gpu.endpoint"), "{m}");
            assert!(m.contains("loopback only"), "{m}");
            assert!(m.contains(refused), "{m}");
        }
    }

    #[test]
    fn a_bad_entry_names_its_field() {
        let m = config_message(AgentTarget::from_spec("a", &spec("ftp://h:1")));
        assert!(
            m.contains("runtimes.a.endpoint") && m.contains("https://"),
            "{m}"
        );
        let m = config_message(AgentTarget::from_spec("a", &spec("")));
        assert!(m.contains("runtimes.a.endpoint is not set"), "{m}");
        let mut both = spec("http://127.0.0.1:1");
        both.token_env = Some("X".into());
        both.token_file = Some("/f".into());
        let m = config_message(AgentTarget::from_spec("a", &both));
        assert!(m.contains("both token_env and token_file"), "{m}");
        let mut local = spec("http://127.0.0.1:1");
        local.kind = RuntimeKind::LocalProcess;
        let m = config_message(AgentTarget::from_spec("a", &local));
        assert!(m.contains("not agent"), "{m}");
    }

    #[test]
    fn a_token_is_read_from_its_file_trimmed_and_put_on_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret-value\n").unwrap();
        let mut s = spec("http://127.0.0.1:1");
        s.token_file = Some(file.display().to_string());
        let t = AgentTarget::from_spec("a", &s).unwrap();
        assert_eq!(t.token, Some(TokenSource::File(file)));
        let req = t.request((), None).unwrap();
        assert_eq!(
            req.metadata().get("authorization").unwrap(),
            "Bearer s3cret-value"
        );
        let none = AgentTarget::from_spec("a", &spec("http://127.0.0.1:1")).unwrap();
        assert!(none.request((), None).unwrap().metadata().is_empty());
    }

    /// The shared checks (`casebatch_proto::token`), worded for the runtimes table and the runtime.
    #[test]
    fn token_errors_name_the_runtime_and_the_entry_key_never_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let refused =
            |s: &RuntimeSpec| match AgentTarget::from_spec("gpu", s).unwrap().request((), None) {
                Err(AgentError::Auth(m)) => m,
                other => panic!("expected an auth refusal, got {other:?}"),
            };
        let mut s = spec("http://127.0.0.1:1");
        s.token_env = Some("CASEBATCH_TEST_TOKEN_NEVER_SET_4711".into());
        let m = refused(&s);
        assert!(m.contains("runtime `gpu`"), "{m}");
        assert!(
            m.contains("token_env CASEBATCH_TEST_TOKEN_NEVER_SET_4711") && m.contains("not set"),
            "{m}"
        );

        let bad = dir.path().join("bad");
        std::fs::write(&bad, "line1\nline2-secret").unwrap();
        let mut s = spec("http://127.0.0.1:1");
        s.token_file = Some(bad.display().to_string());
        let m = refused(&s);
        assert!(
            m.contains("token_file") && m.contains("printable ASCII"),
            "{m}"
        );
        assert!(!m.contains("secret"), "the token leaked into {m}");
    }

    #[tokio::test]
    async fn channels_are_reused_and_a_bad_ca_is_config() {
        let channels = Channels::default();
        let t = AgentTarget::from_spec("a", &spec("http://127.0.0.1:1")).unwrap();
        channels.client(&t).unwrap();
        channels.client(&t).unwrap();
        assert_eq!(channels.0.lock().unwrap().len(), 1);

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        let mut s = spec("https://agent.example:7070");
        s.tls_ca = Some(ca.display().to_string());
        let t = AgentTarget::from_spec("a", &s).unwrap();
        match channels.client(&t) {
            Err(AgentError::Config(m)) => assert!(m.contains("no PEM certificate"), "{m}"),
            other => panic!("expected a config refusal, got {:?}", other.err()),
        }
    }
}
