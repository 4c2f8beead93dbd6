//! A local job's record in the attempt's journal: reading it (as the wrapper, an earlier
//! start or another worker left it), writing it, and what it says of where the attempt's
//! processes are (its cgroup, or its marker).

use casebatch_proto::{Failure, FailureCode, JobRef, Stage};

use crate::journal::Entry;
use crate::local::cgroup::Tracking;
use crate::local::procfs;
use crate::records::{JobEntry, JobRecord};
use crate::{Attempt, hostname};

pub fn submit_failure(msg: String) -> Failure {
    Failure::infra(Stage::Submit, FailureCode::SpawnFailed, msg)
}

/// The attempt's job record, if there is a usable one.
pub fn read_job(env: &Attempt) -> Option<JobRecord> {
    read_job_checked(env).ok().flatten()
}

/// `Err`: a job record is there but unusable (the journal replaced by the attempt's
/// processes, an I/O error, an entry of another runtime's shape): not the same as no record.
pub fn read_job_checked(env: &Attempt) -> Result<Option<JobRecord>, String> {
    let journal = env.journal().map_err(|e| e.to_string())?;
    match &journal.job {
        None => Ok(None),
        Some(JobEntry::Process(record)) => Ok(Some(record.clone())),
        Some(JobEntry::Simulated(_) | JobEntry::Scheduled(_)) => {
            Err("its job entry is another runtime's, not a process's".into())
        }
    }
}

/// The harness's exit status, once the wrapper has written it.
pub fn exit_status(env: &Attempt) -> Option<i32> {
    env.journal().ok()?.exit
}

/// Records the job (an intent, or its completion).
pub fn write_job(env: &Attempt, record: &JobRecord) -> Result<(), Failure> {
    env.record(&[Entry::Job(JobEntry::Process(record.clone()))])
        .map_err(|e| submit_failure(e.to_string()))
}

/// How many processes were started for the attempt (the job record's `starts`).
pub fn recorded_starts(env: &Attempt) -> Option<u32> {
    read_job(env).map(|r| r.starts)
}

/// The attempt's cgroup name: the same for every start and every worker, so it is found again.
pub fn cgroup_name(env: &Attempt) -> String {
    crate::host_name(&env.marker(), &env.dir)
}

/// How the attempt's processes are tracked: as its record says, or (no record) its cgroup
/// found by name; the marker scan only for attempts that have no cgroup.
pub fn tracking_of(env: &Attempt, job: Option<&JobRecord>) -> Tracking {
    match job {
        Some(j) => j.tracking.clone(),
        None => Tracking::find(&cgroup_name(env)).unwrap_or_default(),
    }
}

/// The attempt's live processes.
pub fn members(env: &Attempt, tracking: &Tracking) -> Vec<u32> {
    tracking
        .members()
        .unwrap_or_else(|| procfs::scan_marker(&env.process_marker()).marked)
}

/// The reference to a local job that the stages carry (and heartbeat).
pub fn job_ref(r: &JobRecord) -> JobRef {
    JobRef {
        marker: r.marker.clone(),
        pid: r.pid,
        start_ticks: r.start_ticks,
        host_queue: Some(casebatch_proto::host_task_queue(&hostname())),
        runtime: None,
        queued: false,
    }
}
