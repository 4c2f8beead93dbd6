//! The fixture web app: one page per task on loopback, with receipts for every action.
//!
//! Routes: `GET /tasks/<id>?attempt=N` (the page, slowed by `--response-delay`: a note form,
//! a button, and the attempt's receipts so far), `POST /tasks/<id>/note?attempt=N` and `POST
//! /tasks/<id>/click?attempt=N` (actions: each appends a receipt `{"type": "web_action",
//! "action", "task_id", "attempt", "ts", "user_agent"}` to `<dir>/events.jsonl` and syncs it
//! before answering; a browser's form post is sent back to the page), `GET
//! /receipts?task_id=..&attempt=..` (what the evaluator observes), `GET
//! /traces/<id>?attempt=N` (a trace source: the attempt's receipts as a trace document, for
//! the collect stage). The page of `web-no-button` has no button: a task an actor cannot
//! finish (it is served, not put in the generated manifest).

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::DemoError;

/// Served but left out of the manifest: its page shows no button.
const NO_BUTTON_TASK: (&str, &str, &str) = (
    "web-no-button",
    "Delta",
    "Leave a note on the Delta page and press its button.",
);

/// The batch id of the generated manifest.
pub const MANIFEST_BATCH_ID: &str = "local-web";

/// The three demo tasks: id, page title, what the actor is asked to do.
const TASKS: [(&str, &str, &str); 3] = [
    (
        "web-1",
        "Alpha",
        "Leave a note on the Alpha page and press its button.",
    ),
    (
        "web-2",
        "Beta",
        "Leave a note on the Beta page and press its button.",
    ),
    (
        "web-3",
        "Gamma",
        "Leave a note on the Gamma page and press its button.",
    ),
];

#[derive(Debug, Clone)]
pub struct FixtureOptions {
    pub directory: PathBuf,
    /// Delay before each page is served (simulates a slow site).
    pub response_delay: Duration,
    /// 0 picks a free port (or the one an earlier fixture in this directory used).
    pub port: u16,
    /// The `casebatch` executable the generated manifest runs as actor and evaluator.
    pub casebatch_exe: PathBuf,
    /// The browser the actor drives; `None`: the actor is a plain HTTP client.
    pub browser: Option<PathBuf>,
}

/// A running fixture.
pub struct Fixture {
    pub addr: SocketAddr,
    pub manifest: PathBuf,
    pub events: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

/// One receipt line of `events.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    #[serde(rename = "type")]
    pub kind: String,
    pub action: String,
    pub task_id: String,
    pub attempt: u32,
    pub ts: f64,
    /// The client that acted (a headless Chromium says `HeadlessChrome`); absent when it
    /// sent none, as a plain HTTP client may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct FixtureRecord {
    port: u16,
}

struct State {
    events: PathBuf,
    delay: Duration,
    /// Serializes appends so each receipt line lands whole.
    lock: Mutex<()>,
}

