//! Free space where a run writes: the bundle, and the embedded engine's database beside it.
//!
//! A full disk kills the embedded engine (SQLite cannot grow its write-ahead log) and it cannot
//! restart until space is freed, so a runner that only waited for the engine would wait in
//! vain. The runner checks both file systems every second while it follows a batch, whether
//! the engine answers or not, and ends the run once either is below its floor: the engine's
//! state and the bundle are intact, and `batch resume` continues once space is back.
//! Stopping at a floor rather than at zero leaves room for what is in flight to record how it
//! ended (a job's exit status, the engine's last transactions).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::statvfs::statvfs;

use crate::error::{ControlError, Result};

/// A run stops below this much free space: a few times what SQLite's log grows by between
/// checkpoints (about 4 MiB). On a file system smaller than ten times this, a tenth of it.
pub const FLOOR_BYTES: u64 = 16 << 20;
/// A run stops below this many free inodes too, on file systems that count them.
pub const FLOOR_INODES: u64 = 64;
/// How often free space is checked while a run follows its batch: often enough that the few
/// cases a run admits meanwhile fit in the floor, and statvfs costs microseconds.
const EVERY: Duration = Duration::from_secs(1);

/// What a file system has left, as `statvfs` reports it to an unprivileged user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// `None` where the file system does not count inodes (btrfs, some network ones).
    pub free_inodes: Option<u64>,
}

impl Space {
    /// The free space below which a run stops on this file system.
    pub fn floor_bytes(&self) -> u64 {
        FLOOR_BYTES.min(self.total_bytes / 10)
    }

    pub fn is_low(&self) -> bool {
        self.free_bytes < self.floor_bytes() || self.free_inodes.is_some_and(|n| n < FLOOR_INODES)
    }

    fn of(path: &Path) -> Option<Self> {
        let s = statvfs(path).ok()?;
        let unit = s.fragment_size() as u64;
        let files = s.files() as u64;
        Some(Self {
            free_bytes: (s.blocks_available() as u64).saturating_mul(unit),
            total_bytes: (s.blocks() as u64).saturating_mul(unit),
            free_inodes: (files > 0).then_some(s.files_available() as u64),
        })
    }
}

impl std::fmt::Display for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} free of {} (a run stops below {}",
            bytes(self.free_bytes),
            bytes(self.total_bytes),
            bytes(self.floor_bytes())
        )?;
        match self.free_inodes {
            Some(n) if n < FLOOR_INODES => write!(f, "; {n} inodes free, below {FLOOR_INODES})"),
            _ => f.write_str(")"),
        }
    }
}

/// `1.4 MiB`, `12 MiB`, `3.0 GiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} B"),
        _ if value < 10.0 => format!("{value:.1} {}", UNITS[unit]),
        _ => format!("{value:.0} {}", UNITS[unit]),
    }
}

/// The space of `path`'s file system, or of its nearest existing ancestor's (an output
/// directory a run has not created yet); `None` when no ancestor can be asked.
pub fn space_at(path: &Path) -> Option<(PathBuf, Space)> {
    path.ancestors()
        .find_map(|p| Space::of(p).map(|s| (p.to_path_buf(), s)))
}

/// The first of `paths` whose file system is below its floor, with what it has left.
pub fn first_low(paths: &[PathBuf]) -> Option<(PathBuf, Space)> {
    paths
        .iter()
        .filter_map(|p| space_at(p))
        .find(|(_, s)| s.is_low())
}

/// The directories a run writes to, watched while it follows its batch.
#[derive(Debug)]
pub(crate) struct SpaceWatch {
    batch_id: String,
    output_dir: PathBuf,
    paths: Vec<PathBuf>,
}

impl SpaceWatch {
    /// The bundle, and the embedded engine's state directory when the run uses one.
    pub(crate) fn new(bundle_root: &Path, batch_id: &str, engine_dir: Option<PathBuf>) -> Self {
        let output_dir = bundle_root.parent().unwrap_or(bundle_root).to_path_buf();
        let mut paths = vec![bundle_root.to_path_buf()];
        paths.extend(engine_dir);
        Self {
            batch_id: batch_id.to_string(),
            output_dir,
            paths,
        }
    }

    /// Checks now.
    pub(crate) fn check(&self) -> Result<()> {
        match first_low(&self.paths) {
            None => Ok(()),
            Some((path, space)) => Err(ControlError::OutOfSpace {
                action: format!("continue batch {}", self.batch_id),
                path,
                space: space.to_string(),
                then: format!(
                    "`casebatch batch resume --batch-id {} --output-dir {}`",
                    self.batch_id,
                    self.output_dir.display()
                ),
            }),
        }
    }

    /// Checks every [`EVERY`] until a file system is below its floor, whether the engine
    /// answers or not (a full disk is the likeliest reason an embedded engine stays down).
    pub(crate) async fn watch(&self) -> ControlError {
        loop {
            tokio::time::sleep(EVERY).await;
            if let Err(full) = self.check() {
                return full;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(free_bytes: u64, total_bytes: u64, free_inodes: Option<u64>) -> Space {
        Space {
            free_bytes,
            total_bytes,
            free_inodes,
        }
    }

    #[test]
    fn the_floor_is_16_mib_or_a_tenth_of_a_small_file_system() {
        let big = space(20 << 20, 100 << 30, None);
        assert_eq!(big.floor_bytes(), 16 << 20);
        assert!(!big.is_low());
        assert!(space(15 << 20, 100 << 30, None).is_low());
        let small = space(2 << 20, 12 << 20, Some(1000));
        assert_eq!(small.floor_bytes(), (12 << 20) / 10);
        assert!(!small.is_low());
        assert!(space(1 << 20, 12 << 20, Some(1000)).is_low());
    }

    #[test]
    fn running_out_of_inodes_is_out_of_space() {
        assert!(space(50 << 30, 100 << 30, Some(10)).is_low());
        assert!(!space(50 << 30, 100 << 30, None).is_low());
    }

    #[test]
    fn the_message_says_how_much_is_left_and_the_floor() {
        let s = space(1_200_000, 12 << 20, Some(500)).to_string();
        assert_eq!(s, "1.1 MiB free of 12 MiB (a run stops below 1.2 MiB)");
        let s = space(5 << 30, 100 << 30, Some(3)).to_string();
        assert_eq!(
            s,
            "5.0 GiB free of 100 GiB (a run stops below 16 MiB; 3 inodes free, below 64)"
        );
    }

    #[test]
    fn a_directory_not_created_yet_is_measured_on_its_nearest_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let (at, _) = space_at(&dir.path().join("out/batch")).unwrap();
        assert_eq!(at, dir.path());
    }
}
