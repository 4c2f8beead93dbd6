//! One cgroup per attempt: how an attempt's processes are found and killed.
//!
//! The wrapper joins the attempt's cgroup before the harness runs, so every descendant is a
//! member whatever it does afterwards (`setsid`, double fork, `env -i`). Membership is the
//! cgroup's own process list, so finding an attempt's processes costs the same however many
//! other processes run on the host. Preference order:
//! 1. cgroup v2 (`cgroup.kill`, or freeze + kill on kernels before 5.14; `cgroup.events`
//!    says when the whole subtree is empty), at the hierarchy's root or, where only a
//!    delegated subtree is writable, under this process's own cgroup;
//! 2. cgroup v1 `freezer` (freeze, kill every member, thaw);
//! 3. cgroup v1 `pids` (`pids.max` set to 0 so nothing forks, then kill every member);
//! 4. none writable: the `/proc` scan for the allocation marker in each process's environment
//!    (which an environment-clearing descendant escapes).
//!
//! The method is recorded in the job record and named in the cleanup receipt. A cgroup is named
//! after its attempt (see [`crate::host_name`]), so after a crash the attempt's cgroup is found again
//! by name even when its job record was lost.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::local::kernel;
use crate::local::procfs;

/// The folder every attempt cgroup lives in, inside each hierarchy.
const PARENT: &str = "casebatch";
const V2_ROOTS: [&str; 2] = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];
const FREEZER_ROOT: &str = "/sys/fs/cgroup/freezer";
const PIDS_ROOT: &str = "/sys/fs/cgroup/pids";

/// How an attempt's processes are tracked. Records from before cgroups read as `MarkerScan`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Tracking {
    CgroupV2 {
        dir: PathBuf,
    },
    CgroupV1Freezer {
        dir: PathBuf,
    },
    CgroupV1Pids {
        dir: PathBuf,
    },
    /// No writable cgroup hierarchy: processes are found by the marker in their environment.
    #[default]
    MarkerScan,
}

/// This process's own cgroup v2 path (`0::/path` in `/proc/self/cgroup`), for delegation.
fn own_v2_path() -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_start_matches('/').to_string())
        .filter(|p| !p.is_empty())
}

/// Where attempt cgroups may be made, in order of preference, each with its method.
fn candidates(name: &str) -> Vec<Tracking> {
    PARENTS
        .iter()
        .map(|(method, parent)| method.at(parent.join(name)))
        .collect()
}

/// The hierarchies' `casebatch` folders usable on this host, in order of preference: looked
/// up once (mounts do not move under a running worker), each proven by moving a process into
/// a cgroup there (a folder this user may create but not join would fail every harness).
static PARENTS: std::sync::LazyLock<Vec<(Tracking, PathBuf)>> = std::sync::LazyLock::new(|| {
    found_parents()
        .into_iter()
        .filter(|(_, parent)| can_join(parent))
        .collect()
});

