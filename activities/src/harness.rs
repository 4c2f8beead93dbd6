//! The harness contract's result side: turning an exit status and the optional result JSON
//! into a classified [`ActorReport`].

use std::path::Path;

use casebatch_proto::{ActorReport, ActorStatus, Failure, FailureClass, Stage, codes};
use serde::Deserialize;

/// The parts of a harness's result JSON the engine reads.
#[derive(Debug, Default, Deserialize)]
pub struct HarnessResult {
    #[serde(default)]
    pub outputs: serde_json::Value,
    #[serde(default)]
    pub scores: std::collections::BTreeMap<String, serde_json::Value>,
    pub failure: Option<DeclaredFailure>,
    /// Where the attempt's trace can be pulled from (the collect stage).
    pub trace: Option<casebatch_bundle::TraceRef>,
}

/// A failure the harness declares about itself.
#[derive(Debug, Deserialize)]
pub struct DeclaredFailure {
    pub class: String,
    pub code: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub retryable: bool,
}

/// Reads the result JSON; `Err` carries why it is unusable.
pub fn read_result(path: &Path) -> Result<Option<HarnessResult>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{} is not a valid result JSON: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("failed to read {}: {e}", path.display())),
    }
}

/// Classifies a finished harness: exit 0 means the actor finished unless its result JSON
/// declares a failure; non-zero is a harness failure unless the JSON says otherwise.
pub fn classify(exit_code: i32, result_path: &Path) -> ActorReport {
    let result = read_result(result_path);
    let declared = match &result {
        Ok(Some(r)) => r.failure.as_ref().map(|d| {
            let class = FailureClass::parse(&d.class).unwrap_or(FailureClass::Harness);
            let message = if d.message.is_empty() {
                format!("the harness reported {}", d.code)
            } else {
                d.message.clone()
            };
            Failure::new(Stage::Await, class, &d.code, message, d.retryable)
        }),
        _ => None,
    };
    if let Some(f) = declared {
        return report(ActorStatus::Failed, exit_code, Some(f));
    }
    if exit_code == 0 {
        return match result {
            Err(msg) => report(
                ActorStatus::Failed,
                exit_code,
                Some(Failure::harness(
                    Stage::Await,
                    codes::HARNESS_BAD_RESULT,
                    msg,
                )),
            ),
            Ok(_) => report(ActorStatus::Finished, exit_code, None),
        };
    }
    let message = if exit_code > 128 {
        format!(
            "the harness was killed by signal {} (exit {exit_code})",
            exit_code - 128
        )
    } else {
        format!("the harness exited with status {exit_code}; see stderr.log")
    };
    report(
        ActorStatus::Failed,
        exit_code,
        Some(Failure::harness(Stage::Await, codes::HARNESS_EXIT, message)),
    )
}

fn report(status: ActorStatus, exit_code: i32, failure: Option<Failure>) -> ActorReport {
    ActorReport {
        status,
        exit_code: Some(exit_code),
        failure,
        adopted: false,
        memory_limit_mb: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_declared_failures_classify() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        assert_eq!(classify(0, &path).status, ActorStatus::Finished);
        let r = classify(3, &path);
        assert_eq!(r.failure.unwrap().class, FailureClass::Harness);

        std::fs::write(
            &path,
            r#"{"failure": {"class": "infra", "code": "BROWSER_DOWN", "retryable": true}}"#,
        )
        .unwrap();
        let f = classify(1, &path).failure.unwrap();
        assert_eq!(
            (f.class, f.code.as_str(), f.retryable),
            (FailureClass::Infra, "BROWSER_DOWN", true)
        );

        std::fs::write(&path, "not json").unwrap();
        let f = classify(0, &path).failure.unwrap();
        assert_eq!(f.code, codes::HARNESS_BAD_RESULT);
    }
}
