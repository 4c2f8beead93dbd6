//! The failure taxonomy: where a case died (stage) and whose fault it was (class).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The stage of the per-case pipeline a failure was born in.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
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
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
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

/// Declares [`FailureCode`]: every code casebatch itself raises, with its wire name, in one
/// table.
macro_rules! failure_codes {
    ($($(#[doc = $doc:literal])+ $variant:ident => $wire:literal,)+) => {
        /// Stable failure codes that other components (retry decisions, reports, dashboards)
        /// key on. Serialized as the wire name (`"OOM_KILLED"`); a code a harness declares
        /// about itself that is not in the table is kept verbatim as [`FailureCode::Declared`].
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum FailureCode {
            $($(#[doc = $doc])+ $variant,)+
            /// A code a harness declared in its result JSON (`failure.code`), not one of ours.
            Declared(String),
        }

        impl FailureCode {
            /// Every code of the table (not `Declared`), for docs and exhaustive tests.
            pub const ALL: &[FailureCode] = &[$(FailureCode::$variant,)+];

            pub fn as_str(&self) -> &str {
                match self {
                    $(FailureCode::$variant => $wire,)+
                    FailureCode::Declared(code) => code,
                }
            }

            /// The code with this wire name; unknown names are a harness's own codes.
            pub fn parse(wire: &str) -> Self {
                match wire {
                    $($wire => FailureCode::$variant,)+
                    other => FailureCode::Declared(other.to_string()),
                }
            }
        }
    };
}

failure_codes! {
    /// Killed by the memory limit: fatal at the same size (retry-failed doubles it).
    OomKilled => "OOM_KILLED",
    /// The case's wall-clock limit (`timeout_seconds`) expired.
    Timeout => "TIMEOUT",
    /// The harness exited non-zero without declaring a failure.
    HarnessExitNonzero => "HARNESS_EXIT_NONZERO",
    /// The harness's program was not found: exit 127 from the shell that starts it (a
    /// missing file, or a relative path from before paths were resolved against the
    /// manifest's directory). Class config, never retried; the message quotes stderr's first
    /// line.
    HarnessNotFound => "HARNESS_NOT_FOUND",
    /// The harness's program is not executable: exit 126 from the shell that starts it (no
    /// execute permission, a directory). Class config, never retried; the message quotes
    /// stderr's first line.
    HarnessNotExecutable => "HARNESS_NOT_EXECUTABLE",
    /// The harness exited 0 but its result JSON is unusable.
    HarnessBadResult => "HARNESS_BAD_RESULT",
    /// A result file (harness or evaluator) past the worker's size limit
    /// (`CASEBATCH_MAX_RESULT_BYTES`, default 16 MiB); class harness, not retryable.
    ResultTooLarge => "RESULT_TOO_LARGE",
    /// The harness process could not be started.
    SpawnFailed => "SPAWN_FAILED",
    /// The case declares no harness command.
    NoHarness => "NO_HARNESS",
    /// A `pass_env:` variable is not set in the worker's environment.
    PassEnvUnset => "PASS_ENV_UNSET",
    /// The attempt's directories could not be created.
    ProvisionIo => "PROVISION_IO",
    /// The worker's user may not write the bundle (permissions, a read-only mount): class
    /// config, never retried; the message names the path and the worker's uid.
    BundleUnwritable => "BUNDLE_UNWRITABLE",
    /// The batch's plan could not be read from the bundle.
    BundleUnreadable => "BUNDLE_UNREADABLE",
    /// The workflow named a case the bundle's plan does not have.
    CaseNotInPlan => "CASE_NOT_IN_PLAN",
    /// The job's process vanished and nothing of it can be adopted.
    JobLost => "JOB_LOST",
    /// The evaluator could not run or produced no usable verdict.
    EvaluatorFailed => "EVALUATOR_FAILED",
    /// The evaluator's verdict is fail: a legitimate outcome, never retried.
    VerdictFail => "VERDICT_FAIL",
    /// The trace could not be pulled; the work is kept, retry-failed collects it again.
    TraceCollectFailed => "TRACE_COLLECT_FAILED",
    /// Marked processes of the attempt may still be alive after cleanup.
    CleanupUnconfirmed => "CLEANUP_UNCONFIRMED",
    /// The case was cancelled with the batch.
    Cancelled => "CANCELLED",
    /// An activity failed without a classified outcome (the platform's fault).
    ActivityError => "ACTIVITY_ERROR",
    /// An infra failure the fake runtime simulates.
    SimulatedInfra => "SIMULATED_INFRA",
    /// The runtime refused the job: its envelope (max concurrent jobs, memory budget) is
    /// full. Retryable: a slot frees when a job ends.
    RuntimeFull => "RUNTIME_FULL",
    /// The runtime agent could not be reached (the message names its endpoint).
    RuntimeUnreachable => "RUNTIME_UNREACHABLE",
    /// The runtime agent refused the call's credentials (missing or wrong token).
    RuntimeAuth => "RUNTIME_AUTH",
    /// The runtime agent and the worker speak different versions of the runtime contract
    /// (`runtime.proto`); class config: the message names both and which side to upgrade.
    RuntimeContract => "RUNTIME_CONTRACT",
    /// The container engine (Docker, or podman's service) at `DOCKER_HOST` or the default
    /// socket did not answer; retryable, the message names the address.
    ContainerEngineUnreachable => "CONTAINER_ENGINE_UNREACHABLE",
    /// A sandbox's image is not on the engine's host and may not be pulled (`pull: never`),
    /// or the registry refused it: class config, never retried; the message names the image.
    ImageUnavailable => "IMAGE_UNAVAILABLE",
    /// The node a scheduler ran the job on failed or was lost, the job could not boot there,
    /// or the scheduler preempted it: retryable, and a case with a runtime list moves on.
    NodeFailed => "NODE_FAILED",
    /// The cluster scheduler refused the job (an unknown partition, account or QOS, a limit
    /// the job passes): class config; the message quotes the scheduler.
    SchedulerRefused => "SCHEDULER_REFUSED",
    /// Someone other than casebatch cancelled the job in its scheduler (an operator's
    /// `scancel`, a site policy): infra, retryable; the message names the job.
    SchedulerCancelled => "SCHEDULER_CANCELLED",
}

impl fmt::Display for FailureCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A wire name: one of ours (`"OOM_KILLED"`) or one a harness declared.
impl schemars::JsonSchema for FailureCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FailureCode".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A stable failure code's wire name (`OOM_KILLED`), or one a harness declared."
        })
    }
}

