//! The browser actor and its evaluator: each attempt drives its own headless Chromium.
//!
//! The actor starts the attempt's browser (its own profile under the attempt's working
//! directory), leaves it running when it exits, and names it in `browser.json` there. The
//! evaluator, a later process of the same attempt, connects to that same browser and looks,
//! in the page, for its own attempt's receipt. The browser and every process it spawned
//! (zygote, renderers, GPU and utility processes, crashpad) belong to the attempt: its
//! cleanup kills them and confirms none is left. Nothing here kills the browser.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use chromiumoxide::cdp::browser_protocol::target::GetTargetsParams;
use chromiumoxide::{Browser, Page};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::DemoError;
use crate::harness_io::{attempt_receipts, read_input, write_result};

/// In the attempt's working directory: how to reach its browser.
pub const ENDPOINT_FILE: &str = "browser.json";
/// In the attempt's working directory: the browser's profile.
pub const PROFILE_DIR: &str = "chromium-profile";
/// The browser's own output, beside its profile.
const BROWSER_LOG: &str = "browser.log";
/// What the actor types into the page's note.
const NOTE: &str = "done by casebatch web-demo (browser)";
/// How long the browser may take to serve DevTools, and a page to show what is awaited.
const START_WAIT: Duration = Duration::from_secs(30);
const PAGE_WAIT: Duration = Duration::from_secs(15);

#[derive(Debug, Serialize, Deserialize)]
struct Endpoint {
    /// The DevTools WebSocket of the browser.
    ws: String,
    pid: u32,
}

/// Whether this attempt's actor drove a browser (its evaluator then judges in it).
pub fn endpoint_here() -> bool {
    Path::new(ENDPOINT_FILE).exists()
}

fn other(what: impl std::fmt::Display) -> impl FnOnce(chromiumoxide::error::CdpError) -> DemoError {
    let what = what.to_string();
    move |e| DemoError::Other(format!("{what}: {e}"))
}

