//! The documented, stable exit codes, and the error type that carries one.

use std::fmt;

/// Exit codes (see the README): the only place they are defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every case succeeded (verified by its evaluator where one is configured).
    Success = 0,
    /// Drained or paused with queued work remaining: deliberately incomplete.
    Incomplete = 1,
    /// Usage or validation error; nothing was started or changed.
    Usage = 2,
    /// The engine could not be reached or started.
    Engine = 3,
    /// The batch finished with failed or mixed outcomes (all outputs still written).
    Failures = 4,
}

/// An error that knows its exit code. Messages read "failed to ..." and say what to do.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    pub fn usage(message: impl fmt::Display) -> Self {
        Self {
            exit: Exit::Usage,
            message: message.to_string(),
        }
    }
    pub fn engine(message: impl fmt::Display) -> Self {
        Self {
            exit: Exit::Engine,
            message: message.to_string(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<casebatch_bundle::BundleError> for CliError {
    fn from(e: casebatch_bundle::BundleError) -> Self {
        CliError::usage(e)
    }
}

impl From<casebatch_worker::EngineError> for CliError {
    fn from(e: casebatch_worker::EngineError) -> Self {
        match e {
            casebatch_worker::EngineError::Insecure { .. } => CliError::usage(e),
            other => CliError::engine(other),
        }
    }
}

pub type CliResult<T = Exit> = Result<T, CliError>;