/// A process can be moved into a new cgroup under `parent` (the wrapper's first act).
fn can_join(parent: &Path) -> bool {
    let probe = parent.join(format!("probe-{}", std::process::id()));
    if fs::create_dir_all(&probe).is_err() {
        return false;
    }
    let joined = std::process::Command::new("/bin/sh")
        .args(["-c", r#"echo $$ > "$1""#, "sh"])
        .arg(probe.join("cgroup.procs"))
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // The probe's shell has exited: the cgroup is empty again.
    let _ = fs::remove_dir(&probe);
    joined
}

/// The hierarchies mounted here, in order of preference.
fn found_parents() -> Vec<(Tracking, PathBuf)> {
    let mut out = Vec::new();
    let v2 = Tracking::CgroupV2 {
        dir: PathBuf::new(),
    };
    if let Some(root) = V2_ROOTS
        .map(Path::new)
        .into_iter()
        .find(|r| r.join("cgroup.controllers").exists())
    {
        out.push((v2.clone(), root.join(PARENT)));
        if let Some(own) = own_v2_path() {
            out.push((v2, root.join(own).join(PARENT)));
        }
    }
    for (root, method) in [
        (
            FREEZER_ROOT,
            Tracking::CgroupV1Freezer {
                dir: PathBuf::new(),
            },
        ),
        (
            PIDS_ROOT,
            Tracking::CgroupV1Pids {
                dir: PathBuf::new(),
            },
        ),
    ] {
        if Path::new(root).join("cgroup.procs").exists() {
            out.push((method, Path::new(root).join(PARENT)));
        }
    }
    out
}

impl Tracking {
    /// Makes the attempt's cgroup in the first hierarchy that lets us, or falls back to the
    /// marker scan.
    pub fn create(name: &str) -> Self {
        for t in candidates(name) {
            let dir = t.dir().expect("a cgroup candidate");
            if fs::create_dir_all(dir).is_ok() && dir.join("cgroup.procs").exists() {
                return t;
            }
        }
        Tracking::MarkerScan
    }

    /// The attempt's cgroup, found by name (after a crash lost its record).
    pub fn find(name: &str) -> Option<Self> {
        candidates(name)
            .into_iter()
            .find(|t| t.dir().is_some_and(|d| d.join("cgroup.procs").exists()))
    }

    /// True when some cgroup hierarchy is writable here, so the marker scan is never needed
    /// for attempts started by this version.
    pub fn cgroups_available() -> bool {
        !PARENTS.is_empty()
    }

    /// The same method, at `dir`.
    fn at(&self, dir: PathBuf) -> Self {
        match self {
            Tracking::CgroupV2 { .. } => Tracking::CgroupV2 { dir },
            Tracking::CgroupV1Freezer { .. } => Tracking::CgroupV1Freezer { dir },
            Tracking::CgroupV1Pids { .. } => Tracking::CgroupV1Pids { dir },
            Tracking::MarkerScan => Tracking::MarkerScan,
        }
    }

    fn dir(&self) -> Option<&Path> {
        match self {
            Tracking::CgroupV2 { dir }
            | Tracking::CgroupV1Freezer { dir }
            | Tracking::CgroupV1Pids { dir } => Some(dir),
            Tracking::MarkerScan => None,
        }
    }

    /// The name used in receipts.
    pub fn method(&self) -> &'static str {
        match self {
            Tracking::CgroupV2 { .. } => "cgroup_v2",
            Tracking::CgroupV1Freezer { .. } => "cgroup_v1_freezer",
            Tracking::CgroupV1Pids { .. } => "cgroup_v1_pids",
            Tracking::MarkerScan => "proc_marker_scan",
        }
    }

    /// The `cgroup.procs` file the wrapper writes its pid into before the harness runs.
    pub fn procs_file(&self) -> Option<PathBuf> {
        self.dir().map(|d| d.join("cgroup.procs"))
    }

    /// The cgroup's live processes; `None` when tracking is by marker scan.
    pub fn members(&self) -> Option<Vec<u32>> {
        let dir = self.dir()?;
        let text = kernel::read_generated_text(dir.join("cgroup.procs")).unwrap_or_default();
        Some(
            text.lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .filter(|p| procfs::is_alive(*p))
                .collect(),
        )
    }

    /// True when nothing of the attempt is left in the cgroup (v2: in its whole subtree).
    pub fn is_empty(&self) -> bool {
        match self {
            Tracking::CgroupV2 { dir } => {
                match kernel::read_generated_text(dir.join("cgroup.events")) {
                    Ok(events) => events.lines().any(|l| l.trim() == "populated 0"),
                    // Already removed: nothing can be in it.
                    Err(_) => !dir.exists(),
                }
            }
            _ => self.members().is_none_or(|m| m.is_empty()),
        }
    }

    /// SIGKILLs every process in the cgroup at once, so no member can fork past the kill.
    /// Returns the members it saw just before. `None` when tracking is by marker scan.
    pub fn kill(&self) -> Option<Vec<u32>> {
        let members = self.members()?;
        if members.is_empty() {
            return Some(members);
        }
        match self {
            Tracking::CgroupV2 { dir } => {
                if fs::write(dir.join("cgroup.kill"), "1").is_err() {
                    // Kernels before 5.14: freeze, kill each member, thaw.
                    let _ = fs::write(dir.join("cgroup.freeze"), "1");
                    wait_for(|| read_trim(&dir.join("cgroup.events")).contains("frozen 1"));
                    kill_each(self);
                    let _ = fs::write(dir.join("cgroup.freeze"), "0");
                }
            }
            Tracking::CgroupV1Freezer { dir } => {
                let state = dir.join("freezer.state");
                let _ = fs::write(&state, "FROZEN");
                wait_for(|| read_trim(&state) == "FROZEN");
                kill_each(self);
                let _ = fs::write(&state, "THAWED");
            }
            Tracking::CgroupV1Pids { dir } => {
                // Nothing in the cgroup can fork any more; then no kill can be outrun.
                let _ = fs::write(dir.join("pids.max"), "0");
                kill_each(self);
            }
            Tracking::MarkerScan => unreachable!("members() is None for the marker scan"),
        }
        Some(members)
    }

    /// Removes the (empty) cgroup. A process still in it keeps it, and cleanup says so.
    pub fn remove(&self) {
        if let Some(dir) = self.dir() {
            let _ = fs::remove_dir(dir);
        }
    }
}

fn kill_each(t: &Tracking) {
    for pid in t.members().unwrap_or_default() {
        procfs::kill_pid(pid);
    }
}

fn read_trim(path: &Path) -> String {
    kernel::read_generated_text(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Waits (briefly, blocking: freezing takes microseconds) for a cgroup state change.
fn wait_for(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while !done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `script` as a member of `t` (the wrapper's join, then the script).
    fn spawn_in(t: &Tracking, script: &str) -> std::process::Child {
        let procs = t.procs_file().expect("a cgroup");
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {}; {script}", procs.display()))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .spawn()
            .unwrap()
    }

    fn wait_members(t: &Tracking, n: usize) -> Vec<u32> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = t.members().unwrap();
            if m.len() >= n || Instant::now() > deadline {
                return m;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn check(t: Tracking) {
        // A detached, environment-clearing grandchild stays a member.
        let mut child = spawn_in(&t, "setsid env -i sleep 300 & exec sleep 300");
        let before = wait_members(&t, 2);
        assert_eq!(before.len(), 2, "{}: {before:?}", t.method());
        assert!(!t.is_empty());
        let killed = t.kill().unwrap();
        assert_eq!(killed.len(), 2);
        child.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !t.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(t.is_empty(), "{}: {:?} left", t.method(), t.members());
        for pid in before {
            assert!(!procfs::is_alive(pid), "{pid} survived {}", t.method());
        }
        t.remove();
        assert!(!t.dir().unwrap().exists());
    }

    /// Every hierarchy this host offers is exercised (hosts without one skip it, by name).
    #[test]
    fn each_available_method_kills_a_detached_env_clearing_descendant() {
        let name = crate::host_name(&format!("unit/{}/1", std::process::id()), Path::new("/t"));
        let mut tried = Vec::new();
        for t in candidates(&name) {
            if fs::create_dir_all(t.dir().unwrap()).is_ok() {
                tried.push(t.method());
                check(t);
            }
        }
        eprintln!("cgroup methods exercised here: {tried:?}");
    }

    #[test]
    fn names_are_safe_stable_and_differ_by_attempt_dir() {
        let a = crate::host_name("batch one/3/1", Path::new("/out/a"));
        assert!(a.starts_with("batch_one_3_1-"), "{a}");
        assert_eq!(a, crate::host_name("batch one/3/1", Path::new("/out/a")));
        assert_ne!(a, crate::host_name("batch one/3/1", Path::new("/out/b")));
        assert!(!crate::host_name("../../x", Path::new("/")).contains('/'));
    }
}
