//! Stage activities: the Temporal side of a case's I/O.
//!
//! Implements the stage contracts of `casebatch-workflows` (`registry.rs`) over the executors
//! `casebatch-runtime` picks: provisioning attempt directories, submitting and awaiting jobs,
//! having the runtime evaluate them, pulling traces, cleanup with receipts, and writing each attempt's
//! evidence into the bundle, and consulting and reporting to the runtimes' shared circuit
//! breakers (`breakers.rs`) for cases routed over a runtime list, and booking starts on shared
//! paces (`pacers.rs`, for `rate_key`). Must not decide retries or ordering: that is the workflow's job.

mod batch;
mod beats;
mod breakers;
mod case;
mod pacers;
mod registry;
mod shared_workflows;
mod slots;
mod timings;
pub mod trace;

pub use case::context::{CaseActivities, Stopping};
