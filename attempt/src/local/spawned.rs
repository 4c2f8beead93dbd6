//! The processes this process spawned for attempts (harness wrappers, evaluators), each named
//! by pid and start time, with the marker it was given: a walk of `/proc`
//! ([`crate::local::procfs::walk`]) tells another case's processes by their ancestry instead of
//! reading their environment.
//!
//! Why: a cleanup's scan for escaped processes read the environment of every process younger
//! than its job, and in a batch of short cases those are the other cases' wrappers and
//! harnesses; reading another process's environment goes through its memory, and those reads
//! were half of what a one-second case cost this process. A child inherits its parent's
//! environment at fork, so a wrapper's descendants carry its marker unless one of them rewrites
//! its own environment to carry another case's, which nothing of ours does and which the scan
//! does not defend against (a process can as well drop the marker; the cgroup is the boundary).
//!
//! Entries end when a walk no longer finds their process: nothing has to report a wrapper's end.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::local::kernel::Stat;

/// How far up its ancestry a process is followed to a wrapper: a harness's process tree is
/// rarely more than a few levels deep, and a deeper one is only read, not passed over.
const MAX_DEPTH: usize = 32;

#[derive(Default)]
struct Registry {
    /// Bumped by every record; a walk forgets only what was recorded before it looked.
    recorded: u64,
    by_pid: HashMap<u32, Entry>,
}

#[derive(Clone)]
struct Entry {
    start_ticks: u64,
    marker: Arc<str>,
    recorded: u64,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// Records a process (a wrapper, an evaluator) this process just spawned with `marker` in its
/// environment.
pub fn record(pid: u32, start_ticks: u64, marker: &str) {
    let mut registry = REGISTRY.lock().expect("spawned wrappers");
    registry.recorded += 1;
    let entry = Entry {
        start_ticks,
        marker: marker.into(),
        recorded: registry.recorded,
    };
    registry.by_pid.insert(pid, entry);
}

/// The wrappers known when a walk began.
pub(crate) struct Known {
    by_pid: HashMap<u32, Entry>,
    as_of: u64,
}

/// What the registry holds now; taken before the walk lists `/proc`.
pub(crate) fn known() -> Known {
    let registry = REGISTRY.lock().expect("spawned wrappers");
    Known {
        by_pid: registry.by_pid.clone(),
        as_of: registry.recorded,
    }
}

impl Known {
    /// The marker `pid` carries by inheritance: that of the nearest of its ancestors (itself
    /// included) that is one of this process's wrappers, each known by its stat in this walk.
    /// `None` when no ancestor within reach is (its environment must be read).
    pub(crate) fn inherited(&self, pid: u32, stats: &HashMap<u32, Stat>) -> Option<&str> {
        if self.by_pid.is_empty() {
            return None;
        }
        let mut at = pid;
        for _ in 0..MAX_DEPTH {
            let stat = stats.get(&at)?;
            if let Some(wrapper) = self.by_pid.get(&at)
                && wrapper.start_ticks == stat.start_ticks
            {
                return Some(&wrapper.marker);
            }
            if stat.ppid == 0 || stat.ppid == at {
                return None;
            }
            at = stat.ppid;
        }
        None
    }

    /// Forgets the wrappers known before this walk that it did not find: gone, their pid
    /// free for another process.
    pub(crate) fn forget_gone(&self, stats: &HashMap<u32, Stat>) {
        let mut registry = REGISTRY.lock().expect("spawned wrappers");
        registry.by_pid.retain(|pid, entry| {
            entry.recorded > self.as_of
                || stats
                    .get(pid)
                    .is_some_and(|s| s.start_ticks == entry.start_ticks)
        });
    }
}

/// Whether the registry holds a wrapper at `pid`.
#[cfg(test)]
pub(crate) fn holds(pid: u32) -> bool {
    REGISTRY
        .lock()
        .expect("spawned wrappers")
        .by_pid
        .contains_key(&pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(ppid: u32, start_ticks: u64) -> Stat {
        Stat {
            state: b'S',
            ppid,
            pgrp: 0,
            flags: 0,
            start_ticks,
        }
    }

    fn known(wrappers: &[(u32, u64, &str)]) -> Known {
        Known {
            by_pid: wrappers
                .iter()
                .map(|&(pid, start_ticks, marker)| {
                    let entry = Entry {
                        start_ticks,
                        marker: marker.into(),
                        recorded: 0,
                    };
                    (pid, entry)
                })
                .collect(),
            as_of: 0,
        }
    }

    #[test]
    fn a_wrappers_descendants_carry_its_marker_and_a_recycled_pid_is_nobodys() {
        let known = known(&[(10, 500, "case-a")]);
        let stats: HashMap<u32, Stat> = [
            (1, stat(0, 1)),
            (10, stat(1, 500)),
            (11, stat(10, 501)),
            (12, stat(11, 502)),
            // Reparented to init when its parent ended: nobody's by ancestry.
            (13, stat(1, 503)),
        ]
        .into();
        assert_eq!(known.inherited(10, &stats), Some("case-a"));
        assert_eq!(known.inherited(12, &stats), Some("case-a"));
        assert_eq!(known.inherited(13, &stats), None);
        assert_eq!(known.inherited(99, &stats), None);

        // Pid 10 now belongs to another process (another start time): not the wrapper.
        let recycled: HashMap<u32, Stat> = [(10, stat(1, 900)), (11, stat(10, 901))].into();
        assert_eq!(known.inherited(11, &recycled), None);
    }

    #[test]
    fn a_parent_cycle_in_a_torn_read_ends() {
        let known = known(&[(10, 500, "case-a")]);
        let stats: HashMap<u32, Stat> = [(20, stat(21, 1)), (21, stat(20, 2))].into();
        assert_eq!(known.inherited(20, &stats), None);
    }
}
