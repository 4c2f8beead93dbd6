//! The collect stage's trace source: an HTTP endpoint the harness names in its result.

use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use casebatch_bundle::TraceRef;
use casebatch_proto::{Failure, FailureCode, Stage};

use casebatch_attempt::files::{MAX_RESULT_BYTES_ENV, max_result_bytes};

const PULL_TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One client per worker process (it pools connections); it holds no policy beyond the
/// connect timeout: the pull's own limit and what a status means are decided below.
static CLIENT: LazyLock<Result<reqwest::Client, String>> = LazyLock::new(|| {
    // reqwest is built without a bundled crypto provider (see the workspace Cargo.toml): use
    // ring, unless something in this process installed a default already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .map_err(|e| format!("build the HTTP client: {}", error_chain(e)))
});

/// Pulls the trace and writes it to `dest`; a failure is `{collect, infra, retryable}`.
///
/// The body is kept byte for byte (a trace is often binary) and is refused past the worker's
/// result-file limit (`CASEBATCH_MAX_RESULT_BYTES`), so a trace server cannot exhaust the
/// worker's memory; a refused trace leaves no file.
pub async fn collect(trace: &TraceRef, dest: &Path) -> Result<(), Failure> {
    collect_within(trace, dest, max_result_bytes()).await
}

async fn collect_within(trace: &TraceRef, dest: &Path, limit: u64) -> Result<(), Failure> {
    let fail = |why: String| {
        Failure::infra(
            Stage::Collect,
            FailureCode::TraceCollectFailed,
            format!(
                "failed to collect the trace from {}: {why}; the work is kept, retry-failed collects it again",
                trace.url
            ),
        )
    };
    let body = tokio::time::timeout(PULL_TIMEOUT, pull(&trace.url, limit))
        .await
        .map_err(|_| fail(format!("no answer within {}s", PULL_TIMEOUT.as_secs())))?
        .map_err(fail)?;
    // A temp file and a rename: never written through whatever the harness may have
    // planted at `dest` (a FIFO would block the write, a symlink would redirect it).
    let dest = dest.to_path_buf();
    tokio::task::spawn_blocking(move || casebatch_bundle::write_bytes_atomic(&dest, &body))
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|e| fail(e.to_string()))
}

/// GETs `url` and returns its body as sent, if the status is 200 and the body fits in
/// `limit` bytes. The body is read chunk by chunk and the read stops at the limit, whether
/// or not the server declared a length.
async fn pull(url: &str, limit: u64) -> Result<Vec<u8>, String> {
    let client = CLIENT.as_ref().map_err(Clone::clone)?;
    let mut res = client
        .get(url)
        .send()
        .await
        .map_err(|e| error_chain(e.without_url()))?;
    let status = res.status().as_u16();
    if status != 200 {
        return Err(format!("HTTP {status}"));
    }
    let too_large = || {
        format!(
            "the trace is larger than the limit of {limit} bytes (worker setting {MAX_RESULT_BYTES_ENV})"
        )
    };
    if res.content_length().is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = res
        .chunk()
        .await
        .map_err(|e| format!("read the body: {}", error_chain(e.without_url())))?
    {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error and its causes, `outer: inner: ...` (reqwest's own message names only the outer).
fn error_chain(e: reqwest::Error) -> String {
    format!("{:#}", anyhow::Error::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::FailureClass;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A loopback HTTP/1.1 server that answers every connection with `response`, verbatim.
    async fn serve(response: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let response = response.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = conn.write_all(&response).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        format!("http://{addr}/trace.bin")
    }

    fn response(status: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    /// A body without a declared length: chunked transfer encoding, 64-byte chunks.
    fn chunked_response(body: &[u8]) -> Vec<u8> {
        let mut r =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
        for chunk in body.chunks(64) {
            r.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            r.extend_from_slice(chunk);
            r.extend_from_slice(b"\r\n");
        }
        r.extend_from_slice(b"0\r\n\r\n");
        r
    }

    /// Every byte value, several times over: not valid UTF-8, NULs included.
    fn binary_body() -> Vec<u8> {
        (0..4096u32).map(|i| (i % 256) as u8).collect()
    }

    fn assert_collect_failure(failure: &Failure, why: &str) {
        assert_eq!(failure.stage, Stage::Collect);
        assert_eq!(failure.class, FailureClass::Infra);
        assert_eq!(failure.code, FailureCode::TraceCollectFailed);
        assert!(failure.retryable);
        assert!(
            failure.message.contains(why),
            "{why:?} not in {:?}",
            failure.message
        );
    }

    #[tokio::test]
    async fn binary_trace_is_written_byte_for_byte() {
        let body = binary_body();
        for served in [response("200 OK", &body), chunked_response(&body)] {
            let dir = tempfile::tempdir().unwrap();
            let dest = dir.path().join("trace.bin");
            let trace = TraceRef {
                url: serve(served).await,
            };
            collect(&trace, &dest).await.unwrap();
            assert_eq!(std::fs::read(&dest).unwrap(), body);
        }
    }

    #[tokio::test]
    async fn trace_over_the_limit_is_refused_and_not_written() {
        let body = binary_body();
        let limit = body.len() as u64 - 1;
        // Declared too large up front, and discovered too large while reading.
        for served in [response("200 OK", &body), chunked_response(&body)] {
            let dir = tempfile::tempdir().unwrap();
            let dest = dir.path().join("trace.bin");
            let trace = TraceRef {
                url: serve(served).await,
            };
            let failure = collect_within(&trace, &dest, limit).await.unwrap_err();
            assert_collect_failure(&failure, "larger than the limit of 4095 bytes");
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        }
        // Exactly at the limit is fine.
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("trace.bin");
        let trace = TraceRef {
            url: serve(chunked_response(&body)).await,
        };
        collect_within(&trace, &dest, body.len() as u64)
            .await
            .unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), body);
    }

    #[tokio::test]
    async fn http_error_status_is_a_collect_failure() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("trace.bin");
        let trace = TraceRef {
            url: serve(response("500 Internal Server Error", b"boom")).await,
        };
        let failure = collect(&trace, &dest).await.unwrap_err();
        assert_collect_failure(&failure, "HTTP 500");
        assert!(!dest.exists());
    }

    #[tokio::test]
    async fn unreachable_server_is_a_collect_failure() {
        // Bound, then dropped: nothing listens on the port.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let dir = tempfile::tempdir().unwrap();
        let trace = TraceRef {
            url: format!("http://{addr}/trace.bin"),
        };
        let failure = collect(&trace, &dir.path().join("trace.bin"))
            .await
            .unwrap_err();
        assert_collect_failure(&failure, "connect");
    }
}
