//! The runtime service's gRPC protocol (`proto/casebatch/runtime/v1/runtime.proto`, compiled
//! by `build.rs`) and the conversions between its messages and the serde types that travel
//! through Temporal, so both sides of the wire speak one taxonomy.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod generated {
    tonic::include_proto!("casebatch.runtime.v1");
}

pub use generated::*;

use crate::{ActorStatus as WireStatus, Failure as WireFailure, FailureClass, FailureCode, Stage};

/// The contract version this build speaks (the top of `runtime.proto` says what each means):
/// sent in every `SubmitRequest` and `HealthReply`.
pub const CONTRACT_VERSION: u32 = 2;

/// The version a peer speaks, from the field it sent: 0 (unset) is a peer from before the
/// field, contract v1.
pub fn contract_of(wire: u32) -> u32 {
    wire.max(1)
}

impl Command {
    /// A manifest's command string, run by `sh -c` as it always was.
    pub fn shell(script: &str) -> Self {
        Self {
            argv: vec!["sh".into(), "-c".into(), script.into()],
        }
    }
}

impl JobSpec {
    /// The task fields (`input_json`), which must be one JSON object.
    pub fn input(&self) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        match serde_json::from_str(&self.input_json) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            Ok(_) => Err("job.input_json is not a JSON object".into()),
            Err(e) => Err(format!("job.input_json is not JSON: {e}")),
        }
    }

    /// The most each of the attempt's logs keeps, in bytes (`resources.log_mb`, 64 MiB
    /// unset).
    pub fn log_cap_bytes(&self) -> u64 {
        const DEFAULT_LOG_MB: u64 = 64;
        let mb = self.resources.as_ref().and_then(|r| r.log_mb);
        mb.unwrap_or(DEFAULT_LOG_MB).saturating_mul(1024 * 1024)
    }

    /// The declared memory limit (`resources.memory_mb`).
    pub fn memory_mb(&self) -> Option<u64> {
        self.resources.as_ref().and_then(|r| r.memory_mb)
    }
}

impl From<&crate::AttemptKey> for AttemptKey {
    fn from(k: &crate::AttemptKey) -> Self {
        Self {
            batch_id: k.batch_id.clone(),
            case_index: k.case_index,
            attempt: k.attempt,
            bundle_dir: k.bundle_dir.clone(),
            memory_boost_mb: k.memory_boost_mb,
        }
    }
}

impl From<AttemptKey> for crate::AttemptKey {
    fn from(k: AttemptKey) -> Self {
        Self {
            batch_id: k.batch_id,
            bundle_dir: k.bundle_dir,
            case_index: k.case_index,
            attempt: k.attempt,
            memory_boost_mb: k.memory_boost_mb,
            // The agent is the runtime: it needs no route.
            runtime: None,
        }
    }
}

impl From<&WireFailure> for Failure {
    fn from(f: &WireFailure) -> Self {
        Self {
            stage: f.stage.as_str().into(),
            class: f.class.as_str().into(),
            code: f.code.as_str().into(),
            message: f.message.clone(),
            retryable: f.retryable,
        }
    }
}

impl TryFrom<Failure> for WireFailure {
    type Error = String;

    fn try_from(f: Failure) -> Result<Self, String> {
        let stage = serde_json::from_value::<Stage>(serde_json::Value::String(f.stage.clone()))
            .map_err(|_| format!("unknown stage {:?}", f.stage))?;
        let class = FailureClass::parse(&f.class).ok_or(format!("unknown class {:?}", f.class))?;
        Ok(Self {
            stage,
            class,
            code: FailureCode::parse(&f.code),
            message: f.message,
            retryable: f.retryable,
        })
    }
}

impl From<&crate::ActorReport> for ActorReport {
    fn from(r: &crate::ActorReport) -> Self {
        Self {
            status: match r.status {
                WireStatus::Finished => ActorStatus::Finished,
                WireStatus::Failed => ActorStatus::Failed,
                WireStatus::Cancelled => ActorStatus::Cancelled,
            } as i32,
            exit_code: r.exit_code,
            failure: r.failure.as_ref().map(Into::into),
            adopted: r.adopted,
            memory_limit_mb: r.memory_limit_mb,
            usage: r
                .usage
                .as_ref()
                .map(|u| u.0.clone().into_iter().collect())
                .unwrap_or_default(),
            has_usage: r.usage.is_some(),
            retry_after_ms: r.retry_after_ms,
            logs_capped: r.logs_capped.as_deref().map(|c| LogsCapped {
                cap_bytes: c.cap_bytes,
                stdout_dropped: c.stdout_dropped,
                stderr_dropped: c.stderr_dropped,
            }),
        }
    }
}

impl TryFrom<ActorReport> for crate::ActorReport {
    type Error = String;

    fn try_from(r: ActorReport) -> Result<Self, String> {
        let status = match ActorStatus::try_from(r.status) {
            Ok(ActorStatus::Finished) => WireStatus::Finished,
            Ok(ActorStatus::Failed) => WireStatus::Failed,
            Ok(ActorStatus::Cancelled) => WireStatus::Cancelled,
            _ => return Err(format!("unknown actor status {}", r.status)),
        };
        Ok(Self {
            status,
            exit_code: r.exit_code,
            failure: r.failure.map(TryInto::try_into).transpose()?,
            adopted: r.adopted,
            memory_limit_mb: r.memory_limit_mb,
            usage: r
                .has_usage
                .then(|| crate::Usage(r.usage.into_iter().collect())),
            retry_after_ms: r.retry_after_ms,
            logs_capped: r.logs_capped.map(|c| {
                Box::new(crate::LogsCapped {
                    cap_bytes: c.cap_bytes,
                    stdout_dropped: c.stdout_dropped,
                    stderr_dropped: c.stderr_dropped,
                })
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_actor_report_survives_the_wire() {
        let report = crate::ActorReport {
            status: WireStatus::Failed,
            exit_code: Some(137),
            failure: Some(WireFailure::oom(Some(512))),
            adopted: true,
            memory_limit_mb: Some(512),
            usage: Some(crate::Usage(
                [
                    ("cost_usd".to_string(), 0.25),
                    ("input_tokens".into(), 900.0),
                ]
                .into(),
            )),
            retry_after_ms: Some(2500),
            logs_capped: Some(Box::new(crate::LogsCapped {
                cap_bytes: 1 << 20,
                stdout_dropped: 7,
                stderr_dropped: 0,
            })),
        };
        let back: crate::ActorReport = ActorReport::from(&report).try_into().unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn a_harness_declared_code_survives_the_wire() {
        let f = WireFailure::new(
            Stage::Await,
            FailureClass::Harness,
            FailureCode::Declared("MY_CODE".into()),
            "boom",
            false,
        );
        let back: WireFailure = Failure::from(&f).try_into().unwrap();
        assert_eq!(back, f);
    }
}