impl Fixture {
    /// Binds on 127.0.0.1, writes `<dir>/batch.yaml`, and serves until dropped.
    pub async fn start(opts: FixtureOptions) -> Result<Self, DemoError> {
        let dir = &opts.directory;
        std::fs::create_dir_all(dir).map_err(DemoError::io(format!("create {}", dir.display())))?;
        let record_path = dir.join("fixture.json");
        // Reuse the port of an earlier fixture in this directory, so its batch.yaml (and the
        // batch planned from it) stays the same across fixture restarts.
        let earlier: Option<FixtureRecord> = std::fs::read(&record_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let port = match (opts.port, earlier) {
            (0, Some(r)) => r.port,
            (p, _) => p,
        };
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(DemoError::io(format!("listen on 127.0.0.1:{port}")))?;
        let addr = listener
            .local_addr()
            .map_err(DemoError::io("read the listening address"))?;
        let record = serde_json::to_vec(&FixtureRecord { port: addr.port() }).expect("serializes");
        std::fs::write(&record_path, record)
            .map_err(DemoError::io(format!("write {}", record_path.display())))?;
        let manifest = dir.join("batch.yaml");
        std::fs::write(
            &manifest,
            manifest_yaml(addr, &opts.casebatch_exe, opts.browser.as_deref()),
        )
        .map_err(DemoError::io(format!("write {}", manifest.display())))?;
        let events = dir.join("events.jsonl");
        let state = Arc::new(State {
            events: events.clone(),
            delay: opts.response_delay,
            lock: Mutex::new(()),
        });
        let task = tokio::spawn(accept_loop(listener, state));
        Ok(Self {
            addr,
            manifest,
            events,
            task,
        })
    }

    /// Receipts written so far.
    pub fn receipts(&self) -> Vec<Receipt> {
        read_receipts(&self.events)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads every receipt of an `events.jsonl` (missing file: none).
pub fn read_receipts(path: &Path) -> Vec<Receipt> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn manifest_yaml(addr: SocketAddr, exe: &Path, browser: Option<&Path>) -> String {
    let quoted = |p: &Path| format!("\"{}\"", p.display().to_string().replace('"', "\\\""));
    let exe = quoted(exe);
    let actor = match browser {
        Some(b) => format!(
            "[{exe}, \"harness\", \"web-demo\", \"--browser\", {}]",
            quoted(b)
        ),
        None => format!("[{exe}, \"harness\", \"web-demo\"]"),
    };
    let mut y = format!(
        "# Generated by `casebatch demo serve`: three real web tasks on the local fixture.\n\
         batch_id: {MANIFEST_BATCH_ID}\n\
         defaults:\n  concurrency: 2\n  max_retries: 1\n  timeout_seconds: 120\n  runtime: local-process\n\
         \x20 harness: {actor}\n\
         \x20 evaluator: [{exe}, \"harness\", \"web-demo-eval\"]\n\
         tasks:\n"
    );
    for (id, _title, query) in TASKS {
        y.push_str(&format!(
            "  - task_id: {id}\n    agent_kind: web\n    query: \"{query}\"\n    url: \"http://{addr}/tasks/{id}\"\n    max_steps: 6\n"
        ));
    }
    y
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, state.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(status: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

fn query_param(req: &Request<Incoming>, key: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let task = |id: &str| {
        TASKS
            .iter()
            .chain([&NO_BUTTON_TASK])
            .find(|t| t.0 == id)
            .copied()
    };
    let attempt = query_param(&req, "attempt").and_then(|a| a.parse::<u32>().ok());
    let res = match (req.method(), parts.as_slice()) {
        (&Method::GET, ["health"]) => reply(StatusCode::OK, "text/plain", "ok".into()),
        (&Method::GET, ["tasks", id]) => match task(id) {
            Some((id, title, query)) => {
                tokio::time::sleep(state.delay).await;
                let receipts = match attempt {
                    Some(a) => read_receipts(&state.events)
                        .into_iter()
                        .filter(|r| r.task_id == id && r.attempt == a)
                        .collect(),
                    None => Vec::new(),
                };
                let button = id != NO_BUTTON_TASK.0;
                let html = page(id, title, query, attempt, button, &receipts);
                reply(StatusCode::OK, "text/html; charset=utf-8", html)
            }
            None => reply(StatusCode::NOT_FOUND, "text/plain", format!("no task {id}")),
        },
        (&Method::POST, ["tasks", id, action @ ("note" | "click")]) => {
            let user_agent = header(&req, hyper::header::USER_AGENT);
            // A browser's form post goes back to the page, which now shows the receipt.
            let from_form =
                header(&req, hyper::header::ACCEPT).is_some_and(|a| a.contains("text/html"));
            match (task(id), attempt) {
                (Some(_), Some(attempt)) => {
                    match append_receipt(&state, id, action, attempt, user_agent) {
                        Ok(()) if from_form => Response::builder()
                            .status(StatusCode::SEE_OTHER)
                            .header("location", format!("/tasks/{id}?attempt={attempt}"))
                            .body(Full::new(Bytes::new()))
                            .expect("static response parts are valid"),
                        Ok(()) => {
                            reply(StatusCode::OK, "application/json", "{\"ok\": true}".into())
                        }
                        Err(e) => reply(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "text/plain",
                            e.to_string(),
                        ),
                    }
                }
                _ => reply(
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    "need a known task and ?attempt=N".into(),
                ),
            }
        }
        (&Method::GET, ["traces", id]) => {
            let spans: Vec<Receipt> = read_receipts(&state.events)
                .into_iter()
                .filter(|r| r.task_id == *id && attempt.is_none_or(|a| a == r.attempt))
                .collect();
            let trace = serde_json::json!({"task_id": id, "attempt": attempt, "spans": spans});
            reply(StatusCode::OK, "application/json", trace.to_string())
        }
        (&Method::GET, ["receipts"]) => {
            let task_id = query_param(&req, "task_id");
            let found: Vec<Receipt> = read_receipts(&state.events)
                .into_iter()
                .filter(|r| Some(&r.task_id) == task_id.as_ref())
                .filter(|r| attempt.is_none_or(|a| a == r.attempt))
                .collect();
            reply(
                StatusCode::OK,
                "application/json",
                serde_json::to_string(&found).expect("serializes"),
            )
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    };
    Ok(res)
}

fn header(req: &Request<Incoming>, name: hyper::header::HeaderName) -> Option<String> {
    Some(req.headers().get(name)?.to_str().ok()?.to_string())
}

/// The task's page for one attempt: its forms post back with the attempt, and it lists the
/// attempt's receipts so far (what the browser evaluator looks for).
fn page(
    id: &str,
    title: &str,
    query: &str,
    attempt: Option<u32>,
    button: bool,
    receipts: &[Receipt],
) -> String {
    let suffix = attempt.map(|a| format!("?attempt={a}")).unwrap_or_default();
    let go = if button {
        format!(
            "<form method=\"post\" action=\"/tasks/{id}/click{suffix}\"><button id=\"go\">Go</button></form>"
        )
    } else {
        String::new()
    };
    let items: String = receipts
        .iter()
        .map(|r| {
            format!(
                "<li class=\"receipt\" data-action=\"{}\" data-attempt=\"{}\">{} by attempt {}</li>",
                r.action, r.attempt, r.action, r.attempt
            )
        })
        .collect();
    format!(
        "<!doctype html><html><head><title>{title}</title></head><body>\
         <h1>{title}</h1><p id=\"task\">{query}</p>\
         <form method=\"post\" action=\"/tasks/{id}/note{suffix}\"><textarea name=\"note\"></textarea>\
         <button id=\"save\">Save note</button></form>{go}\
         <ul id=\"receipts\">{items}</ul></body></html>"
    )
}

fn append_receipt(
    state: &State,
    task_id: &str,
    action: &str,
    attempt: u32,
    user_agent: Option<String>,
) -> std::io::Result<()> {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let receipt = Receipt {
        kind: "web_action".into(),
        action: action.into(),
        task_id: task_id.into(),
        attempt,
        ts,
        user_agent,
    };
    let mut line = serde_json::to_vec(&receipt).expect("serializes");
    line.push(b'\n');
    let _guard = state.lock.lock().unwrap_or_else(|p| p.into_inner());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&state.events)?;
    f.write_all(&line)?;
    // Durable before the actor is told it happened: receipts are counted after crashes.
    f.sync_data()
}
