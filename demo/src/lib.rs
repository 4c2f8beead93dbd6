//! The local web demo from the batch tutorial: three real web tasks on loopback.
//!
//! Owns the fixture web app (one page per task; every page action is a receipt appended
//! durably to `events.jsonl`), the web actor (opens its task page, writes a note, clicks)
//! and the evaluator (checks through the fixture that *its own attempt's* click receipt
//! exists: it observes the effect and never trusts the actor's word). The actor and the
//! evaluator are harness commands (`casebatch harness web-demo | web-demo-eval`) that follow
//! the harness contract. Knows nothing of Temporal or the engine.

pub mod actor;
pub mod browser;
pub mod browser_actor;
pub mod fixture;
mod harness_io;

pub use fixture::{Fixture, FixtureOptions, MANIFEST_BATCH_ID};

/// Errors of the demo, each saying what failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("failed to {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to {0}")]
    Other(String),
}

impl DemoError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| DemoError::Io { what, source }
    }
}
