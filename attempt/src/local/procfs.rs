//! Process identity from `/proc`: a process is named by pid *and* start time, and an
//! attempt's processes are found by the allocation marker they inherit in their environment.
//! Nothing is ever signalled on the strength of a pid read from old state alone.

use std::fs;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::local::kernel::{read_generated, read_generated_text, stat};

/// Environment variable carrying the allocation marker into every process of an attempt.
pub const MARKER_ENV: &str = "CASEBATCH_ALLOC_MARKER";

/// Start time of a process in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.start_ticks)
}

/// Process group of a process (field 5 of `/proc/<pid>/stat`).
pub fn process_group(pid: u32) -> Option<u32> {
    stat(pid).map(|s| s.pgrp)
}

/// True when `pid` names a live process (not a zombie).
pub fn is_alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.is_alive())
}

/// True when `pid` is alive and is the same process that had `ticks` as its start time.
pub fn is_same_process(pid: u32, ticks: u64) -> bool {
    stat(pid).is_some_and(|s| s.start_ticks == ticks && s.is_alive())
}

/// A process named by pid and start time (a recycled pid has another start time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessId {
    pub pid: u32,
    pub start_ticks: u64,
}

impl ProcessId {
    /// The process `pid` is now, if it is running.
    pub fn of(pid: u32) -> Option<Self> {
        Some(Self {
            pid,
            start_ticks: start_ticks(pid)?,
        })
    }

    /// This very process.
    pub fn this() -> Option<Self> {
        Self::of(std::process::id())
    }

    /// Alive, and still the same process.
    pub fn is_alive(&self) -> bool {
        is_same_process(self.pid, self.start_ticks)
    }
}

/// What a scan for marked processes found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MarkerScan {
    /// Live processes whose environment carries the marker.
    pub marked: Vec<u32>,
    /// Processes whose environment could not be read (they may carry the marker).
    pub unreadable: Vec<u32>,
}

/// Finds every live process whose environment carries `MARKER_ENV=marker`, including ones
/// that detached (setsid, double fork) and so left the process group. A process whose
/// environment cannot be read counts as `unreadable` only if it appeared at or after
/// `since_ticks` (the attempt's start): older processes cannot be its descendants.
pub fn scan_marker(marker: &str) -> MarkerScan {
    scan_marker_since(marker, None)
}

/// The same, looking only at processes that started at or after `since_ticks` when it is
/// given: an attempt's processes are all younger than its job, so older ones are skipped on
/// their start time without reading their environment.
pub fn scan_marker_since(marker: &str, since_ticks: Option<u64>) -> MarkerScan {
    walk(since_ticks, &[marker]).select(marker, since_ticks)
}

/// One walk of `/proc`: every process (but this one) started at or after `floor_ticks` when
/// it is given, with what its environment says about `markers`. One walk answers a marker
/// scan for each of them ([`Walk::select`]); processes carrying other markers (the other
/// cases' processes, in a wide batch most of the host's) are passed over on their stat (read
/// once per process, [`crate::local::stat_cache`]): by their ancestry when they descend from a
/// wrapper this process spawned for another case ([`crate::local::spawned`]), else by their
/// environment.
pub fn walk(floor_ticks: Option<u64>, markers: &[&str]) -> Walk {
    let prefix = format!("{MARKER_ENV}=");
    let me = std::process::id();
    // Before the listing: a wrapper recorded after it is read like any other process.
    let known = crate::local::spawned::known();
    // Every stat first (most kept from the walk before): a young process is known by its
    // ancestors, which may be older.
    let Some((pids, stats)) = crate::local::stat_cache::processes(me) else {
        return Walk { seen: Vec::new() };
    };
    known.forget_gone(&stats);
    let mut seen = Vec::new();
    for pid in pids {
        let stat = stats.get(&pid).copied();
        let ticks = stat.map(|s| s.start_ticks);
        if let Some(floor) = floor_ticks
            && ticks.is_some_and(|t| t < floor)
        {
            continue;
        }
        // A zombie has no environment left, and nothing of it survives to be killed.
        if stat.is_some_and(|s| !s.is_alive()) {
            continue;
        }
        if known
            .inherited(pid, &stats)
            .is_some_and(|other| !markers.contains(&other))
        {
            continue;
        }
        let env = match read_generated(format!("/proc/{pid}/environ")) {
            Ok(env) => {
                let marker = env
                    .split(|b| *b == 0)
                    .find_map(|kv| kv.strip_prefix(prefix.as_bytes()));
                match marker {
                    // Alive still, after its environment was read (it may have been exiting).
                    Some(m) if markers.iter().any(|w| w.as_bytes() == m) && is_alive(pid) => {
                        Environ::Marked(m.to_vec())
                    }
                    _ => continue,
                }
            }
            // Gone between listing and reading: not a survivor.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) if stat.is_some_and(|s| s.is_kernel_thread()) || !is_alive(pid) => continue,
            Err(_) => Environ::Unreadable,
        };
        seen.push(Seen { pid, ticks, env });
    }
    Walk { seen }
}

