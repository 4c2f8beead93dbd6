//! Connecting to Temporal and hosting the worker.
//!
//! Owns the engine target (the embedded dev server under the output root, or a cluster
//! named by flags or Temporal's own environment/profile settings: `TEMPORAL_ADDRESS`,
//! `TEMPORAL_NAMESPACE`, TLS, API key, `temporal.toml`), starting and finding the embedded
//! dev server, and building the worker that runs `BatchWorkflow` and `CaseActivities`.
//! Must not know about manifests or bundles beyond the paths it is given.

pub mod devserver;
pub mod engine;
pub mod keeper;
pub mod temporal_bin;
pub mod worker;

/// Where a worker serves its metrics and probes, and that listener once it serves.
pub use casebatch_telemetry::{Listen, Telemetry};
pub use devserver::{DevServer, DevServerError, EngineStatus, StopRefused};
pub use engine::{Engine, EngineError, EngineTarget};
pub use worker::{
    Workers, build_worker, host_served_until, host_until, run_worker_until, worker_runtime,
};
