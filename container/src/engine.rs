//! The connection to the container engine, and the few engine answers the runtime tells
//! apart: "no such container" (404) and "that name is taken" (409).

use bollard::Docker;
use bollard::errors::Error;
use bollard::models::ContainerInspectResponse;
use casebatch_proto::{Failure, FailureCode, Stage};
use tokio::sync::OnceCell;

/// Where the engine is: `DOCKER_HOST`, else the default socket.
pub fn address() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into())
}

/// A lazily made connection: a worker without any container case never dials the engine,
/// and a failed first dial is tried again by the next stage (nothing is cached but success).
#[derive(Default)]
pub struct Engine {
    docker: OnceCell<Docker>,
}

impl Engine {
    pub async fn get(&self, stage: Stage) -> Result<&Docker, Failure> {
        self.docker
            .get_or_try_init(connect)
            .await
            .map_err(|e| unreachable(stage, &e))
    }
}

/// Connects and agrees on an API version (podman's compatible service speaks an older one).
pub async fn connect() -> Result<Docker, Error> {
    Docker::connect_with_defaults()?.negotiate_version().await
}

/// The `/proc/<pid>/limits` of the engine's process, when it serves a unix socket on this
/// host (its pid from the socket's peer credentials); `None` otherwise.
pub fn process_limits() -> Option<String> {
    let path = address().strip_prefix("unix://")?.to_string();
    let stream = std::os::unix::net::UnixStream::connect(path).ok()?;
    let peer =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    std::fs::read_to_string(format!("/proc/{}/limits", peer.pid())).ok()
}

pub fn unreachable(stage: Stage, e: &Error) -> Failure {
    Failure::infra(
        stage,
        FailureCode::ContainerEngineUnreachable,
        format!(
            "the container engine at {} did not answer: {e} (start Docker or `podman system \
             service`, or point DOCKER_HOST at one)",
            address()
        ),
    )
}

pub fn status_of(e: &Error) -> Option<u16> {
    match e {
        Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The container named `name`, `None` when the engine does not know it.
pub async fn inspect(
    docker: &Docker,
    name: &str,
) -> Result<Option<ContainerInspectResponse>, Error> {
    match docker.inspect_container(name, None).await {
        Ok(c) => Ok(Some(c)),
        Err(e) if status_of(&e) == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs `work` to completion on a thread of its own with its own connection: for the
/// runtime's synchronous operations (`kill`), which may be called from inside an async
/// runtime, where a nested `block_on` would panic and a pooled connection may belong to a
/// runtime that is gone.
pub fn blocking<T: Send, F: std::future::Future<Output = T>>(
    work: impl FnOnce(Docker) -> F + Send,
) -> Option<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let docker = connect().await.ok()?;
                Some(work(docker).await)
            })
        })
        .join()
        .ok()
        .flatten()
    })
}
