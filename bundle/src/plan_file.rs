//! The saved plan without holding it whole. A 100,000-case `batch_plan.json` is 45 MB and
//! takes about 130 MB parsed; a worker needs one case per activity, and status a case's id.
//! [`PlanIndex`] keeps the plan's head and where each case lies in the file, and parses a case
//! when it is asked for.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use casebatch_manifest::model::{Plan, PlannedCase};
use serde_json::value::RawValue;

use crate::BundleError;

/// Where one case's JSON lies in the plan file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    at: u64,
    len: u32,
}

/// A plan file's head, with its cases left in the file.
#[derive(Debug)]
pub struct PlanIndex {
    /// Held open: a plan written over it since (by rename) is not the one the spans point
    /// into, and this file still is. A worker keeps using the plan it first read, as when it
    /// kept the plan parsed.
    file: File,
    path: PathBuf,
    plan: Plan<Span>,
}

impl PlanIndex {
    /// Reads the plan at `path` once, to find its cases.
    pub fn open(path: &Path) -> Result<Self, BundleError> {
        let read_err = |source| BundleError::Read {
            path: path.display().to_string(),
            source,
        };
        let mut file = File::open(path).map_err(read_err)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(read_err)?;
        let raw: Plan<&RawValue> =
            serde_json::from_str(&text).map_err(|source| BundleError::Parse {
                path: path.display().to_string(),
                source,
            })?;
        let base = text.as_ptr() as usize;
        let spans = raw
            .cases
            .iter()
            .map(|case| Span {
                at: (case.get().as_ptr() as usize - base) as u64,
                len: case.get().len() as u32,
            })
            .collect();
        Ok(Self {
            file,
            path: path.to_path_buf(),
            plan: raw.with_cases(spans),
        })
    }

    /// Everything the plan says but its cases (`cases` holds where they are).
    pub fn plan(&self) -> &Plan<Span> {
        &self.plan
    }

    /// How many cases the plan has.
    pub fn len(&self) -> usize {
        self.plan.cases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plan.cases.is_empty()
    }

    /// The case at `index` (`None`: the plan has no such case), read from the file.
    pub fn case(&self, index: u32) -> Result<Option<PlannedCase>, BundleError> {
        let Some(span) = self.plan.cases.get(index as usize) else {
            return Ok(None);
        };
        let mut bytes = vec![0; span.len as usize];
        self.file
            .read_exact_at(&mut bytes, span.at)
            .map_err(|source| BundleError::Read {
                path: self.path.display().to_string(),
                source,
            })?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| BundleError::Parse {
                path: self.path.display().to_string(),
                source,
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Bundle, write_json_atomic};

    /// A plan of `n` simulated cases, `case-0` to `case-{n-1}`, each in a directory so named.
    pub(crate) fn plan_of(n: u32) -> Plan {
        let case = |i: u32| -> PlannedCase {
            serde_json::from_value(serde_json::json!({
                "index": i, "case_id": format!("case-{i}"), "case_dir": format!("case-{i}"),
                "runtime": "fake", "harness": null, "evaluator": null, "sandbox": null,
                "resources": {"cpu": null, "memory_mb": null}, "timeout_seconds": 600,
                "fake": null, "input": {"query": format!("q \"{i}\" é")},
                "source": {"line": i + 3, "runspec": null}
            }))
            .unwrap()
        };
        serde_json::from_value(serde_json::json!({
            "schema_version": "batch_plan_v1", "batch_id": "b",
            "provenance": {"manifest_path": "/m.yaml", "manifest_sha256": "00", "format": "yaml"},
            "settings": {"concurrency": 4, "max_retries": 1, "controller_url": null,
                         "device_controller_url": null, "oom_auto_boost": false},
            "fingerprint": "f00d", "summary": {"fields": [], "write_csv": false},
            "cases": (0..n).map(case).collect::<Vec<_>>(),
            "warnings": ["a warning after the cases"]
        }))
        .unwrap()
    }

    #[test]
    fn every_case_reads_back_as_written_and_the_head_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = Bundle::new(dir.path(), "b");
        let plan = plan_of(50);
        write_json_atomic(&bundle.plan(), &plan).unwrap();
        let index = PlanIndex::open(&bundle.plan()).unwrap();
        assert_eq!(index.len(), 50);
        for case in &plan.cases {
            assert_eq!(index.case(case.index).unwrap().as_ref(), Some(case));
        }
        assert_eq!(index.case(50).unwrap(), None);
        let head = index.plan();
        assert_eq!(
            (&head.fingerprint, &head.warnings, &head.settings),
            (&plan.fingerprint, &plan.warnings, &plan.settings)
        );
    }

    #[test]
    fn a_plan_written_over_it_is_not_read_through_old_spans() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = Bundle::new(dir.path(), "b");
        let plan = plan_of(3);
        write_json_atomic(&bundle.plan(), &plan).unwrap();
        let index = PlanIndex::open(&bundle.plan()).unwrap();
        // A resume that re-deals runtimes rewrites the plan: every case moves in the file.
        let mut moved = plan_of(3);
        moved.fingerprint = "f".repeat(64);
        moved.cases[2].case_id = "renamed-and-longer".into();
        write_json_atomic(&bundle.plan(), &moved).unwrap();
        assert_eq!(index.case(2).unwrap().as_ref(), Some(&plan.cases[2]));
    }
}