/// Starts the attempt's browser with a fresh profile and waits until it serves DevTools on
/// loopback (the port it picked is in its profile's `DevToolsActivePort`). The browser is not
/// a child this process waits for: it outlives the actor.
async fn launch(browser: &Path, workdir: &Path) -> Result<Endpoint, DemoError> {
    let profile = workdir.join(PROFILE_DIR);
    std::fs::create_dir_all(&profile)
        .map_err(DemoError::io(format!("create {}", profile.display())))?;
    let port_file = profile.join("DevToolsActivePort");
    let _ = std::fs::remove_file(&port_file);
    let log_path = workdir.join(BROWSER_LOG);
    let log = std::fs::File::create(&log_path)
        .map_err(DemoError::io(format!("create {}", log_path.display())))?;
    let log2 = log
        .try_clone()
        .map_err(DemoError::io(format!("open {}", log_path.display())))?;
    let mut child = std::process::Command::new(browser)
        .args(crate::browser::headless_args(&profile))
        .args([
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--disable-dev-shm-usage",
            "about:blank",
        ])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(DemoError::io(format!("start {}", browser.display())))?;
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                return Ok(Endpoint {
                    ws: format!("ws://127.0.0.1:{port}{path}"),
                    pid: child.id(),
                });
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(DemoError::Other(format!(
                "start the browser: {} exited ({status}) before serving DevTools; see {}",
                browser.display(),
                log_path.display()
            )));
        }
        if started.elapsed() > START_WAIT {
            return Err(DemoError::Other(format!(
                "start the browser: no DevTools port within {}s; see {}",
                START_WAIT.as_secs(),
                log_path.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Connects to a browser and keeps its protocol handler running while the result is used.
async fn connect(ws: &str) -> Result<(Browser, tokio::task::JoinHandle<()>), DemoError> {
    let (browser, mut handler) = Browser::connect(ws)
        .await
        .map_err(other(format!("connect to the browser at {ws}")))?;
    let pump = tokio::spawn(async move {
        while let Some(event) = handler.next().await {
            if event.is_err() {
                break;
            }
        }
    });
    Ok((browser, pump))
}

/// Waits until `condition` (a JavaScript expression) holds in the page. Errors while the page
/// navigates count as "not yet".
async fn wait_for(page: &Page, condition: &str, what: &str) -> Result<(), DemoError> {
    let started = Instant::now();
    loop {
        let holds = page
            .evaluate(condition)
            .await
            .ok()
            .and_then(|r| r.into_value::<bool>().ok())
            .unwrap_or(false);
        if holds {
            return Ok(());
        }
        if started.elapsed() > PAGE_WAIT {
            return Err(DemoError::Other(format!(
                "see {what} within {}s",
                PAGE_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The page's receipt of `action` by `attempt` is shown.
fn receipt_shown(action: &str, attempt: u32) -> String {
    format!(
        "document.querySelector('li.receipt[data-action=\"{action}\"][data-attempt=\"{attempt}\"]') !== null"
    )
}

/// The actor: opens its task's page in the attempt's browser, writes the note, saves it, and
/// presses the button. A page without the button is the agent's failure to find it, not a
/// crash: the actor reports it and its evaluator fails the attempt.
pub async fn run_actor(browser: PathBuf) -> Result<(), DemoError> {
    let (task, attempt, result) = read_input()?;
    let workdir = std::env::current_dir().map_err(DemoError::io("find the working directory"))?;
    let endpoint = launch(&browser, &workdir).await?;
    let endpoint_json = serde_json::to_vec(&endpoint).expect("serializes");
    std::fs::write(workdir.join(ENDPOINT_FILE), endpoint_json)
        .map_err(DemoError::io(format!("write {ENDPOINT_FILE}")))?;
    println!("browser {} (pid {})", endpoint.ws, endpoint.pid);

    let (b, pump) = connect(&endpoint.ws).await?;
    let url = format!("{}?attempt={attempt}", task.url);
    let page = b
        .new_page(url.as_str())
        .await
        .map_err(other(format!("open {url}")))?;
    let title = page.get_title().await.ok().flatten().unwrap_or_default();
    println!("step 1: opened {url} ({title})");

    page.find_element("textarea[name=note]")
        .await
        .map_err(other("find the note field"))?
        .click()
        .await
        .map_err(other("focus the note field"))?
        .type_str(NOTE)
        .await
        .map_err(other("type the note"))?;
    page.find_element("#save")
        .await
        .map_err(other("find the note's save button"))?
        .click()
        .await
        .map_err(other("save the note"))?;
    wait_for(&page, &receipt_shown("note", attempt), "the note's receipt").await?;
    println!("step 2: wrote and saved the note");

    let clicked = match page.find_element("#go").await {
        Ok(go) => {
            go.click().await.map_err(other("press the button"))?;
            wait_for(
                &page,
                &receipt_shown("click", attempt),
                "the click's receipt",
            )
            .await?;
            println!("step 3: pressed the button");
            true
        }
        Err(_) => {
            println!("step 3: the page shows no button to press");
            false
        }
    };
    let user_agent = b.user_agent().await.unwrap_or_default();
    pump.abort();
    write_result(
        &result,
        serde_json::json!({"outputs": {
            "page_title": title,
            "actor": "browser",
            "clicked": clicked,
            "user_agent": user_agent,
        }}),
    )
}

/// The evaluator: connects to the attempt's own browser, finds the actor's page still open
/// there, opens the task's page for this attempt in a new tab of that same browser, and
/// passes only if the page shows this attempt's click receipt and the fixture recorded that
/// click from a headless Chromium (not from a plain HTTP client).
pub async fn run_evaluator() -> Result<(), DemoError> {
    let (task, attempt, result) = read_input()?;
    let endpoint: Endpoint = serde_json::from_slice(
        &std::fs::read(ENDPOINT_FILE).map_err(DemoError::io(format!("read {ENDPOINT_FILE}")))?,
    )
    .map_err(|e| DemoError::Other(format!("parse {ENDPOINT_FILE}: {e}")))?;
    let (b, pump) = connect(&endpoint.ws).await?;
    let url = format!("{}?attempt={attempt}", task.url);
    let look = async {
        // The actor's tab, as the browser lists it (read without attaching to it).
        let targets = b
            .execute(GetTargetsParams::default())
            .await
            .map_err(other("list the browser's pages"))?
            .result
            .target_infos;
        let actor_tab = targets
            .iter()
            .any(|t| t.r#type == "page" && t.url.starts_with(&url));
        let page = b
            .new_page(url.as_str())
            .await
            .map_err(other(format!("open {url}")))?;
        let shown = wait_for(
            &page,
            &receipt_shown("click", attempt),
            "the click's receipt",
        )
        .await
        .is_ok();
        Ok::<_, DemoError>((actor_tab, shown))
    };
    // Bounded: a browser that stops answering fails the check, not the evaluator's stage.
    let (actor_tab, shown) = match tokio::time::timeout(2 * PAGE_WAIT, look).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(e)) => {
            println!("looking in the browser failed: {e}");
            (false, false)
        }
        Err(_) => {
            println!(
                "the browser did not answer within {}s",
                2 * PAGE_WAIT.as_secs()
            );
            (false, false)
        }
    };
    pump.abort();

    let receipts = attempt_receipts(&task, attempt).await?;
    let by_browser = receipts.iter().any(|r| {
        r.action == "click"
            && r.user_agent
                .as_deref()
                .is_some_and(|ua| ua.contains("HeadlessChrome"))
    });
    let verdict = if actor_tab && shown && by_browser {
        "pass"
    } else {
        "fail"
    };
    println!(
        "attempt {attempt} of {}: actor's tab open={actor_tab} receipt shown in its browser={shown} \
         clicked by a headless browser={by_browser} -> {verdict}",
        task.task_id
    );
    write_result(
        &result,
        serde_json::json!({"verdict": verdict, "scores": {"receipts": receipts.len()}}),
    )
}
