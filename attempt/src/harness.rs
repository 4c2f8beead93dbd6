//! The harness contract's result side: turning an exit status and the optional result JSON
//! into a classified [`ActorReport`]. The result file is read only through
//! [`crate::files`] (regular file, size limit, off the async threads).

use std::path::Path;

use casebatch_proto::{ActorReport, ActorStatus, Failure, FailureClass, FailureCode, Stage, Usage};
use serde::Deserialize;

use crate::files::{self, FileError};

/// The parts of a harness's result JSON the engine reads.
#[derive(Debug, Default, Deserialize)]
pub struct HarnessResult {
    #[serde(default)]
    pub outputs: serde_json::Value,
    #[serde(default)]
    pub scores: std::collections::BTreeMap<String, serde_json::Value>,
    pub failure: Option<DeclaredFailure>,
    /// Where the attempt's trace can be pulled from (the collect stage).
    pub trace: Option<crate::records::TraceRef>,
}

/// A failure the harness declares about itself.
#[derive(Debug, Deserialize)]
pub struct DeclaredFailure {
    pub class: String,
    pub code: FailureCode,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub retryable: bool,
    /// With `RATE_LIMITED`: how long to wait before the next attempt (the API's
    /// `Retry-After`), in seconds.
    #[serde(default)]
    pub retry_after_s: Option<f64>,
}

/// The longest wait a harness may ask for before the next attempt: an hour.
const MAX_RETRY_AFTER_MS: u64 = 3_600_000;

impl DeclaredFailure {
    /// `retry_after_s` in ms, capped at [`MAX_RETRY_AFTER_MS`]; a negative or non-finite
    /// value asks for nothing.
    fn retry_after_ms(&self) -> Option<u64> {
        let s = self.retry_after_s.filter(|s| s.is_finite() && *s >= 0.0)?;
        Some(((s * 1000.0).round() as u64).min(MAX_RETRY_AFTER_MS))
    }
}

/// What classification needs of a result: the declared failure, with the rest of the shape
/// checked but not kept (`outputs` is never materialized here).
#[derive(Debug, Default, Deserialize)]
pub struct ResultCheck {
    #[serde(default)]
    #[allow(dead_code)]
    scores: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
    failure: Option<DeclaredFailure>,
    #[allow(dead_code)]
    trace: Option<crate::records::TraceRef>,
    /// Checked and kept: what the attempt consumed ([`casebatch_proto::Usage`]).
    usage: Option<serde_json::Value>,
}

/// Only the trace reference of a result (the collect stage).
#[derive(Debug, Default, Deserialize)]
pub struct TraceOnly {
    pub trace: Option<crate::records::TraceRef>,
}

/// Reads (part of) the attempt's result JSON through [`crate::files`]: regular file
/// only, bounded by the worker's limit, off the async threads. `Ok(None)`: none was written.
pub async fn read_result<T: serde::de::DeserializeOwned + Send + 'static>(
    path: &Path,
) -> Result<Option<T>, FileError> {
    files::read_json(path.to_path_buf(), files::max_result_bytes()).await
}

/// Exit statuses of the shell that starts the harness when it cannot: POSIX's "found but
/// not executable" and "not found". A program's own 126/127 says the same of a command it
/// runs, equally a setup problem.
const EXIT_NOT_EXECUTABLE: i32 = 126;
const EXIT_NOT_FOUND: i32 = 127;

/// What the wrapper's shell said of a plain command it could not run, without the
/// `casebatch-wrapper: <line>: ` it puts first (the wrapper's name and a line of its script,
/// which mean nothing to the user): `run.py: not found`.
fn without_wrapper_prefix(line: &str) -> &str {
    line.strip_prefix(crate::local::wrapper::WRAPPER_NAME)
        .and_then(|rest| rest.strip_prefix(": "))
        .and_then(|rest| {
            let (number, said) = rest.split_once(": ")?;
            number.bytes().all(|b| b.is_ascii_digit()).then_some(said)
        })
        .unwrap_or(line)
}

