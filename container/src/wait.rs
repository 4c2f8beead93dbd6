//! Waiting for a container to end (polling the engine, heartbeating, bounded by the
//! attempt's deadline) and harvesting its logs into the attempt directory.

use std::path::Path;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::ContainerStateStatusEnum as Status;
use bollard::query_parameters::{KillContainerOptions, LogsOptions};
use casebatch_attempt::{Liveness, OnCancel, files};
use casebatch_proto::JobRef;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::engine;

const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// First poll soon (short cases end within a few), then back off to this.
const POLL_MAX: Duration = Duration::from_millis(500);

/// How a wait for a container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    Exited {
        code: i64,
        oom_killed: bool,
    },
    /// Past the deadline: killed by this wait.
    TimedOut,
    /// The liveness was cancelled; the container was killed if it said [`OnCancel::Kill`].
    Cancelled,
    /// The engine no longer knows the container.
    Gone,
    /// Created but never started (a submit that died between the two).
    NotStarted,
    /// The engine did not answer: the message says what it said.
    Unreachable(String),
}

pub async fn kill(docker: &Docker, name: &str) {
    let options = KillContainerOptions {
        signal: "KILL".into(),
    };
    // Already stopped (409) or gone (404) is what a kill wants.
    let _ = docker.kill_container(name, Some(options)).await;
}

/// Polls `name` until it ends, heartbeating `job` and killing it at `deadline`.
pub async fn wait(
    docker: &Docker,
    name: &str,
    deadline: Instant,
    job: &JobRef,
    live: &dyn Liveness,
) -> Waited {
    let mut last_beat: Option<Instant> = None;
    let mut poll = Duration::from_millis(50);
    let mut unanswered = 0;
    loop {
        if last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY) {
            live.heartbeat(job).await;
            last_beat = Some(Instant::now());
        }
        if live.is_cancelled() {
            if live.on_cancel() == OnCancel::Kill {
                kill(docker, name).await;
            }
            return Waited::Cancelled;
        }
        let state = match engine::inspect(docker, name).await {
            Ok(Some(c)) => c.state.unwrap_or_default(),
            Ok(None) => return Waited::Gone,
            // A blip of the engine is waited through, as an agent's is; a long silence ends
            // the wait and the retry of the stage re-attaches by name.
            Err(e) => {
                unanswered += 1;
                if unanswered > 30 {
                    return Waited::Unreachable(e.to_string());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        unanswered = 0;
        match state.status {
            Some(Status::EXITED | Status::DEAD) => {
                return Waited::Exited {
                    code: state.exit_code.unwrap_or(-1),
                    oom_killed: state.oom_killed.unwrap_or(false),
                };
            }
            Some(Status::CREATED) => return Waited::NotStarted,
            _ => {}
        }
        if Instant::now() >= deadline {
            kill(docker, name).await;
            return Waited::TimedOut;
        }
        tokio::time::sleep(poll).await;
        poll = (poll * 2).min(POLL_MAX);
    }
}

/// A fresh log file at `path`: what was there is unlinked first (an earlier, interrupted
/// harvest's, or a symlink the harness planted in its mounted directory, which is never
/// followed), then the file is made as a regular one only.
fn fresh_log(path: &Path) -> std::io::Result<tokio::fs::File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok(tokio::fs::File::from_std(files::open_log(path)?))
}

/// Writes the container's stdout and stderr to `stdout` and `stderr`, whole (the engine
/// keeps a container's log until it is removed, so a harvest can be repeated).
pub async fn harvest_logs(
    docker: &Docker,
    name: &str,
    stdout: &Path,
    stderr: &Path,
) -> std::io::Result<()> {
    let mut out = fresh_log(stdout)?;
    let mut err = fresh_log(stderr)?;
    let options = LogsOptions {
        stdout: true,
        stderr: true,
        ..LogsOptions::default()
    };
    let mut logs = docker.logs(name, Some(options));
    while let Some(chunk) = logs.next().await {
        match chunk.map_err(std::io::Error::other)? {
            LogOutput::StdErr { message } => err.write_all(&message).await?,
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                out.write_all(&message).await?
            }
            LogOutput::StdIn { .. } => {}
        }
    }
    out.flush().await?;
    err.flush().await
}
