//! How an attempt's Slurm job is named, so any worker replica finds it again: its name is the
//! attempt's name on a host (its marker made safe, and a hash of its directory), its comment
//! carries the marker and the attempt's directory, which `sandbox gc` reads back.

use casebatch_attempt::{Attempt, host_name};

/// Every casebatch job's name starts so; nothing else is touched by a sweep.
pub const JOB_PREFIX: &str = "casebatch-";

/// The Slurm job name of `a`'s attempt: the same for every submit and every worker.
pub fn job_name(a: &Attempt) -> String {
    format!("{JOB_PREFIX}{}", host_name(&a.marker(), &a.dir))
}

/// The job's comment: `casebatch <marker> <attempt directory>`.
pub fn comment(a: &Attempt) -> String {
    format!("casebatch {} {}", a.marker(), a.dir.display())
}
