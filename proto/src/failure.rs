//! The failure taxonomy: where a case died (stage) and whose fault it was (class).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The stage of the per-case pipeline a failure was born in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Provision,
    Submit,
    Await,
    Evaluate,
    Collect,
    Cleanup,
}

/// Whose fault a failure is. Decides retry: only `Infra` is ever retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The platform's fault: placement, network, runtime down, platform timeout, OOM.
    Infra,
    /// Workspace or manifest setup: retrying changes nothing.
    Config,
    /// The harness itself crashed: same input, same failure.
    Harness,
    /// A legitimate verdict (the evaluator said fail). Never retried.
    Agent,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Provision => "provision",
            Stage::Submit => "submit",
            Stage::Await => "await",
            Stage::Evaluate => "evaluate",
            Stage::Collect => "collect",
            Stage::Cleanup => "cleanup",
        }
    }
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Infra => "infra",
            FailureClass::Config => "config",
            FailureClass::Harness => "harness",
            FailureClass::Agent => "agent",
        }
    }

    /// Parses the lowercase name used in manifests, result JSON and CLI flags.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "infra" => Some(FailureClass::Infra),
            "config" => Some(FailureClass::Config),
            "harness" => Some(FailureClass::Harness),
            "agent" => Some(FailureClass::Agent),
            _ => None,
        }
    }
}

/// Stable failure codes that other components key on.
pub mod codes {
    pub const OOM_KILLED: &str = "OOM_KILLED";
    pub const TIMEOUT: &str = "TIMEOUT";
    pub const HARNESS_EXIT: &str = "HARNESS_EXIT_NONZERO";
    pub const HARNESS_BAD_RESULT: &str = "HARNESS_BAD_RESULT";
    /// A result file (harness or evaluator) past the worker's size limit
    /// (`CASEBATCH_MAX_RESULT_BYTES`, default 16 MiB); class harness, not retryable.
    pub const RESULT_TOO_LARGE: &str = "RESULT_TOO_LARGE";
    pub const SPAWN_FAILED: &str = "SPAWN_FAILED";
    pub const JOB_LOST: &str = "JOB_LOST";
    pub const EVALUATOR_FAILED: &str = "EVALUATOR_FAILED";
    pub const VERDICT_FAIL: &str = "VERDICT_FAIL";
    pub const CLEANUP_UNCONFIRMED: &str = "CLEANUP_UNCONFIRMED";
    pub const CANCELLED: &str = "CANCELLED";
    pub const ACTIVITY_ERROR: &str = "ACTIVITY_ERROR";
    pub const SIMULATED: &str = "SIMULATED_INFRA";
}

/// `{stage, class, code, message, retryable}`, classified where the error is born.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub stage: Stage,
    pub class: FailureClass,
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl Failure {
    /// A platform failure; retryable unless the caller says otherwise.
    pub fn infra(stage: Stage, code: &str, message: impl Into<String>) -> Self {
        Self::new(stage, FailureClass::Infra, code, message, true)
    }

    pub fn config(stage: Stage, code: &str, message: impl Into<String>) -> Self {
        Self::new(stage, FailureClass::Config, code, message, false)
    }

    pub fn harness(stage: Stage, code: &str, message: impl Into<String>) -> Self {
        Self::new(stage, FailureClass::Harness, code, message, false)
    }

    pub fn agent(message: impl Into<String>) -> Self {
        Self::new(
            Stage::Evaluate,
            FailureClass::Agent,
            codes::VERDICT_FAIL,
            message,
            false,
        )
    }

    /// A kill by the memory limit: fatal at the same size.
    pub fn oom(limit_mb: Option<u64>) -> Self {
        let limit = limit_mb.map_or_else(|| "its limit".to_string(), |mb| format!("{mb} MB"));
        Self::new(
            Stage::Await,
            FailureClass::Infra,
            codes::OOM_KILLED,
            format!(
                "killed by the memory limit ({limit}); retrying at the same size dies the same way: raise resources.memory_mb"
            ),
            false,
        )
    }

    pub fn new(
        stage: Stage,
        class: FailureClass,
        code: &str,
        message: impl Into<String>,
        retryable: bool,
    ) -> Self {
        // Only infra failures are ever retryable: the other classes repeat on the same input.
        let retryable = retryable && class == FailureClass::Infra;
        Self {
            stage,
            class,
            code: code.to_string(),
            message: message.into(),
            retryable,
        }
    }
}

/// Prefix of the Temporal failure types casebatch raises (`casebatch.infra`, ...).
pub const TEMPORAL_TYPE_PREFIX: &str = "casebatch.";

impl FailureClass {
    /// The Temporal failure type of this class; retry policies key on it.
    pub fn temporal_type(self) -> String {
        format!("{TEMPORAL_TYPE_PREFIX}{}", self.as_str())
    }

    /// The class of a casebatch Temporal failure type.
    pub fn from_temporal_type(type_name: &str) -> Option<Self> {
        Self::parse(type_name.strip_prefix(TEMPORAL_TYPE_PREFIX)?)
    }

    /// Temporal failure types no activity retry should re-run: everything but infra.
    pub fn non_retryable_temporal_types() -> Vec<String> {
        [
            FailureClass::Config,
            FailureClass::Harness,
            FailureClass::Agent,
        ]
        .iter()
        .map(|c| c.temporal_type())
        .collect()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} at {}: {}",
            self.class.as_str(),
            self.code,
            self.stage.as_str(),
            self.message
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_infra_failures_can_be_retryable() {
        assert!(Failure::infra(Stage::Submit, codes::SPAWN_FAILED, "x").retryable);
        let harness = Failure::new(Stage::Await, FailureClass::Harness, "X", "m", true);
        assert!(!harness.retryable);
        assert!(!Failure::agent("fail").retryable);
        assert!(!Failure::config(Stage::Provision, "X", "m").retryable);
    }

    #[test]
    fn oom_is_fatal_and_says_what_to_raise() {
        let f = Failure::oom(Some(64));
        assert!(!f.retryable);
        assert_eq!(f.class, FailureClass::Infra);
        assert!(f.message.contains("resources.memory_mb"), "{}", f.message);
    }

    #[test]
    fn temporal_types_round_trip_and_only_infra_is_retryable() {
        for class in [
            FailureClass::Infra,
            FailureClass::Config,
            FailureClass::Harness,
            FailureClass::Agent,
        ] {
            assert_eq!(
                FailureClass::from_temporal_type(&class.temporal_type()),
                Some(class)
            );
        }
        let blocked = FailureClass::non_retryable_temporal_types();
        assert!(!blocked.contains(&FailureClass::Infra.temporal_type()));
        assert!(blocked.contains(&"casebatch.config".to_string()));
    }

    #[test]
    fn wire_names_are_snake_case() {
        let f = Failure::infra(Stage::Collect, "TRACE", "m");
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["stage"], "collect");
        assert_eq!(v["class"], "infra");
    }
}
