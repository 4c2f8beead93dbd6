//! What operators scrape from a worker: one listener (`--metrics-bind`) serving
//!
//! - `/metrics`: the Temporal SDK's worker metrics (its Prometheus exporter) and casebatch's
//!   own instruments ([`Metrics`]), recorded through the same meter, in one text exposition;
//! - `/healthz`: the process serves (liveness);
//! - `/readyz`: connected to the engine and polling its task queues (readiness).
//!
//! The SDK's exporter owns its registry and its own HTTP server; that server listens on an
//! ephemeral loopback port, and this listener forwards `/metrics` to it, so there is one
//! address to probe and scrape. A process without a Temporal worker (the agent) serves the
//! same three endpoints with a `/metrics` body it renders itself ([`serve_rendered`]).

mod metrics;
mod probes;

pub use metrics::{AttemptEnd, Awaiting, Metrics};
pub use probes::{
    Listen, Readiness, Render, Telemetry, check, is_loopback, read_address, serve_rendered,
};
