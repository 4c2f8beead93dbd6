//! The run-history index (`casebatch-history`) in the batch operations: where it is, the
//! weights a new batch's `runtime:` lists are dealt by, and the median tail speculation
//! starts from. The index is refreshed from the bundles under the output root whenever it is
//! read, and it only ever advises: a run never fails because its history cannot be read (the
//! plan records the warning and the cases are dealt evenly).

use std::path::{Path, PathBuf};

use casebatch_bundle::Bundle;
use casebatch_history::{HistoryIndex, harness_identity};
use casebatch_manifest::{Plan, SpreadWeights};

use crate::error::{ControlError, Result};

/// Environment variable naming the index file (clusters put it on a shared path).
pub const HISTORY_DB_ENV: &str = "CASEBATCH_HISTORY_DB";

/// The index file: `--history-db`, else `CASEBATCH_HISTORY_DB`, else under the output root.
pub fn index_path(output_root: &Path, flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf)
        .or_else(|| std::env::var_os(HISTORY_DB_ENV).map(PathBuf::from))
        .unwrap_or_else(|| HistoryIndex::default_path(output_root))
}

pub use casebatch_views::HistoryView;

/// Refreshes the index from the bundles under `output_root` (or, with `rebuild`, builds it
/// again from nothing) and reads its per-harness, per-runtime medians.
pub fn show(output_root: &Path, flag: Option<&Path>, rebuild: bool) -> Result<HistoryView> {
    let index = index_path(output_root, flag);
    let mut db = HistoryIndex::open(&index).map_err(unusable(&index))?;
    let refreshed = if rebuild {
        db.rebuild(output_root)
    } else {
        db.refresh(output_root)
    }
    .map_err(unusable(&index))?;
    let medians = db.medians().map_err(unusable(&index))?;
    Ok(HistoryView {
        index,
        refreshed,
        medians,
    })
}

fn unusable(index: &Path) -> impl Fn(casebatch_history::HistoryError) -> ControlError + '_ {
    move |e| ControlError::History {
        index: index.display().to_string(),
        message: e.to_string(),
    }
}

/// Deals the plan's `runtime:` lists by the weights the history gives their runtimes. A
/// batch that already has a plan of the same task list keeps the deal it was made with, so
/// running it again never moves its cases. Without history the plan's even deal stays.
pub(crate) fn weigh(plan: &mut Plan, bundle: &Bundle, flag: Option<&Path>) {
    let lists = spread_lists(plan);
    if lists.is_empty() {
        return;
    }
    if let Ok(before) = bundle.read_plan()
        && before.fingerprint == plan.fingerprint
    {
        if let Some(spread) = before.spread {
            plan.deal_spread(spread);
        }
        return;
    }
    let Some(root) = bundle.root().parent() else {
        return;
    };
    match history_weights(root, flag, &lists) {
        Ok(Some(weights)) => plan.deal_spread(weights),
        Ok(None) => {}
        Err(e) => plan.warnings.push(format!(
            "run history unavailable ({e}): the runtime lists are dealt evenly"
        )),
    }
}

fn history_weights(
    root: &Path,
    flag: Option<&Path>,
    lists: &[Vec<String>],
) -> std::result::Result<Option<SpreadWeights>, casebatch_history::HistoryError> {
    let mut db = HistoryIndex::open(&index_path(root, flag))?;
    db.refresh(root)?;
    let mut weights = SpreadWeights {
        weights: Default::default(),
        source: String::new(),
    };
    let mut batches = 0;
    for list in lists {
        let w = db.weights(list)?;
        if !w.from_history {
            continue;
        }
        batches = batches.max(w.batches_used);
        for (name, weight) in w.by_runtime {
            weights.weights.entry(name).or_insert(weight);
        }
    }
    if weights.weights.is_empty() {
        return Ok(None);
    }
    weights.source = format!(
        "run history: {batches} earlier batch{} on these runtimes",
        if batches == 1 { "" } else { "es" }
    );
    Ok(Some(weights))
}

/// The distinct `runtime:` lists of the plan, in plan order.
fn spread_lists(plan: &Plan) -> Vec<Vec<String>> {
    let mut lists: Vec<Vec<String>> = Vec::new();
    for case in &plan.cases {
        if !case.runtime_spread.is_empty() && !lists.contains(&case.runtime_spread) {
            lists.push(case.runtime_spread.clone());
        }
    }
    lists
}

/// Tail speculation's starting median: the history's median duration of the harness of the
/// plan's listed cases (`None`: no history of it, or no index).
pub(crate) fn speculation_seed_ms(
    plan: &Plan,
    bundle: &Bundle,
    flag: Option<&Path>,
) -> Option<u64> {
    let case = plan.cases.iter().find(|c| !c.runtime_spread.is_empty())?;
    let root = bundle.root().parent()?;
    let mut db = HistoryIndex::open(&index_path(root, flag)).ok()?;
    db.refresh(root).ok()?;
    db.harness_median_ms(&harness_identity(case.harness.as_ref()))
        .ok()
        .flatten()
}
