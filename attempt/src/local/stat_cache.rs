//! The processes on this host with their stats, reusing what earlier walks of `/proc` read
//! for any pid that cannot have been handed to another process since.
//!
//! Why: a walk reads the stat of every process on the host, and in a wide batch of short
//! cases nearly all of them are the other cases' processes, read by the walk a few
//! milliseconds before. Those reads were a quarter of what a one-second case cost the runner.
//! What a walk takes from a stat (start time, kernel-thread flag) never changes for a
//! process; its parent changes only when the parent dies, which the walk sees as a parent
//! missing from `/proc` either way.
//!
//! Soundness: the kernel hands out pids cyclically, each the next free one after the last
//! (`ns_last_pid`). A pid that two walks both list names the same process in both unless the
//! pid was handed out again in between: then it lies between where the allocator stood
//! before the first walk listed `/proc` and where it stood after the second did, and it is
//! read again. Going once around the whole range takes at least as many forks as there are
//! free pids, so the cache is also dropped when the forks between the two walks
//! (`processes` in `/proc/stat`, every task the kernel created, threads included) reach a
//! quarter of `pid_max`: that is sound unless three quarters of all pids are in use. When
//! any of these figures cannot be read, every stat is read.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use crate::local::kernel::Stat;

/// Where the pid allocator stood at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allocator {
    /// The last pid handed out in this pid namespace.
    pub(crate) last_pid: u32,
    /// Tasks created since boot, in every namespace.
    pub(crate) forks: u64,
}

impl Allocator {
    fn read() -> Option<Self> {
        Some(Self {
            last_pid: read_number("/proc/sys/kernel/ns_last_pid")?,
            forks: forks_since_boot()?,
        })
    }
}

/// The stats the previous walk ended with, and where the allocator stood before that walk
/// listed `/proc`.
#[derive(Debug, Default)]
pub(crate) struct StatCache {
    previous_listing: Option<Allocator>,
    stats: HashMap<u32, Stat>,
}

static CACHE: LazyLock<Mutex<StatCache>> = LazyLock::new(Mutex::default);

/// Every process in `/proc` but `skip`, in listing order, and the stat of each that is still
/// there; `None` when `/proc` cannot be listed.
pub(crate) fn processes(skip: u32) -> Option<(Vec<u32>, HashMap<u32, Stat>)> {
    // One walk at a time: each starts from where the previous one left the allocator.
    let mut cache = CACHE.lock().expect("stat cache");
    let before = Allocator::read();
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != skip)
        .collect();
    let after = Allocator::read();
    let pid_max = read_number("/proc/sys/kernel/pid_max");
    let stats = cache.refresh(&pids, before, after, pid_max, crate::local::kernel::stat);
    Some((pids, stats))
}

