//! Integration tests: the real `casebatch` binary, a real Temporal dev server (started by the
//! binary itself, as users get it), real child processes and real files. Side effects are
//! counted by lines the harnesses append, so "ran twice" cannot hide.

mod support;

mod agent;
mod agent_batches;
mod browser_demo;
mod budget;
mod case_view;
mod chaos_kills;
mod cleanup;
mod clocks;
mod containers;
mod demo;
mod deploy_files;
mod engine;
mod environment;
mod evaluator;
mod fair_share;
mod full_disk;
mod json_views;
mod lifecycle;
mod logs;
mod metrics;
mod preflight;
mod prepare_ahead;
mod rate_limits;
mod recovery;
mod replicas;
mod reports;
mod result_files;
mod retry;
mod sdk_start;
mod shared_cluster;
mod slurm;
mod snapshots;
mod stalls;
mod submit_window;
mod taxonomy;
mod unreadable_bundle;
mod unwritable_bundle;
mod validation;
mod visibility;
mod width;
