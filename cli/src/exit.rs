//! The documented, stable exit codes, and the mapping of every error to one.

use std::fmt;

use casebatch_control::{ControlError, Verdict};
use casebatch_worker::EngineError;

/// Exit codes (see the README): the only place they are defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every case succeeded (verified by its evaluator where one is configured).
    Success = 0,
    /// Drained or paused with queued work remaining: deliberately incomplete. (For `casebatch
    /// health`: the probed process is not healthy, as a HEALTHCHECK expects.)
    Incomplete = 1,
    /// Usage or validation error; nothing was started or changed.
    Usage = 2,
    /// The engine could not be reached or started, or refused a call.
    Engine = 3,
    /// The batch finished with failed or mixed outcomes (all outputs still written).
    Failures = 4,
    /// The output directory could not be written. What the engine holds is intact: fix the
    /// disk and resume.
    Output = 5,
    /// The batch's workflow was terminated from outside casebatch (finished cases are kept;
    /// resume continues the rest).
    Terminated = 6,
}

impl From<Verdict> for Exit {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::AllSucceeded => Exit::Success,
            Verdict::Incomplete => Exit::Incomplete,
            Verdict::Failures => Exit::Failures,
        }
    }
}

/// An error that knows its exit code. Messages read "failed to ..." and say what to do.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    /// A flag the CLI itself could not read.
    pub fn usage(message: impl fmt::Display) -> Self {
        Self {
            exit: Exit::Usage,
            message: message.to_string(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// One exit code per kind of failure, decided by variant, never by message.
fn exit_of(e: &ControlError) -> Exit {
    match e {
        ControlError::Manifest(_)
        | ControlError::BadArgument { .. }
        | ControlError::NoBundle { .. }
        | ControlError::UnknownCase { .. }
        | ControlError::PlanConflict { .. }
        | ControlError::BatchExists { .. }
        | ControlError::NotRunning { .. }
        | ControlError::Refused { .. }
        | ControlError::StillRunning { .. }
        | ControlError::NotOurBatch { .. }
        | ControlError::EngineMismatch { .. }
        | ControlError::BundleUnreadable(_)
        | ControlError::History { .. } => Exit::Usage,
        ControlError::Terminated { .. } => Exit::Terminated,
        // A plaintext connection to a remote address is a usage error, not an outage.
        ControlError::Engine(EngineError::Insecure { .. }) => Exit::Usage,
        ControlError::Engine(_) | ControlError::EngineCall { .. } => Exit::Engine,
        ControlError::Write(_) | ControlError::OutOfSpace { .. } => Exit::Output,
    }
}

impl From<ControlError> for CliError {
    fn from(e: ControlError) -> Self {
        Self {
            exit: exit_of(&e),
            message: e.to_string(),
        }
    }
}

pub type CliResult<T = Exit> = Result<T, CliError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_failure_is_not_a_usage_error() {
        let write = ControlError::Write(casebatch_bundle::BundleError::Write {
            path: "/x/batch_plan.json".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        });
        assert_eq!(CliError::from(write).exit, Exit::Output);
        let unreadable = ControlError::BundleUnreadable(casebatch_bundle::BundleError::Read {
            path: "/x/batch_plan.json".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        assert_eq!(CliError::from(unreadable).exit, Exit::Usage);
        let full = ControlError::OutOfSpace {
            action: "continue batch x".into(),
            path: "/x".into(),
            space: "0 B free of 3.0 MiB".into(),
            then: "`casebatch batch resume`".into(),
        };
        assert_eq!(CliError::from(full).exit, Exit::Output);
    }

    #[test]
    fn engine_failures_exit_3_but_an_insecure_address_is_usage() {
        let call = ControlError::EngineCall {
            action: "start workflow".into(),
            message: "unavailable".into(),
        };
        assert_eq!(CliError::from(call).exit, Exit::Engine);
        let insecure = ControlError::Engine(EngineError::Insecure {
            address: "10.0.0.1:7233".into(),
        });
        assert_eq!(CliError::from(insecure).exit, Exit::Usage);
    }
}
