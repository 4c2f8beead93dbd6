//! The collect stage's trace source: an HTTP endpoint the harness names in its result.

use std::path::Path;
use std::time::Duration;

use casebatch_bundle::TraceRef;
use casebatch_proto::{Failure, FailureCode, Stage};

const PULL_TIMEOUT: Duration = Duration::from_secs(15);

/// Pulls the trace and writes it to `dest`; a failure is `{collect, infra, retryable}`.
pub async fn collect(trace: &TraceRef, dest: &Path) -> Result<(), Failure> {
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
    let pulled = tokio::time::timeout(PULL_TIMEOUT, casebatch_http::request("GET", &trace.url, ""))
        .await
        .map_err(|_| fail(format!("no answer within {}s", PULL_TIMEOUT.as_secs())))?
        .map_err(|e| fail(e.to_string()))?;
    match pulled {
        // A temp file and a rename: never written through whatever the harness may have
        // planted at `dest` (a FIFO would block the write, a symlink would redirect it).
        (200, body) => {
            let dest = dest.to_path_buf();
            tokio::task::spawn_blocking(move || {
                casebatch_bundle::write_bytes_atomic(&dest, body.as_bytes())
            })
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))
        }
        (status, _) => Err(fail(format!("HTTP {status}"))),
    }
}