/// Classifies a finished harness: reads its result file (and, for exit 126 or 127, the
/// first line of its stderr log, the shell's own words) and applies [`classify_result`].
pub async fn classify(exit_code: i32, result_path: &Path, stderr_path: &Path) -> ActorReport {
    let result = read_result::<ResultCheck>(result_path).await;
    let stderr = match exit_code {
        EXIT_NOT_EXECUTABLE | EXIT_NOT_FOUND => files::first_line(stderr_path.to_path_buf()).await,
        _ => None,
    };
    classify_result(exit_code, &result, stderr.as_deref())
}

/// Exit 0 means the actor finished unless its result JSON declares a failure; non-zero is a
/// harness failure unless the JSON says otherwise. A result past the size limit fails the
/// attempt as `harness/RESULT_TOO_LARGE` whatever the exit status; any other unusable result
/// (not JSON, not a regular file) fails an exit-0 attempt as `HARNESS_BAD_RESULT`. Exit 126
/// and 127 (the shell could not execute or find the program) are setup, not the harness's
/// fault: `config/HARNESS_NOT_EXECUTABLE` and `config/HARNESS_NOT_FOUND`, never retried, with
/// `stderr`'s first line (what the shell said) in the message.
///
/// A result's `usage` is kept on the report whatever the outcome (a failed attempt spent
/// too); one that is not an object of non-negative numbers fails an attempt that had not
/// failed otherwise, as `harness/HARNESS_BAD_RESULT` naming the field.
pub fn classify_result(
    exit_code: i32,
    result: &Result<Option<ResultCheck>, FileError>,
    stderr: Option<&str>,
) -> ActorReport {
    let (usage, retry_after_ms) = match result {
        Ok(Some(r)) => (
            r.usage.as_ref().map(Usage::parse),
            r.failure.as_ref().and_then(DeclaredFailure::retry_after_ms),
        ),
        _ => (None, None),
    };
    let mut report = classify_exit(exit_code, result, stderr);
    if report.failure.is_some() {
        report.retry_after_ms = retry_after_ms;
    }
    match usage {
        Some(Ok(usage)) => report.usage = Some(usage),
        Some(Err(why)) if report.failure.is_none() => {
            report.status = ActorStatus::Failed;
            report.failure = Some(Failure::harness(
                Stage::Await,
                FailureCode::HarnessBadResult,
                format!(
                    "the harness's result has an unusable usage: {why} (numbers only, e.g. \
                     {{\"cost_usd\": 0.02, \"input_tokens\": 1200}})"
                ),
            ));
        }
        _ => {}
    }
    report
}

/// [`classify_result`] without `usage`: the exit status and the declared failure.
fn classify_exit(
    exit_code: i32,
    result: &Result<Option<ResultCheck>, FileError>,
    stderr: Option<&str>,
) -> ActorReport {
    let declared = match result {
        Ok(Some(r)) => r.failure.as_ref().map(|d| {
            let class = FailureClass::parse(&d.class).unwrap_or(FailureClass::Harness);
            let message = if d.message.is_empty() {
                format!("the harness reported {}", d.code)
            } else {
                d.message.clone()
            };
            Failure::new(Stage::Await, class, d.code.clone(), message, d.retryable)
        }),
        _ => None,
    };
    if let Some(f) = declared {
        return report(ActorStatus::Failed, exit_code, Some(f));
    }
    if let Err(e) = result
        && e.is_too_large()
    {
        return report(
            ActorStatus::Failed,
            exit_code,
            Some(Failure::harness(
                Stage::Await,
                FailureCode::ResultTooLarge,
                format!("the harness's result was not read: {e}"),
            )),
        );
    }
    if exit_code == 0 {
        return match result {
            Err(e) => report(
                ActorStatus::Failed,
                exit_code,
                Some(Failure::harness(
                    Stage::Await,
                    FailureCode::HarnessBadResult,
                    format!("the harness's result is unusable: {e}"),
                )),
            ),
            Ok(_) => report(ActorStatus::Finished, exit_code, None),
        };
    }
    let unrunnable = match exit_code {
        EXIT_NOT_EXECUTABLE => Some((
            FailureCode::HarnessNotExecutable,
            "the harness's program is not executable (exit 126)",
        )),
        EXIT_NOT_FOUND => Some((
            FailureCode::HarnessNotFound,
            "the harness's program was not found (exit 127)",
        )),
        _ => None,
    };
    if let Some((code, what)) = unrunnable {
        let said = stderr.map_or_else(
            || "; stderr.log says nothing".to_string(),
            |line| format!(": {}", without_wrapper_prefix(line)),
        );
        return report(
            ActorStatus::Failed,
            exit_code,
            Some(Failure::config(
                Stage::Await,
                code,
                format!(
                    "{what}{said} (check the command's path and permissions; a relative path \
                     is resolved against the manifest's directory)"
                ),
            )),
        );
    }
    let mut message = if exit_code > 128 {
        format!(
            "the harness was killed by signal {} (exit {exit_code})",
            exit_code - 128
        )
    } else {
        format!("the harness exited with status {exit_code}; see stderr.log")
    };
    if let Err(e) = result {
        message.push_str(&format!("; its result was not read: {e}"));
    }
    report(
        ActorStatus::Failed,
        exit_code,
        Some(Failure::harness(
            Stage::Await,
            FailureCode::HarnessExitNonzero,
            message,
        )),
    )
}

