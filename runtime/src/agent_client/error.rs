//! What went wrong talking to an agent, classified once from the gRPC status, then turned
//! into casebatch's [`Failure`] for whichever stage asked.

use casebatch_proto::{Failure, FailureCode, Stage};
use tonic::{Code, Status};

use super::AgentTarget;

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
    /// Classifies a status `target` answered (or the channel produced) for `what`, a short
    /// description of the call ("submit of job K").
    pub fn from_status(target: &AgentTarget, what: &str, status: &Status) -> Self {
        let named = target.named();
        let said = status.message();
        if never_connected(status) {
            return AgentError::NoConnection(format!(
                "{named} is unreachable ({what}: {said}): no connection could be made; check \
                 that `casebatch agent` runs there and that this worker can reach it"
            ));
        }
        // A v2 agent refusing this worker's contract version says so itself (the agent's
        // `jobs::contract_refusal`): it names both versions and the side to upgrade.
        if status.code() == Code::FailedPrecondition && said.contains("speaks contract v") {
            return AgentError::Contract(format!("{named} refused the {what}: {said}"));
        }
        match status.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown => AgentError::Unreachable(format!(
                "{named} is unreachable ({what}: {said}): check that `casebatch agent` runs \
                 there and that this worker can reach it"
            )),
            Code::Unauthenticated | Code::PermissionDenied => {
                AgentError::Auth(match &target.token {
                    None => format!(
                        "{named} refused the call ({said}): it requires a bearer token and none is \
                     configured; set token_env or token_file in runtimes.{}",
                        target.name
                    ),
                    Some(source) => format!(
                        "{named} refused the token read from {} ({said}): set the agent's token \
                     there",
                        source.describe()
                    ),
                })
            }
            Code::ResourceExhausted => {
                AgentError::Full(format!("{named} is full ({what}): {said}"))
            }
            Code::NotFound => {
                AgentError::NotFound(format!("{named} has no such job ({what}): {said}"))
            }
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::OutOfRange
            | Code::Unimplemented => AgentError::Refused(format!(
                "{named} refused the {what} ({:?}): {said}",
                status.code()
            )),
            Code::Ok | Code::Internal | Code::DataLoss => AgentError::Failed(format!(
                "{named} failed the {what} ({:?}): {said}",
                status.code()
            )),
        }
    }

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

/// Whether the transport never made a connection (refused, no route, address unusable): the
/// cause is an I/O error of the connect itself, somewhere in the status's source chain.
fn never_connected(status: &Status) -> bool {
    use std::io::ErrorKind::{
        AddrNotAvailable, ConnectionRefused, HostUnreachable, NetworkUnreachable,
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ConnectionRefused | HostUnreachable | NetworkUnreachable | AddrNotAvailable
            )
        {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::FailureClass;
    use casebatch_proto::token::TokenSource;

    fn target(token: Option<TokenSource>) -> AgentTarget {
        AgentTarget {
            name: "gpu".into(),
            endpoint: "https://agent.example:7070".into(),
            token,
            tls_ca: None,
            unreachable_grace: None,
        }
    }

    fn failure(token: Option<TokenSource>, status: Status) -> Failure {
        AgentError::from_status(&target(token), "submit of job b/0/1", &status)
            .failure(Stage::Submit)
    }

    #[test]
    fn statuses_map_to_the_taxonomy() {
        let none = || None;
        let f = failure(none(), Status::unavailable("tcp connect error"));
        assert_eq!(
            (f.class, f.code.clone(), f.retryable),
            (FailureClass::Infra, FailureCode::RuntimeUnreachable, true)
        );
        assert!(
            f.message
                .contains("runtime `gpu` at https://agent.example:7070"),
            "{}",
            f.message
        );
        assert!(f.message.contains("tcp connect error"), "{}", f.message);

        let f = failure(none(), Status::resource_exhausted("4 of 4 jobs in flight"));
        assert_eq!(
            (f.class, f.code.clone(), f.retryable),
            (FailureClass::Infra, FailureCode::RuntimeFull, true)
        );
        assert!(f.message.contains("4 of 4 jobs in flight"), "{}", f.message);

        let f = failure(none(), Status::not_found("no job b/0/1"));
        assert_eq!(
            (f.class, f.code.clone()),
            (FailureClass::Infra, FailureCode::JobLost)
        );

        let f = failure(
            none(),
            Status::invalid_argument("planned case: missing field"),
        );
        assert_eq!(
            (f.class, f.code.clone(), f.retryable),
            (FailureClass::Config, FailureCode::SpawnFailed, false)
        );

        let f = failure(none(), Status::internal("database is locked"));
        assert_eq!(
            (f.class, f.code.clone(), f.retryable),
            (FailureClass::Infra, FailureCode::ActivityError, true)
        );
    }

    #[test]
    fn an_auth_refusal_names_the_runtime_endpoint_and_token_source() {
        let f = failure(
            Some(TokenSource::Env("CASEBATCH_AGENT_TOKEN".into())),
            Status::unauthenticated("wrong bearer token"),
        );
        assert_eq!(
            (f.class, f.code.clone(), f.retryable),
            (FailureClass::Config, FailureCode::RuntimeAuth, false)
        );
        for part in [
            "runtime `gpu`",
            "https://agent.example:7070",
            "$CASEBATCH_AGENT_TOKEN",
        ] {
            assert!(
                f.message.contains(part),
                "{part} missing from {}",
                f.message
            );
        }
        let f = failure(
            Some(TokenSource::File("/run/secrets/agent".into())),
            Status::unauthenticated("wrong bearer token"),
        );
        assert!(
            f.message.contains("file /run/secrets/agent"),
            "{}",
            f.message
        );
        let f = failure(None, Status::unauthenticated("missing bearer token"));
        assert!(f.message.contains("none is configured"), "{}", f.message);
        assert!(f.message.contains("runtimes.gpu"), "{}", f.message);
    }
}