/// Tasks the kernel has created since boot.
fn forks_since_boot() -> Option<u64> {
    let text = crate::local::kernel::read_generated_text("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("processes "))?
        .trim()
        .parse()
        .ok()
}

fn read_number<N: std::str::FromStr>(path: &str) -> Option<N> {
    crate::local::kernel::read_generated_text(path)
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl StatCache {
    /// The stats of `pids`, listed between the allocator readings `before` and `after`.
    fn refresh(
        &mut self,
        pids: &[u32],
        before: Option<Allocator>,
        after: Option<Allocator>,
        pid_max: Option<u64>,
        read: impl Fn(u32) -> Option<Stat>,
    ) -> HashMap<u32, Stat> {
        let handed_out = match (self.previous_listing.take(), after, pid_max) {
            (Some(then), Some(now), Some(max))
                if now.forks.saturating_sub(then.forks) < max / 4 =>
            {
                Some((then.last_pid, now.last_pid))
            }
            _ => None,
        };
        let mut now = HashMap::with_capacity(pids.len());
        for &pid in pids {
            let kept = self
                .stats
                .get(&pid)
                .filter(|_| handed_out.is_some_and(|(from, to)| !between_cyclic(pid, from, to)));
            if let Some(stat) = kept.copied().or_else(|| read(pid)) {
                now.insert(pid, stat);
            }
        }
        // What is not listed any more has ended: its pid is free, so its stat is dropped.
        self.stats.clone_from(&now);
        self.previous_listing = before;
        now
    }
}

/// Whether `pid` was handed out by an allocator that moved from `from` to `to`: in
/// `(from, to]`, wrapping around at the top of the range.
fn between_cyclic(pid: u32, from: u32, to: u32) -> bool {
    if from <= to {
        from < pid && pid <= to
    } else {
        pid > from || pid <= to
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    fn stat(start_ticks: u64) -> Stat {
        Stat {
            state: b'S',
            ppid: 1,
            pgrp: 1,
            flags: 0,
            start_ticks,
        }
    }

    fn at(last_pid: u32, forks: u64) -> Option<Allocator> {
        Some(Allocator { last_pid, forks })
    }

    const PID_MAX: Option<u64> = Some(32_768);

    /// Reads pid × 10 as the start time (none for pid 404, gone) and records which pids it
    /// read.
    #[derive(Default)]
    struct Reads(RefCell<Vec<u32>>);

    impl Reads {
        fn read(&self, pid: u32) -> Option<Stat> {
            self.0.borrow_mut().push(pid);
            (pid != 404).then(|| stat(u64::from(pid) * 10))
        }
        fn take(&self) -> Vec<u32> {
            std::mem::take(&mut self.0.borrow_mut())
        }
    }

    #[test]
    fn a_walk_reads_only_the_pids_handed_out_since_the_last_one_listed() {
        let (reads, mut cache) = (Reads::default(), StatCache::default());
        let mut walk = |pids: &[u32], allocator| {
            let got = cache.refresh(pids, allocator, allocator, PID_MAX, |p| reads.read(p));
            (reads.take(), got)
        };
        let (read, got) = walk(&[400, 32_000, 32_750, 404], at(32_700, 10));
        assert_eq!(
            read,
            vec![400, 32_000, 32_750, 404],
            "a first walk reads all"
        );
        assert_eq!(got.len(), 3, "a pid gone before its read has no stat");
        // The allocator moved from 32,700 to 32,720: 32,710 is new, the rest the same.
        let (read, got) = walk(&[400, 32_000, 32_710, 32_750], at(32_720, 30));
        assert_eq!(read, vec![32_710]);
        assert_eq!(got[&32_000], stat(320_000));
        // It wrapped around to 320: 310 is new, and 32,750 may have ended and been handed
        // out again; 400, 32,000 and 32,710 were not in its way.
        let (read, _) = walk(&[310, 400, 32_000, 32_710, 32_750], at(320, 130));
        assert_eq!(read, vec![310, 32_750]);
    }

    #[test]
    fn a_pid_handed_out_while_the_last_walk_listed_is_read_again() {
        let (reads, mut cache) = (Reads::default(), StatCache::default());
        // The allocator moved 500 → 505 while this walk listed: 503 may have been listed as
        // one process and read as the next. The next walk counts from 500.
        cache.refresh(&[503], at(500, 10), at(505, 15), PID_MAX, |p| reads.read(p));
        reads.take();
        cache.refresh(&[503], at(505, 15), at(505, 15), PID_MAX, |p| reads.read(p));
        assert_eq!(reads.take(), vec![503]);
        cache.refresh(&[503], at(505, 15), at(505, 15), PID_MAX, |p| reads.read(p));
        assert!(reads.take().is_empty(), "and then it is kept");
    }

    #[test]
    fn every_stat_is_read_again_once_the_allocator_could_have_gone_around() {
        let (reads, mut cache) = (Reads::default(), StatCache::default());
        cache.refresh(&[100, 200], at(500, 1_000), at(500, 1_000), PID_MAX, |p| {
            reads.read(p)
        });
        reads.take();
        // The allocator stands where it stood, but a quarter of pid_max forks happened.
        cache.refresh(&[100, 200], at(500, 9_192), at(500, 9_192), PID_MAX, |p| {
            reads.read(p)
        });
        assert_eq!(reads.take(), vec![100, 200]);
        cache.refresh(
            &[100, 200],
            at(500, 17_383),
            at(500, 17_383),
            PID_MAX,
            |p| reads.read(p),
        );
        assert!(reads.take().is_empty(), "one fork fewer: kept");
    }

    #[test]
    fn without_a_reading_of_the_allocator_nothing_is_kept() {
        let (reads, mut cache) = (Reads::default(), StatCache::default());
        let steps = [
            (at(5, 5), at(5, 5), PID_MAX, vec![7, 8]),
            // After listing: unknown.
            (at(5, 5), None, PID_MAX, vec![7, 8]),
            // No pid_max.
            (None, at(5, 5), None, vec![7, 8]),
            // The walk before had no reading before it listed.
            (at(5, 5), at(5, 5), PID_MAX, vec![7, 8]),
            (at(5, 5), at(5, 5), PID_MAX, vec![]),
        ];
        for (step, (before, after, max, read)) in steps.into_iter().enumerate() {
            cache.refresh(&[7, 8], before, after, max, |p| reads.read(p));
            assert_eq!(reads.take(), read, "step {step}");
        }
    }

    #[test]
    fn this_hosts_allocator_is_read_and_moves_with_a_fork() {
        let before = Allocator::read().expect("ns_last_pid and /proc/stat are readable");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let after = Allocator::read().unwrap();
        child.wait().unwrap();
        assert!(after.forks > before.forks);
        assert!(
            between_cyclic(child.id(), before.last_pid, after.last_pid),
            "{} in ({}, {}]",
            child.id(),
            before.last_pid,
            after.last_pid
        );
        assert!(read_number::<u64>("/proc/sys/kernel/pid_max").is_some_and(|m| m >= 300));
    }
}