/// The processes one walk of `/proc` saw carrying a marker, or whose environment it could
/// not read.
#[derive(Debug, Default)]
pub struct Walk {
    seen: Vec<Seen>,
}

#[derive(Debug)]
struct Seen {
    pid: u32,
    ticks: Option<u64>,
    env: Environ,
}

#[derive(Debug)]
enum Environ {
    /// The value of its `MARKER_ENV`.
    Marked(Vec<u8>),
    Unreadable,
}

impl Walk {
    /// What a scan for `marker` among processes started at or after `since_ticks` finds in
    /// this walk (which must have started no later than the scan was asked for, with a floor
    /// no higher than `since_ticks`, looking for `marker`). Unreadable processes count only when `since_ticks` is
    /// given and they are known to be that young: older ones cannot be the attempt's.
    pub fn select(&self, marker: &str, since_ticks: Option<u64>) -> MarkerScan {
        let mut scan = MarkerScan::default();
        for s in &self.seen {
            let young = |unknown| match (since_ticks, s.ticks) {
                (None, _) => true,
                (Some(since), Some(t)) => t >= since,
                (Some(_), None) => unknown,
            };
            match &s.env {
                Environ::Marked(m) if m == marker.as_bytes() && young(true) => {
                    scan.marked.push(s.pid)
                }
                Environ::Unreadable if since_ticks.is_some() && young(false) => {
                    scan.unreadable.push(s.pid)
                }
                _ => {}
            }
        }
        scan
    }
}

/// Re-examines processes a scan could not read: a process that was exiting (or starting) at
/// that moment is gone or readable a moment later. Returns those still unreadable, and any
/// that turned out to carry the marker.
pub fn recheck_unreadable(marker: &str, pids: &[u32]) -> Vec<u32> {
    let needle = format!("{MARKER_ENV}={marker}");
    pids.iter()
        .copied()
        .filter(|pid| match read_generated(format!("/proc/{pid}/environ")) {
            Ok(env) => env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()),
            Err(_) => is_alive(*pid),
        })
        .collect()
}

/// `pid 42 (sleep 300)`: a process as a receipt names it (its command line, else its name).
pub fn describe(pid: u32) -> String {
    let cmdline = read_generated(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let words: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let what = if words.is_empty() {
        read_generated_text(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "gone".into())
    } else {
        words.join(" ")
    };
    let what: String = what.chars().take(120).collect();
    format!("pid {pid} ({what})")
}

/// Kills the process group led by `pid`, but only if `pid` is still the process we started.
pub fn kill_group_if_same(pid: u32, ticks: u64) -> bool {
    if !is_same_process(pid, ticks) {
        return false;
    }
    killpg(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok()
}

/// SIGKILL to one process found by marker in this very scan.
pub fn kill_pid(pid: u32) {
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// Resident memory of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = read_generated_text(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// True when `pid`, or a process it started, holds the listening TCP socket on `port`. A
/// port that answers proves nothing about who answers: a server that lost its port to
/// another process exits, while the winner's port accepts connections all the same.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let listening = listening_inodes(pid, port);
    !listening.is_empty() && holds_socket(pid, &listening, 4)
}

/// Inodes of the sockets listening on `port` in `pid`'s network namespace.
fn listening_inodes(pid: u32, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = read_generated_text(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        // `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...`
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && f.get(3) == Some(&LISTEN) {
                inodes.extend(f.get(9).and_then(|i| i.parse::<u64>().ok()));
            }
        }
    }
    inodes
}

/// Whether `pid` or a descendant (down to `depth` generations: a launcher that runs the
/// server as its child) has one of `inodes` open.
fn holds_socket(pid: u32, inodes: &[u64], depth: u32) -> bool {
    let own = fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten().any(|fd| {
            fs::read_link(fd.path()).is_ok_and(|link| {
                link.to_str()
                    .and_then(|l| l.strip_prefix("socket:[")?.strip_suffix(']'))
                    .and_then(|i| i.parse::<u64>().ok())
                    .is_some_and(|i| inodes.contains(&i))
            })
        })
    });
    own || (depth > 0
        && children(pid)
            .into_iter()
            .any(|child| holds_socket(child, inodes, depth - 1)))
}

