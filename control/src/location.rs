//! Where a batch lives (output root + batch id) and which engine runs it.

use std::path::{Path, PathBuf};

use casebatch_bundle::Bundle;
use casebatch_manifest::Plan;
use casebatch_worker::{Engine, EngineTarget};

use crate::error::{ControlError, Result};

/// A batch's place on disk. The output root is absolute: activities may run in other
/// processes, started from other directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLocation {
    pub output_root: PathBuf,
    pub batch_id: String,
}

impl BatchLocation {
    /// Checks the id before it names a directory.
    pub fn new(output_dir: &Path, batch_id: &str) -> Result<Self> {
        check_batch_id(batch_id)?;
        Ok(Self {
            output_root: absolute(output_dir)?,
            batch_id: batch_id.to_string(),
        })
    }

    pub fn bundle(&self) -> Bundle {
        Bundle::new(&self.output_root, &self.batch_id)
    }

    /// The batch's bundle and its saved plan; an existing batch never re-reads its manifest.
    pub fn open(&self) -> Result<(Bundle, Plan)> {
        let bundle = self.bundle();
        if !bundle.exists() {
            return Err(ControlError::NoBundle {
                batch_id: self.batch_id.clone(),
                path: bundle.root().to_path_buf(),
            });
        }
        let plan = bundle.read_plan()?;
        Ok((bundle, plan))
    }
}

/// The engine flags: all `None` means the embedded dev server under the output root, unless
/// Temporal's environment (`TEMPORAL_ADDRESS`, profiles) names a cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineChoice {
    pub address: Option<String>,
    pub namespace: Option<String>,
    pub profile: Option<String>,
}

impl EngineChoice {
    /// Connects, starting (or finding) the embedded server when that is the target.
    pub async fn connect(&self, output_root: &Path) -> Result<Engine> {
        let target = EngineTarget::resolve(
            output_root,
            self.address.clone(),
            self.namespace.clone(),
            self.profile.clone(),
        );
        Ok(Engine::connect(&target).await?)
    }
}

pub(crate) fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|_| ControlError::BadArgument {
        what: "the output directory",
        value: path.display().to_string(),
        hint: "use a path that exists or can be created",
    })
}

/// Batch ids name directories: refuse anything that could leave the output root.
pub(crate) fn check_batch_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ControlError::BadArgument {
            what: "--batch-id",
            value: id.to_string(),
            hint: "use letters, digits, '.', '_' and '-' only, not starting with '.'",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_cannot_leave_the_output_root() {
        for bad in ["", ".", "..", "../x", "a/b", ".hidden", "a b", "é"] {
            assert!(
                matches!(check_batch_id(bad), Err(ControlError::BadArgument { .. })),
                "{bad:?} was accepted"
            );
        }
        for good in ["smoke", "web-voyager_2026.11", "A1"] {
            assert!(check_batch_id(good).is_ok(), "{good:?} was refused");
        }
    }
}
