//! Slurm's own commands, run as child processes: `sbatch --parsable`, `squeue --json`,
//! `scancel`. They find the cluster as any user's would (`SLURM_CONF`, or the host's
//! configuration); a call that does not answer within [`CALL_TIMEOUT`] is given up.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// How long one call may take: the controller answers in milliseconds unless it is busy or
/// gone, and a stage must not hang on it.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What a command said.
#[derive(Debug)]
pub(crate) struct Said {
    pub(crate) ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Said {
    /// Its first line of complaint, for a message.
    pub(crate) fn complaint(&self) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Why a command gave no answer to use.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// It could not be started (not installed, not on `PATH`).
    NotRun(String),
    /// It did not finish in time: what it did is unknown.
    TimedOut,
}

/// Runs `program` with `args`, its environment `env` (the worker's when `None`) and `stdin`
/// written to it.
pub(crate) async fn run(
    program: &str,
    args: &[String],
    env: Option<&BTreeMap<OsString, OsString>>,
    stdin: Option<&str>,
) -> Result<Said, Unanswered> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(env) = env {
        cmd.env_clear().envs(env);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Unanswered::NotRun(format!("cannot run {program}: {e}")))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A command that exits before reading all of it says why on stderr.
        let _ = pipe.write_all(text.as_bytes()).await;
    }
    match tokio::time::timeout(CALL_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) => Ok(Said {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }),
        Ok(Err(e)) => Err(Unanswered::NotRun(format!("{program} failed: {e}"))),
        Err(_) => Err(Unanswered::TimedOut),
    }
}