/// The children of `pid`, from every one of its threads.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| read_generated_text(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn a_listening_socket_is_known_by_its_holder_only() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port));
        // A child of this process holds no socket of its own.
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(!listens_on(other.id(), port));
        let _ = other.kill();
        let _ = other.wait();
        drop(listener);
        assert!(!listens_on(std::process::id(), port));
    }

    #[test]
    fn own_identity_is_readable_and_stable() {
        let me = std::process::id();
        let ticks = start_ticks(me).expect("own stat readable");
        assert!(is_same_process(me, ticks));
        assert!(
            !is_same_process(me, ticks + 1),
            "a different start time is another process"
        );
    }

    /// A scan for `marker` once a process carries it (up to 5 s): until a child has exec'd,
    /// its environment is still its parent's.
    fn scan_until_found(marker: &str) -> MarkerScan {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut found = scan_marker(marker);
        while found.marked.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            found = scan_marker(marker);
        }
        found
    }

    #[test]
    fn scan_finds_a_marked_child_and_only_it() {
        let marker = format!("test-{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env(MARKER_ENV, &marker)
            .spawn()
            .unwrap();
        let found = scan_until_found(&marker);
        assert_eq!(found.marked, vec![child.id()]);
        assert!(scan_marker("some-other-marker").marked.is_empty());
        kill_pid(child.id());
        child.wait().unwrap();
        assert!(scan_marker(&marker).marked.is_empty());
    }

    #[test]
    fn another_cases_wrapper_and_its_descendants_are_passed_over_by_ancestry() {
        // Case b's wrapper, whose child claims case a's marker. Read, the child's environment
        // says a; known by ancestry (once b's wrapper is recorded), it is b's and never read.
        let (a, b) = (
            format!("a-{}", std::process::id()),
            format!("b-{}", std::process::id()),
        );
        let mut wrapper = std::process::Command::new("/bin/sh")
            .args(["-c", &format!("env {MARKER_ENV}={a} sleep 30 & wait")])
            .env(MARKER_ENV, &b)
            .process_group(0)
            .spawn()
            .unwrap();
        let read = scan_until_found(&a);
        let [child] = read.marked[..] else {
            panic!("the child, read, carries a: {read:?}")
        };
        let ticks = start_ticks(wrapper.id()).unwrap();
        crate::local::spawned::record(wrapper.id(), ticks, &b);
        assert!(
            scan_marker(&a).marked.is_empty(),
            "b's descendant is not a's"
        );
        // A walk for b itself still reads: the wrapper carries b, its child does not.
        assert_eq!(scan_marker(&b).marked, vec![wrapper.id()]);
        assert!(!scan_marker(&b).marked.contains(&child));

        killpg(Pid::from_raw(wrapper.id() as i32), Signal::SIGKILL).unwrap();
        wrapper.wait().unwrap();
        assert!(crate::local::spawned::holds(wrapper.id()));
        walk(None, &[]);
        assert!(
            !crate::local::spawned::holds(wrapper.id()),
            "a walk forgets an ended wrapper"
        );
    }
}
