//! What went wrong talking to an agent, classified once from the gRPC status, then turned
//! into casebatch's [`Failure`] for whichever stage asked.

use casebatch_proto::{Failure, FailureCode, Stage};

/// A call to an agent that did not give an answer to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The runtimes-table entry cannot be used as it is (endpoint, TLS CA).
    #[error("{0}")]
    Config(String),
    /// No usable token, or the agent refused it (UNAUTHENTICATED / PERMISSION_DENIED).
    #[error("{0}")]
    Auth(String),
    /// No connection, a broken stream, a restarting agent (UNAVAILABLE and kin).
    #[error("{0}")]
    Unreachable(String),
    /// No connection could be made at all (refused, no route): the request never reached
    /// the agent, so nothing of it can run there.
    #[error("{0}")]
    NoConnection(String),
    /// The agent's envelope is full (RESOURCE_EXHAUSTED): a slot frees when a job ends.
    #[error("{0}")]
    Full(String),
    /// The agent has no job under the key (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The agent refused the request itself (a malformed case, a key of another bundle):
    /// sending it again changes nothing.
    #[error("{0}")]
    Refused(String),
    /// Any other error the agent answered with (INTERNAL, ...): possibly transient.
    #[error("{0}")]
    Failed(String),
    /// The agent speaks another version of the runtime contract: nothing sent to it can work
    /// until one side is upgraded (the message says which).
    #[error("{0}")]
    Contract(String),
}

impl AgentError {
    /// Worth trying again within the unreachability grace.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AgentError::Unreachable(_) | AgentError::NoConnection(_) | AgentError::Failed(_)
        )
    }

    /// The request may have reached the agent and been acted on without an answer coming
    /// back (a call that timed out or broke off, an internal error). A refusal, a full
    /// envelope or a connection never made says the agent did nothing with it.
    pub fn may_have_reached(&self) -> bool {
        matches!(self, AgentError::Unreachable(_) | AgentError::Failed(_))
    }

    pub fn message(&self) -> &str {
        match self {
            AgentError::Config(m)
            | AgentError::Auth(m)
            | AgentError::Unreachable(m)
            | AgentError::NoConnection(m)
            | AgentError::Full(m)
            | AgentError::NotFound(m)
            | AgentError::Refused(m)
            | AgentError::Failed(m)
            | AgentError::Contract(m) => m,
        }
    }

    /// The failure of `stage` this error stands for.
    pub fn failure(&self, stage: Stage) -> Failure {
        let m = self.message().to_string();
        match self {
            AgentError::Config(_) => Failure::config(stage, FailureCode::RuntimeUnreachable, m),
            AgentError::Auth(_) => Failure::config(stage, FailureCode::RuntimeAuth, m),
            AgentError::Unreachable(_) | AgentError::NoConnection(_) => {
                Failure::infra(stage, FailureCode::RuntimeUnreachable, m)
            }
            AgentError::Full(_) => Failure::infra(stage, FailureCode::RuntimeFull, m),
            AgentError::NotFound(_) => Failure::infra(stage, FailureCode::JobLost, m),
            // The job cannot start as sent: the same submit fails the same way.
            AgentError::Refused(_) => Failure::config(stage, FailureCode::SpawnFailed, m),
            AgentError::Failed(_) => Failure::infra(stage, FailureCode::ActivityError, m),
            AgentError::Contract(_) => Failure::config(stage, FailureCode::RuntimeContract, m),
        }
    }
}
