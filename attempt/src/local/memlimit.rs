//! Memory limits for an attempt, and evidence that a kill was the limit's doing.
//!
//! Preference order: a cgroup v1 memory controller (`memory.limit_in_bytes`,
//! `memory.oom_control`), then cgroup v2 (`memory.max`, `memory.events`), then polling the
//! resident memory of the attempt's processes. The mechanism used is recorded in the job record.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const V1_ROOT: &str = "/sys/fs/cgroup/memory";
const V2_ROOTS: [&str; 2] = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mechanism", rename_all = "snake_case")]
pub enum MemoryLimit {
    /// No limit requested.
    None,
    CgroupV1 {
        dir: PathBuf,
        limit_mb: u64,
    },
    CgroupV2 {
        dir: PathBuf,
        limit_mb: u64,
    },
    /// No writable cgroup: the runtime polls resident memory and kills past the limit.
    RssPoll {
        limit_mb: u64,
    },
}

impl MemoryLimit {
    /// Creates a cgroup for the attempt (or falls back to polling). `name` must be unique per
    /// attempt and filesystem-safe.
    pub fn create(name: &str, limit_mb: Option<u64>) -> Self {
        let Some(limit_mb) = limit_mb else {
            return MemoryLimit::None;
        };
        let bytes = (limit_mb * 1024 * 1024).to_string();
        let v1 = Path::new(V1_ROOT).join("casebatch").join(name);
        if fs::create_dir_all(&v1).is_ok()
            && fs::write(v1.join("memory.limit_in_bytes"), &bytes).is_ok()
        {
            // Without swap accounting the kernel would swap instead of killing; best effort.
            let _ = fs::write(v1.join("memory.memsw.limit_in_bytes"), &bytes);
            return MemoryLimit::CgroupV1 { dir: v1, limit_mb };
        }
        for root in V2_ROOTS {
            let root = Path::new(root);
            if !root.join("cgroup.controllers").exists() {
                continue;
            }
            let parent = root.join("casebatch");
            let _ = fs::create_dir_all(&parent);
            let _ = fs::write(root.join("cgroup.subtree_control"), "+memory");
            let _ = fs::write(parent.join("cgroup.subtree_control"), "+memory");
            let dir = parent.join(name);
            if fs::create_dir_all(&dir).is_ok() && fs::write(dir.join("memory.max"), &bytes).is_ok()
            {
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                return MemoryLimit::CgroupV2 { dir, limit_mb };
            }
        }
        MemoryLimit::RssPoll { limit_mb }
    }

    /// The `cgroup.procs` file the wrapper writes its pid into before it runs the harness.
    pub fn procs_file(&self) -> Option<PathBuf> {
        match self {
            MemoryLimit::CgroupV1 { dir, .. } | MemoryLimit::CgroupV2 { dir, .. } => {
                Some(dir.join("cgroup.procs"))
            }
            _ => None,
        }
    }

    pub fn limit_mb(&self) -> Option<u64> {
        match self {
            MemoryLimit::None => None,
            MemoryLimit::CgroupV1 { limit_mb, .. }
            | MemoryLimit::CgroupV2 { limit_mb, .. }
            | MemoryLimit::RssPoll { limit_mb } => Some(*limit_mb),
        }
    }

    /// True when the kernel's OOM killer acted inside this attempt's cgroup.
    pub fn oom_killed(&self) -> bool {
        self.oom_kills() > 0
    }

    /// How many processes the kernel's OOM killer has killed in this attempt's cgroup (0
    /// without one): a count taken before the evaluator runs tells its kill from the actor's.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = match self {
            MemoryLimit::CgroupV1 { dir, .. } => (dir.join("memory.oom_control"), "oom_kill"),
            MemoryLimit::CgroupV2 { dir, .. } => (dir.join("memory.events"), "oom_kill"),
            _ => return 0,
        };
        crate::local::kernel::read_generated_text(file)
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let mut it = l.split_whitespace();
                    (it.next() == Some(key)).then(|| it.next()?.parse::<u64>().ok())?
                })
            })
            .unwrap_or(0)
    }

    /// Removes the cgroup (it must be empty; a leftover process keeps it, which is reported
    /// by cleanup anyway).
    pub fn remove(&self) {
        if let MemoryLimit::CgroupV1 { dir, .. } | MemoryLimit::CgroupV2 { dir, .. } = self {
            let _ = fs::remove_dir(dir);
        }
    }
}
