//! Where an attempt's files live: its directory under a bundle (or an agent's own
//! directory), and the names of the files in it. The bundle's layout places attempts here.

use std::path::{Path, PathBuf};

/// `<root>/cases/<case_dir>/attempts/<n>`: an attempt's directory under a bundle's root (or
/// an agent's directory, which lays its jobs out the same way).
pub fn attempt_dir(root: &Path, case_dir: &str, attempt: u32) -> PathBuf {
    root.join("cases")
        .join(case_dir)
        .join("attempts")
        .join(attempt.to_string())
}

/// `<root>/events.jsonl`: the timeline of the batch whose attempts are under `root`.
pub fn events_file(root: &Path) -> PathBuf {
    root.join("events.jsonl")
}

/// Files inside one attempt directory.
pub mod attempt_files {
    /// Everything the engine records about the attempt, one entry per line
    /// ([`crate::journal`]): spec, job, timings, evaluation, cleanup receipt, the record.
    pub const JOURNAL: &str = "attempt.jsonl";
    /// Written by the harness (`CASEBATCH_RESULT`).
    pub const RESULT: &str = "result.json";
    pub const STDOUT: &str = "stdout.log";
    pub const STDERR: &str = "stderr.log";
    /// The trace pulled by the collect stage.
    pub const TRACE: &str = "trace.json";
    pub const OUTPUT: &str = "output";
    /// A container's working directory and input, inside the attempt directory it mounts
    /// (a local process has both in its scratch directory, outside the bundle).
    pub const WORKDIR: &str = "work";
    pub const INPUT: &str = "input.json";
    pub const EVAL_STDOUT: &str = "evaluator.stdout.log";
    pub const EVAL_STDERR: &str = "evaluator.stderr.log";
    pub const EVAL_RESULT: &str = "evaluator_result.json";

    /// The files an attempt kept before its records moved into [`JOURNAL`]: still read in
    /// older bundles (and for jobs older workers started).
    pub mod legacy {
        pub const SPEC: &str = "spec.json";
        pub const EVALUATION: &str = "evaluation.json";
        pub const CLEANUP: &str = "cleanup.json";
        pub const PREPARED: &str = "prepared.json";
        pub const RECORD: &str = "attempt.json";
        pub const STAGES: &str = "stages.jsonl";
        /// The runtime's job record; also the name an agent streams its job record under.
        pub const JOB: &str = "job.json";
        pub const CONTAINER: &str = "container.json";
        pub const EXIT: &str = "exit_status";
        pub const WRAPPER_PID: &str = "wrapper.pid";
    }
}
