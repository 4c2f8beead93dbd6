//! The web actor and its evaluator, as harness commands (docs/harness.md: the harness contract).

use crate::DemoError;
use crate::harness_io::{attempt_receipts, read_input, request, write_result};

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
