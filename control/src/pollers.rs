//! Who polls the batches' workflow task queue: whether any worker could run a batch's workflow
//! (and answer its status query) at all. Asked of the engine (`DescribeTaskQueue`), which
//! keeps a poller listed for minutes after its process is gone: a poller on this host is
//! known gone at once when its process is, any other once it has not polled for longer than
//! a live one's long poll lasts.

use std::time::{Duration, SystemTime};

use casebatch_proto::TASK_QUEUE;
use temporalio_client::tonic;
use temporalio_common::protos::temporal::api::enums::v1::{TaskQueueKind, TaskQueueType};
use temporalio_common::protos::temporal::api::taskqueue::v1::{PollerInfo, TaskQueue};
use temporalio_common::protos::temporal::api::workflowservice::v1::DescribeTaskQueueRequest;

use crate::workflow::Handle;

/// A live worker polls again at least this often: a poll the server holds lasts about a
/// minute, and the next follows at once.
const POLLS_WITHIN: Duration = Duration::from_secs(90);

/// Whether any worker polls the batches' workflow task queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workers {
    /// One may: a poller that is not known gone.
    Polling,
    /// None: no poller, or every one is known gone (its process on this host has exited, or
    /// it stopped polling long ago).
    Gone,
    /// The engine did not say.
    Unknown,
}

/// The engine's pollers of the workflow task queue; `None` when it did not answer.
pub(crate) async fn pollers(handle: &Handle) -> Option<Vec<PollerInfo>> {
    let request = DescribeTaskQueueRequest {
        namespace: handle.info().namespace.clone(),
        task_queue: Some(TaskQueue {
            name: TASK_QUEUE.into(),
            kind: TaskQueueKind::Normal as i32,
            ..Default::default()
        }),
        task_queue_type: TaskQueueType::Workflow as i32,
        ..Default::default()
    };
    let described = handle
        .client()
        .connection()
        .workflow_service()
        .describe_task_queue(tonic::Request::new(request))
        .await;
    described.ok().map(|r| r.into_inner().pollers)
}

/// Whether any worker polls the batches' workflow task queue (see the module doc).
pub(crate) async fn workers(handle: &Handle) -> Workers {
    match pollers(handle).await {
        None => Workers::Unknown,
        Some(p) => {
            let host = casebatch_attempt::hostname();
            let now = SystemTime::now();
            if p.iter().all(|p| gone(p, &host, now, process_alive)) {
                Workers::Gone
            } else {
                Workers::Polling
            }
        }
    }
}

/// Whether pid `pid` of this host is alive: listed, and not a zombie (a killed runner whose
/// parent has not reaped it yet is dead all the same).
fn process_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name's closing parenthesis.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X'))
}

/// A poller is gone when its identity (the SDK's `pid@host`) names a process of this host
/// that has exited, or when it last polled longer ago than a live one would have.
fn gone(p: &PollerInfo, host: &str, now: SystemTime, alive: impl Fn(i32) -> bool) -> bool {
    let here = p
        .identity
        .split_once('@')
        .filter(|(_, h)| *h == host)
        .and_then(|(pid, _)| pid.parse::<i32>().ok());
    if let Some(pid) = here
        && !alive(pid)
    {
        return true;
    }
    let Some(at) = p.last_access_time.as_ref() else {
        return false;
    };
    let last = SystemTime::UNIX_EPOCH
        + Duration::new(
            u64::try_from(at.seconds).unwrap_or(0),
            u32::try_from(at.nanos).unwrap_or(0),
        );
    now.duration_since(last).is_ok_and(|d| d > POLLS_WITHIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poller(identity: &str, secs_ago: u64, now: SystemTime) -> PollerInfo {
        let since = (now - Duration::from_secs(secs_ago))
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        let mut p = PollerInfo {
            identity: identity.into(),
            ..Default::default()
        };
        // The timestamp's type is the protos' own: made from its default, not named.
        let mut at = p.last_access_time.take().unwrap_or_default();
        at.seconds = since.as_secs() as i64;
        at.nanos = since.subsec_nanos() as i32;
        p.last_access_time = Some(at);
        p
    }

    /// Issue 58: after a runner's SIGKILL its poller stays listed, and `batch status` waited
    /// 5 s for an answer no worker could give. A poller whose process here is gone is gone at
    /// once; another host's, once it stopped polling.
    #[test]
    fn a_poller_is_gone_when_its_process_here_exited_or_it_stopped_polling() {
        let now = SystemTime::now();
        let dead = |_: i32| false;
        let alive = |_: i32| true;
        assert!(gone(&poller("123@here", 5, now), "here", now, dead));
        assert!(!gone(&poller("123@here", 5, now), "here", now, alive));
        // Another host's process cannot be looked at: only its polls tell.
        assert!(!gone(&poller("123@there", 5, now), "here", now, dead));
        assert!(gone(&poller("123@there", 600, now), "here", now, alive));
        // An identity that is not `pid@host` (another SDK's): only its polls tell.
        assert!(!gone(&poller("my-worker", 5, now), "here", now, dead));
    }

    #[test]
    fn a_zombie_is_not_alive() {
        assert!(process_alive(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Exited but not reaped yet: a zombie until `wait`.
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"))
        {
            std::thread::yield_now();
        }
        assert!(!process_alive(pid));
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }
}
