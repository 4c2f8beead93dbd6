//! Stage activities and the runtimes behind them: all I/O of a case lives here.
//!
//! Owns provisioning attempt directories, starting and awaiting harness processes
//! (`local-process`) or simulating them (`fake`), running evaluators, cleanup with receipts,
//! and writing each attempt's evidence into the bundle. Must not decide retries or ordering:
//! that is the workflow's job (`casebatch-workflows`).

pub mod attempt_io;
mod case_activities;
pub mod case_env;
pub mod evaluator;
pub mod harness;
pub mod memlimit;
pub mod procfs;
pub mod runtime;
pub mod trace;

pub use case_activities::CaseActivities;
