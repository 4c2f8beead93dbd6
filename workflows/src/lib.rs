//! Deterministic workflow code: the `BatchWorkflow` and the per-case stage pipeline.
//!
//! Owns admission (bounded concurrency, drain, pause, cancel), the order of stages for each
//! case, retry decisions from the failure taxonomy, the progress timeline and
//! continue-as-new. It must not do I/O, read the wall clock or use randomness other than the
//! SDK's: everything that touches the world is an activity, declared here only as a contract
//! ([`contracts`]) and implemented in `casebatch-activities`.

mod admission;
pub mod batch;
pub mod breaker;
mod case;
mod circuits;
pub mod contracts;
pub mod decide;
mod envelopes;
pub mod fair_share;
mod lifecycle;
pub mod pace;
mod rate_limited;
pub mod rate_pacer;
mod runtime_share;
pub mod runtime_slots;
mod shared;
mod tail;
mod visibility;

pub use batch::BatchWorkflow;
pub use breaker::RuntimeBreaker;
pub use rate_pacer::RatePacer;
pub use runtime_slots::RuntimeSlots;
