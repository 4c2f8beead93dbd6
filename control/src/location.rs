//! Locating a batch: where it lives (output root + batch id), which engine runs it (the one
//! its `run_config.json` records), and, for an existing batch, its workflow, proven to be
//! this batch's.

use std::path::{Path, PathBuf};

use casebatch_bundle::{Bundle, EngineMode, RunConfig, read_json_if_present};
use casebatch_manifest::{Plan, PlanHead};
use casebatch_worker::{DevServer, Engine, EngineTarget};

use crate::error::{ControlError, Result};
use crate::workflow::{self, Handle, Presence, presence};

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
        let bundle = self.existing_bundle()?;
        let plan = bundle.read_plan()?;
        Ok((bundle, plan))
    }

    /// [`Self::open`] with the plan's head only.
    pub fn open_head(&self) -> Result<(Bundle, PlanHead)> {
        let bundle = self.existing_bundle()?;
        let plan = bundle.read_plan_head()?;
        Ok((bundle, plan))
    }

    fn existing_bundle(&self) -> Result<Bundle> {
        let bundle = self.bundle();
        if !bundle.exists() {
            return Err(ControlError::NoBundle {
                batch_id: self.batch_id.clone(),
                path: bundle.root().to_path_buf(),
            });
        }
        Ok(bundle)
    }
}

/// An existing batch on its own engine, its workflow proven to be this batch.
pub(crate) struct Attached {
    pub bundle: Bundle,
    /// The plan's head: its cases' specs stay in the bundle (`Bundle::read_plan` for them).
    pub plan: PlanHead,
    pub engine: Engine,
    pub handle: Handle,
    pub presence: Presence,
}

impl BatchLocation {
    /// Opens the bundle, connects to the engine it records, and finds its workflow (refusing
    /// one that belongs to another batch).
    pub(crate) async fn attach(&self, engine: &EngineChoice) -> Result<Attached> {
        let (bundle, plan) = self.open_head()?;
        let engine = engine
            .for_batch(&bundle)?
            .connect(&self.output_root)
            .await?;
        let handle = workflow::handle(&engine.client, &plan);
        let presence = presence(&handle, &bundle, &plan).await?;
        Ok(Attached {
            bundle,
            plan,
            engine,
            handle,
            presence,
        })
    }
}

/// The engine flags: all `None` means the embedded dev server under the output root, unless
/// Temporal's environment (`TEMPORAL_ADDRESS`, profiles) names a cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineChoice {
    pub address: Option<String>,
    pub namespace: Option<String>,
    pub profile: Option<String>,
    /// Serve the embedded engine's Web UI on a loopback port (`--ui`); refused for a cluster,
    /// which serves its own.
    pub ui: bool,
}

impl EngineChoice {
    /// Connects, starting (or finding) the embedded server when that is the target. An
    /// embedded server that cannot start on a full disk is reported as the full disk it is.
    pub async fn connect(&self, output_root: &Path) -> Result<Engine> {
        let mut target = EngineTarget::resolve(
            output_root,
            self.address.clone(),
            self.namespace.clone(),
            self.profile.clone(),
        );
        match &mut target {
            EngineTarget::Embedded { ui, .. } => *ui = self.ui,
            EngineTarget::Cluster { address, .. } if self.ui => {
                let named = address
                    .clone()
                    .or_else(|| std::env::var("TEMPORAL_ADDRESS").ok())
                    .unwrap_or_else(|| "the temporal.toml profile's address".into());
                return Err(ControlError::BadArgument {
                    what: "--ui with the engine",
                    value: named,
                    hint: "--ui serves the Web UI of the embedded engine only; a cluster serves \
                           its own (ask its operators for its address)",
                });
            }
            EngineTarget::Cluster { .. } => {}
        }
        Engine::connect(&target).await.map_err(|e| {
            let EngineTarget::Embedded { output_root, .. } = &target else {
                return e.into();
            };
            match crate::space::first_low(&[DevServer::state_dir(output_root)]) {
                Some((path, space)) => ControlError::OutOfSpace {
                    action: "start the embedded engine".into(),
                    path,
                    space: space.to_string(),
                    then: "run the command again".into(),
                },
                None => e.into(),
            }
        })
    }
}

impl EngineChoice {
    /// The engine an existing batch runs on. Every command on a batch uses the engine its
    /// `run_config.json` records, so a batch never splits across two servers: no flags mean
    /// the recorded engine; flags naming another one are refused.
    pub(crate) fn for_batch(&self, bundle: &Bundle) -> Result<EngineChoice> {
        // Absent: planned but never started, so any engine may run it. Unreadable is an
        // error: guessing would let a batch split across two engines.
        let Some(config) = read_json_if_present::<RunConfig>(&bundle.run_config())? else {
            return Ok(self.clone());
        };
        let recorded = config.engine;
        let asked = self.address.clone().or_else(|| {
            std::env::var("TEMPORAL_ADDRESS")
                .ok()
                .filter(|a| !a.is_empty())
        });
        let mismatch = |asked: String| ControlError::EngineMismatch {
            batch_id: config.batch_id.clone(),
            recorded: match recorded.mode {
                EngineMode::Embedded => "the embedded dev server under its output directory".into(),
                EngineMode::Cluster => {
                    format!("{} (namespace {})", recorded.address, recorded.namespace)
                }
            },
            asked,
        };
        match recorded.mode {
            EngineMode::Embedded => match asked.or(self.profile.clone()) {
                Some(other) => Err(mismatch(other)),
                None => Ok(self.clone()),
            },
            EngineMode::Cluster => {
                if let Some(asked) = asked
                    && host_port(&asked) != host_port(&recorded.address)
                {
                    return Err(mismatch(asked));
                }
                if let Some(ns) = &self.namespace
                    && *ns != recorded.namespace
                {
                    return Err(mismatch(format!("namespace {ns}")));
                }
                Ok(EngineChoice {
                    address: Some(recorded.address.clone()),
                    namespace: Some(recorded.namespace.clone()),
                    profile: self.profile.clone().or(recorded.profile.clone()),
                    // Refused at connect: a cluster serves its own UI.
                    ui: self.ui,
                })
            }
        }
    }
}

/// `host:port` of an address written with or without a scheme.
fn host_port(address: &str) -> &str {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    rest.trim_end_matches('/')
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
    fn an_unreadable_run_config_is_an_error_not_a_batch_never_started() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = Bundle::at(dir.path());
        let choice = EngineChoice::default();
        assert_eq!(choice.for_batch(&bundle).unwrap(), choice, "never started");
        std::fs::create_dir(bundle.run_config()).unwrap();
        let err = choice.for_batch(&bundle).unwrap_err();
        assert!(matches!(err, ControlError::BundleUnreadable(_)), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("run_config.json") && text.contains("Is a directory"),
            "{text}"
        );
    }

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
