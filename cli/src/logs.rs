//! What goes to stderr besides results: `RUST_LOG` (or the older `CASEBATCH_LOG`) picks what
//! is logged; `--log-format json` makes every line one JSON object (progress and warnings
//! included, so a collector parses stderr line by line); text is coloured only on a terminal.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line, with the span fields (batch, case, attempt).
    Json,
}

static JSON: AtomicBool = AtomicBool::new(false);

/// Whether stderr carries JSON lines only (set once, at start).
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Installs the subscriber. Without a filter in the environment, text shows warnings only;
/// JSON also carries casebatch's info events (stage transitions, progress), which is what a
/// log collector is for. chromiumoxide (the browser demo) warns about every DevTools event
/// newer than its bindings, so only its errors are shown.
pub fn init(format: LogFormat) {
    let fallback = match format {
        LogFormat::Text => "warn,temporalio_sdk_core=error,chromiumoxide=error",
        LogFormat::Json => "warn,casebatch=info,temporalio_sdk_core=error,chromiumoxide=error",
    };
    let filter = EnvFilter::try_from_env("RUST_LOG")
        .or_else(|_| EnvFilter::try_from_env("CASEBATCH_LOG"))
        .unwrap_or_else(|_| fallback.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => {
            JSON.store(true, Ordering::Relaxed);
            builder.json().with_current_span(true).init()
        }
    }
}
