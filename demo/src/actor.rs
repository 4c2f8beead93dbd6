//! The web actor and its evaluator, as harness commands (docs/harness.md: the harness contract).

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

/// The actor: opens its page, writes a note, clicks, within `max_steps` steps.
pub async fn run_actor() -> Result<(), DemoError> {
    let (task, attempt, result) = read_input()?;
    let steps = [
        ("GET", task.url.clone()),
        ("POST", format!("{}/note?attempt={attempt}", task.url)),
        ("POST", format!("{}/click?attempt={attempt}", task.url)),
    ];
    if steps.len() as u32 > task.max_steps {
        return Err(DemoError::Other(format!(
            "finish {}: it needs {} steps and max_steps is {}",
            task.task_id,
            steps.len(),
            task.max_steps
        )));
    }
    let mut title = String::new();
    for (i, (method, url)) in steps.iter().enumerate() {
        let body = if i == 1 {
            "note=done by casebatch web-demo"
        } else {
            ""
        };
        let (status, bytes) = request(method, url, body).await?;
        let text = String::from_utf8_lossy(&bytes);
        if status != 200 {
            return Err(DemoError::Other(format!(
                "{method} {url}: HTTP {status}: {text}"
            )));
        }
        if i == 0 {
            title = text
                .split("<title>")
                .nth(1)
                .and_then(|t| t.split("</title>").next())
                .unwrap_or_default()
                .to_string();
        }
        println!("step {}: {method} {url} -> {status}", i + 1);
    }
    write_result(
        &result,
        serde_json::json!({"outputs": {"page_title": title, "steps": steps.len()}}),
    )
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

/// The evaluator: asks the fixture for this attempt's receipts; passes only if the click
/// (and the note) of *this* attempt happened. An attempt whose actor drove a browser is
/// judged in that browser ([`crate::browser_actor::run_evaluator`]).
pub async fn run_evaluator() -> Result<(), DemoError> {
    if crate::browser_actor::endpoint_here() {
        return crate::browser_actor::run_evaluator().await;
    }
    let (task, attempt, result) = read_input()?;
    let receipts = attempt_receipts(&task, attempt).await?;
    let clicked = receipts.iter().any(|r| r.action == "click");
    let noted = receipts.iter().any(|r| r.action == "note");
    let verdict = if clicked && noted { "pass" } else { "fail" };
    println!(
        "attempt {attempt} of {}: note={noted} click={clicked} -> {verdict}",
        task.task_id
    );
    write_result(
        &result,
        serde_json::json!({"verdict": verdict, "scores": {"receipts": receipts.len()}}),
    )
}
