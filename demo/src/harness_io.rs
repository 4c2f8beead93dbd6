//! What the demo's actors (HTTP and browser) share: the harness contract's input and result
//! files, and the fixture site over HTTP.

use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use serde::Deserialize;

use crate::DemoError;
use crate::fixture::Receipt;

/// One client per harness process. The fixture is on loopback: no proxy, a short connect
/// limit; the engine's stage timeouts bound the rest.
static CLIENT: LazyLock<Result<reqwest::Client, String>> = LazyLock::new(|| {
    // reqwest is built without a bundled crypto provider (see the workspace Cargo.toml): use
    // ring, unless something in this process installed a default already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .map_err(|e| format!("build the HTTP client: {}", error_chain(e)))
});

/// Sends one request; returns the status and the body as sent. Owns no policy: the caller
/// decides what a status means.
pub(crate) async fn request(
    method: &str,
    url: &str,
    body: &str,
) -> Result<(u16, Vec<u8>), DemoError> {
    let client = CLIENT.as_ref().map_err(|e| DemoError::Other(e.clone()))?;
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|e| DemoError::Other(format!("use HTTP method {method:?}: {e}")))?;
    let fail = |e: reqwest::Error| {
        DemoError::Other(format!("{method} {url}: {}", error_chain(e.without_url())))
    };
    let res = client
        .request(method.clone(), url)
        .body(body.to_string())
        .send()
        .await
        .map_err(fail)?;
    let status = res.status().as_u16();
    let bytes = res.bytes().await.map_err(fail)?;
    Ok((status, bytes.to_vec()))
}

/// An error and its causes, `outer: inner: ...` (reqwest's own message names only the outer).
fn error_chain(e: reqwest::Error) -> String {
    format!("{:#}", anyhow::Error::new(e))
}

/// The task fields the harness reads from `CASEBATCH_INPUT`.
#[derive(Debug, Deserialize)]
pub(crate) struct TaskInput {
    pub task_id: String,
    pub url: String,
    #[serde(default = "default_steps")]
    pub max_steps: u32,
}

fn default_steps() -> u32 {
    6
}

fn env(name: &str) -> Result<String, DemoError> {
    std::env::var(name).map_err(|_| {
        DemoError::Other(format!(
            "read {name}: run this as a casebatch harness (it sets the CASEBATCH_* variables)"
        ))
    })
}

pub(crate) fn read_input() -> Result<(TaskInput, u32, PathBuf), DemoError> {
    let path = env("CASEBATCH_INPUT")?;
    let bytes = std::fs::read(&path).map_err(DemoError::io(format!("read {path}")))?;
    let input: TaskInput = serde_json::from_slice(&bytes)
        .map_err(|e| DemoError::Other(format!("parse {path}: {e}")))?;
    let attempt = env("CASEBATCH_ATTEMPT")?
        .parse()
        .map_err(|e| DemoError::Other(format!("parse CASEBATCH_ATTEMPT: {e}")))?;
    Ok((input, attempt, PathBuf::from(env("CASEBATCH_RESULT")?)))
}

pub(crate) fn write_result(path: &PathBuf, value: serde_json::Value) -> Result<(), DemoError> {
    std::fs::write(path, serde_json::to_vec_pretty(&value).expect("serializes"))
        .map_err(DemoError::io(format!("write {}", path.display())))
}

/// This attempt's receipts, as the fixture recorded them (what an evaluator observes).
pub(crate) async fn attempt_receipts(
    task: &TaskInput,
    attempt: u32,
) -> Result<Vec<Receipt>, DemoError> {
    let base = task
        .url
        .split("/tasks/")
        .next()
        .ok_or_else(|| DemoError::Other(format!("find the fixture in {}", task.url)))?;
    let url = format!("{base}/receipts?task_id={}&attempt={attempt}", task.task_id);
    let (status, body) = request("GET", &url, "").await?;
    if status != 200 {
        return Err(DemoError::Other(format!("GET {url}: HTTP {status}")));
    }
    serde_json::from_slice(&body)
        .map_err(|e| DemoError::Other(format!("parse the receipts from {url}: {e}")))
}