fn report(status: ActorStatus, exit_code: i32, failure: Option<Failure>) -> ActorReport {
    ActorReport {
        status,
        exit_code: Some(exit_code),
        failure,
        adopted: false,
        memory_limit_mb: None,
        usage: None,
        retry_after_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify_now(exit: i32, path: &Path) -> ActorReport {
        classify_result(
            exit,
            &files::read_json_now(path, files::DEFAULT_MAX_RESULT_BYTES),
            None,
        )
    }

    #[test]
    fn exit_codes_and_declared_failures_classify() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        assert_eq!(classify_now(0, &path).status, ActorStatus::Finished);
        let r = classify_now(3, &path);
        assert_eq!(r.failure.unwrap().class, FailureClass::Harness);

        std::fs::write(
            &path,
            r#"{"failure": {"class": "infra", "code": "BROWSER_DOWN", "retryable": true}}"#,
        )
        .unwrap();
        let f = classify_now(1, &path).failure.unwrap();
        assert_eq!(
            (f.class, f.code.as_str(), f.retryable),
            (FailureClass::Infra, "BROWSER_DOWN", true)
        );

        std::fs::write(&path, "not json").unwrap();
        let f = classify_now(0, &path).failure.unwrap();
        assert_eq!(f.code, FailureCode::HarnessBadResult);

        // The shape is still checked although nothing but the failure is kept.
        std::fs::write(&path, r#"{"scores": 5}"#).unwrap();
        let f = classify_now(0, &path).failure.unwrap();
        assert_eq!(f.code, FailureCode::HarnessBadResult);
    }

    #[test]
    fn a_declared_retry_after_is_kept_in_ms_and_capped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        let declare = |after: &str| {
            let text = format!(
                r#"{{"failure": {{"class": "infra", "code": "RATE_LIMITED", "retryable": true, "retry_after_s": {after}}}}}"#
            );
            std::fs::write(&path, text).unwrap();
            classify_now(1, &path)
        };
        let r = declare("2.5");
        assert_eq!(r.failure.unwrap().code.as_str(), "RATE_LIMITED");
        assert_eq!(r.retry_after_ms, Some(2500));
        assert_eq!(declare("86400").retry_after_ms, Some(3_600_000));
        assert_eq!(declare("-1").retry_after_ms, None);
    }

    #[test]
    fn usage_is_kept_whatever_the_outcome_and_a_bad_one_fails_a_finished_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        std::fs::write(&path, r#"{"usage": {"cost_usd": 0.5, "input_tokens": 10}}"#).unwrap();
        let ok = classify_now(0, &path);
        assert_eq!(ok.status, ActorStatus::Finished);
        assert_eq!(ok.usage.unwrap().cost_usd(), 0.5);
        // A failed attempt spent too.
        assert_eq!(classify_now(1, &path).usage.unwrap().tokens(), 10.0);

        std::fs::write(&path, r#"{"usage": {"cost_usd": "lots"}}"#).unwrap();
        let bad = classify_now(0, &path);
        let f = bad.failure.unwrap();
        assert_eq!(
            (bad.status, f.class, f.code),
            (
                ActorStatus::Failed,
                FailureClass::Harness,
                FailureCode::HarnessBadResult
            )
        );
        assert!(f.message.contains("usage.cost_usd"), "{}", f.message);
        assert!(bad.usage.is_none());
        // The attempt's own failure stays what decides it.
        let f = classify_now(3, &path).failure.unwrap();
        assert_eq!(f.code, FailureCode::HarnessExitNonzero);
    }

    /// The shell's 126 and 127 are setup problems, quoted from stderr; a declared failure
    /// still wins, and any other status stays the harness's.
    #[tokio::test]
    async fn a_program_the_shell_cannot_run_is_a_config_failure_quoting_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let (result, stderr) = (
            dir.path().join("result.json"),
            dir.path().join("stderr.log"),
        );
        std::fs::write(&stderr, "\n  sh: 1: ./run.sh: not found\nmore\n").unwrap();
        let f = classify(127, &result, &stderr).await.failure.unwrap();
        assert_eq!(
            (f.class, f.code.clone(), f.retryable),
            (FailureClass::Config, FailureCode::HarnessNotFound, false)
        );
        assert!(
            f.message
                .contains("not found (exit 127): sh: 1: ./run.sh: not found ("),
            "{}",
            f.message
        );

        std::fs::write(&stderr, "sh: 1: ./run.sh: Permission denied\n").unwrap();
        let f = classify(126, &result, &stderr).await.failure.unwrap();
        assert_eq!(
            (f.class, f.code.clone()),
            (FailureClass::Config, FailureCode::HarnessNotExecutable)
        );
        assert!(
            f.message.contains(": sh: 1: ./run.sh: Permission denied"),
            "{}",
            f.message
        );

        // A plain command, looked for by the wrapper's own shell.
        std::fs::write(&stderr, "casebatch-wrapper: 11: run.py: not found\n").unwrap();
        let f = classify(127, &result, &stderr).await.failure.unwrap();
        assert!(
            f.message.contains("(exit 127): run.py: not found ("),
            "{}",
            f.message
        );

        std::fs::remove_file(&stderr).unwrap();
        let f = classify(127, &result, &stderr).await.failure.unwrap();
        assert!(
            f.message.contains("stderr.log says nothing"),
            "{}",
            f.message
        );

        let f = classify(125, &result, &stderr).await.failure.unwrap();
        assert_eq!(
            (f.class, f.code),
            (FailureClass::Harness, FailureCode::HarnessExitNonzero)
        );

        std::fs::write(
            &result,
            r#"{"failure": {"class": "agent", "code": "GAVE_UP", "message": "no"}}"#,
        )
        .unwrap();
        let f = classify(127, &result, &stderr).await.failure.unwrap();
        assert_eq!((f.class, f.code.as_str()), (FailureClass::Agent, "GAVE_UP"));
    }

    #[test]
    fn unsafe_and_oversized_results_classify_as_harness_failures() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let f = classify_now(0, &path).failure.unwrap();
        assert_eq!(
            (f.class, f.code),
            (FailureClass::Harness, FailureCode::HarnessBadResult)
        );
        assert!(f.message.contains("a FIFO"), "{}", f.message);
        std::fs::remove_file(&path).unwrap();

        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let f = classify_now(0, &path).failure.unwrap();
        assert!(f.message.contains("symbolic link"), "{}", f.message);
        let f = classify_now(2, &path).failure.unwrap();
        assert_eq!(f.code, FailureCode::HarnessExitNonzero);
        assert!(f.message.contains("symbolic link"), "{}", f.message);
        std::fs::remove_file(&path).unwrap();

        std::fs::write(&path, format!(r#"{{"outputs": "{}"}}"#, "x".repeat(200))).unwrap();
        for exit in [0, 1] {
            let r = classify_result(exit, &files::read_json_now(&path, 100), None);
            let f = r.failure.unwrap();
            assert_eq!(
                (r.status, f.class, f.code),
                (
                    ActorStatus::Failed,
                    FailureClass::Harness,
                    FailureCode::ResultTooLarge
                )
            );
        }
    }
}
