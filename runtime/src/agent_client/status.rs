//! An agent's answer classified: a gRPC status (or what the channel produced) into the
//! [`AgentError`] it means, worded with the runtime it came from.

use tonic::{Code, Status};

use super::error::AgentError;
use super::target::AgentTarget;

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
    use casebatch_proto::token::TokenSource;
    use casebatch_proto::{Failure, FailureClass, FailureCode, Stage};

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
