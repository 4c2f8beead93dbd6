//! Plans for unit tests, loaded from a real manifest file.

use std::path::Path;

use casebatch_manifest::Plan;

/// Batch `t`: tasks `a` and `b` on the fake runtime.
pub(crate) fn two_cases(dir: &Path) -> Plan {
    let manifest = dir.join("m.yaml");
    std::fs::write(
        &manifest,
        "batch_id: t\ndefaults:\n  runtime: fake\ntasks:\n  - task_id: a\n  - task_id: b\n",
    )
    .unwrap();
    casebatch_manifest::load_plan(&manifest, &Default::default()).unwrap()
}