impl Serialize for FailureCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FailureCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(FailureCode::parse(&wire))
    }
}

/// `{stage, class, code, message, retryable}`, classified where the error is born.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Failure {
    pub stage: Stage,
    pub class: FailureClass,
    pub code: FailureCode,
    pub message: String,
    pub retryable: bool,
}

impl Failure {
    /// A platform failure; retryable unless the caller says otherwise.
    pub fn infra(stage: Stage, code: FailureCode, message: impl Into<String>) -> Self {
        Self::new(stage, FailureClass::Infra, code, message, true)
    }

    pub fn config(stage: Stage, code: FailureCode, message: impl Into<String>) -> Self {
        Self::new(stage, FailureClass::Config, code, message, false)
    }

    pub fn harness(stage: Stage, code: FailureCode, message: impl Into<String>) -> Self {
        Self::new(stage, FailureClass::Harness, code, message, false)
    }

    pub fn agent(message: impl Into<String>) -> Self {
        Self::new(
            Stage::Evaluate,
            FailureClass::Agent,
            FailureCode::VerdictFail,
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
            FailureCode::OomKilled,
            format!(
                "killed by the memory limit ({limit}); retrying at the same size dies the same way: raise resources.memory_mb"
            ),
            false,
        )
    }

    pub fn new(
        stage: Stage,
        class: FailureClass,
        code: FailureCode,
        message: impl Into<String>,
        retryable: bool,
    ) -> Self {
        // Only infra failures are ever retryable: the other classes repeat on the same input.
        let retryable = retryable && class == FailureClass::Infra;
        Self {
            stage,
            class,
            code,
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
        assert!(Failure::infra(Stage::Submit, FailureCode::SpawnFailed, "x").retryable);
        let declared = FailureCode::parse("X");
        let harness = Failure::new(Stage::Await, FailureClass::Harness, declared, "m", true);
        assert!(!harness.retryable);
        assert!(!Failure::agent("fail").retryable);
        assert!(!Failure::config(Stage::Provision, FailureCode::NoHarness, "m").retryable);
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
        let f = Failure::infra(Stage::Collect, FailureCode::TraceCollectFailed, "m");
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["stage"], "collect");
        assert_eq!(v["class"], "infra");
        assert_eq!(v["code"], "TRACE_COLLECT_FAILED");
    }

    #[test]
    fn every_code_round_trips_through_its_wire_name() {
        let mut seen = std::collections::BTreeSet::new();
        for code in FailureCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} is listed twice");
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(serde_json::from_str::<FailureCode>(&json).unwrap(), *code);
            assert!(!matches!(
                FailureCode::parse(code.as_str()),
                FailureCode::Declared(_)
            ));
        }
    }

    #[test]
    fn a_harness_code_outside_the_table_is_kept_verbatim() {
        let code: FailureCode = serde_json::from_str("\"RATE_LIMITED\"").unwrap();
        assert_eq!(code, FailureCode::Declared("RATE_LIMITED".into()));
        assert_eq!(serde_json::to_string(&code).unwrap(), "\"RATE_LIMITED\"");
    }
}
