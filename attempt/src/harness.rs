//! The harness contract's result side: turning an exit status and the optional result JSON
//! into a classified [`ActorReport`]. The result file is read only through
//! [`crate::files`] (regular file, size limit, off the async threads).

use std::path::Path;

use casebatch_proto::{ActorReport, ActorStatus, Failure, FailureCode, Stage};
use serde::Deserialize;

use crate::files::{self, FileError};
use crate::result_contract::{DeclaredFailure, RawResult};

/// The parts of a harness's result JSON the engine keeps in the case's result: read after
/// classification, which has already held the whole file to the contract.
#[derive(Debug, Default, Deserialize)]
pub struct HarnessResult {
    #[serde(default)]
    pub outputs: serde_json::Value,
    #[serde(default)]
    pub scores: std::collections::BTreeMap<String, serde_json::Value>,
    /// Where the attempt's trace can be pulled from (the collect stage).
    pub trace: Option<crate::records::TraceRef>,
}

/// The longest wait a harness may ask for before the next attempt: an hour.
const MAX_RETRY_AFTER_MS: u64 = 3_600_000;

/// `retry_after_s` in ms, capped at [`MAX_RETRY_AFTER_MS`]; a negative or non-finite value
/// asks for nothing.
fn retry_after_ms(declared: &DeclaredFailure) -> Option<u64> {
    let s = declared
        .retry_after_s
        .filter(|s| s.is_finite() && *s >= 0.0)?;
    Some(((s * 1000.0).round() as u64).min(MAX_RETRY_AFTER_MS))
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
    let result = read_result::<RawResult>(result_path).await;
    let stderr = match exit_code {
        EXIT_NOT_EXECUTABLE | EXIT_NOT_FOUND => files::first_line(stderr_path.to_path_buf()).await,
        _ => None,
    };
    classify_result(exit_code, &result, stderr.as_deref())
}

/// Exit 0 means the actor finished unless its result JSON declares a failure; non-zero is a
/// harness failure unless the JSON says otherwise. A result past the size limit fails the
/// attempt as `harness/RESULT_TOO_LARGE` whatever the exit status; any other unusable result
/// (not a JSON object, not a regular file) fails an exit-0 attempt as `HARNESS_BAD_RESULT`.
/// Exit 126 and 127 (the shell could not execute or find the program) are setup, not the
/// harness's fault: `config/HARNESS_NOT_EXECUTABLE` and `config/HARNESS_NOT_FOUND`, never
/// retried, with `stderr`'s first line (what the shell said) in the message.
///
/// The result is held to its contract ([`crate::result_contract`]) field by field: a declared
/// `failure` that breaks it decided nothing, so the attempt fails as `harness/
/// HARNESS_BAD_RESULT` whatever its exit status; any other field that breaks it (a score
/// that is not a number, a `usage` that is not names to non-negative numbers, a `trace`
/// without a `url`) fails an attempt that had not failed otherwise the same way, and is named
/// in the message of one that had. A usable `usage` is kept on the report whatever the
/// outcome (a failed attempt spent too).
pub fn classify_result(
    exit_code: i32,
    result: &Result<Option<RawResult>, FileError>,
    stderr: Option<&str>,
) -> ActorReport {
    let checked = match result {
        Ok(Some(raw)) => Some(raw.check()),
        _ => None,
    };
    let declared = checked
        .as_ref()
        .and_then(|c| c.failure.as_ref().ok().cloned().flatten());
    let mut report = classify_exit(exit_code, result, declared.as_ref(), stderr);
    if report.failure.is_some() {
        report.retry_after_ms = declared.as_ref().and_then(retry_after_ms);
    }
    let Some(checked) = checked else {
        return report;
    };
    if let Ok(Some(usage)) = &checked.usage {
        report.usage = Some(usage.clone());
    }
    let broken = checked.violations();
    if broken.is_empty() {
        return report;
    }
    let what = format!(
        "the harness's result breaks the contract: {} (`casebatch config schema --kind result` \
         prints it)",
        broken.join("; ")
    );
    match report.failure.as_mut() {
        Some(f) if checked.failure.is_ok() => f.message.push_str(&format!("; {what}")),
        _ => {
            report.status = ActorStatus::Failed;
            report.retry_after_ms = None;
            report.failure = Some(Failure::harness(
                Stage::Await,
                FailureCode::HarnessBadResult,
                what,
            ));
        }
    }
    report
}

/// [`classify_result`] without the contract's checks: the exit status and the declared
/// failure (one that is usable).
fn classify_exit(
    exit_code: i32,
    result: &Result<Option<RawResult>, FileError>,
    declared: Option<&DeclaredFailure>,
    stderr: Option<&str>,
) -> ActorReport {
    if let Some(d) = declared {
        let message = if d.message.is_empty() {
            format!("the harness reported {}", d.code)
        } else {
            d.message.clone()
        };
        let f = Failure::new(Stage::Await, d.class, d.code.clone(), message, d.retryable);
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
        logs_capped: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::FailureClass;

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

    /// Issue 58: a score that is not a number and a class outside the taxonomy were dropped
    /// or guessed at (`"cosmic"` counted as `harness`, its `retryable` ignored).
    #[test]
    fn a_result_that_breaks_the_contract_is_a_bad_result_naming_field_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        std::fs::write(&path, r#"{"scores": {"acc": "high", "f1": 0.5}}"#).unwrap();
        let r = classify_now(0, &path);
        let f = r.failure.unwrap();
        assert_eq!(
            (r.status, f.class, f.code.clone(), f.retryable),
            (
                ActorStatus::Failed,
                FailureClass::Harness,
                FailureCode::HarnessBadResult,
                false
            )
        );
        assert!(
            f.message
                .contains(r#"scores.acc must be a number, got "high""#),
            "{}",
            f.message
        );
        // Failed otherwise: that failure stands, and the broken field is named in it.
        let f = classify_now(3, &path).failure.unwrap();
        assert_eq!(f.code, FailureCode::HarnessExitNonzero);
        assert!(f.message.contains("scores.acc"), "{}", f.message);

        // A declared failure outside the contract decides nothing, whatever the exit status.
        std::fs::write(
            &path,
            r#"{"failure": {"class": "cosmic", "code": "RAYS", "retryable": true, "retry_after_s": 5}}"#,
        )
        .unwrap();
        for exit in [0, 1] {
            let r = classify_now(exit, &path);
            let f = r.failure.unwrap();
            assert_eq!(
                (f.class, f.code.clone(), f.retryable, r.retry_after_ms),
                (
                    FailureClass::Harness,
                    FailureCode::HarnessBadResult,
                    false,
                    None
                )
            );
            assert!(
                f.message.contains(
                    r#"failure.class must be one of infra, config, harness, agent, got "cosmic""#
                ),
                "{}",
                f.message
            );
        }

        // A usable declared failure stands beside a broken score, which it names.
        std::fs::write(
            &path,
            r#"{"failure": {"class": "agent", "code": "GAVE_UP"}, "scores": {"acc": [1]}}"#,
        )
        .unwrap();
        let f = classify_now(1, &path).failure.unwrap();
        assert_eq!((f.class, f.code.as_str()), (FailureClass::Agent, "GAVE_UP"));
        assert!(
            f.message.contains("scores.acc must be a number, got [1]"),
            "{}",
            f.message
        );
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
