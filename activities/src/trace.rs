//! The collect stage's trace source: an HTTP endpoint the harness names in its result.

use std::path::Path;
use std::time::Duration;

use casebatch_bundle::TraceRef;
use casebatch_proto::{Failure, Stage};

/// Failure code of a trace pull; retry-failed re-collects these without re-running anything.
pub const TRACE_COLLECT_FAILED: &str = "TRACE_COLLECT_FAILED";
const PULL_TIMEOUT: Duration = Duration::from_secs(15);

/// Pulls the trace and writes it to `dest`; a failure is `{collect, infra, retryable}`.
pub async fn collect(trace: &TraceRef, dest: &Path) -> Result<(), Failure> {
    let fail = |why: String| {
        Failure::infra(
            Stage::Collect,
            TRACE_COLLECT_FAILED,
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
        (200, body) => {
            std::fs::write(dest, body).map_err(|e| fail(format!("write {}: {e}", dest.display())))
        }
        (status, _) => Err(fail(format!("HTTP {status}"))),
    }
}
