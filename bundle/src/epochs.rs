//! Tasks that run several times (`epochs`): each task's pass@k and score means over its runs,
//! and the batch's means of those. Agent runs are noisy; one run per task says little, and
//! pass@k (the chance that at least one of k runs passes) is what eval teams compare.
//! Pure: computed from the plan and the cases' latest results.

use casebatch_proto::CaseState;
use std::collections::BTreeMap;

use casebatch_manifest::model::CaseIdentity;
use serde::{Deserialize, Serialize};

use crate::CaseResult;
use crate::mean::{ScoreStat, mean_and_stderr};

/// What a run counts as: passed when its case succeeded; finished when it succeeded or
/// failed (a queued or cancelled run is not a sample).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskStats {
    /// Tasks in the batch (a task that runs once counts, with one run).
    pub tasks: usize,
    /// For k = 1 up to the most runs any task has: the mean of each task's unbiased pass@k
    /// estimate over the tasks with at least k finished runs.
    pub pass_at_k: Vec<PassAtK>,
    /// By score name: the mean over tasks of each task's mean score, with the standard error
    /// across tasks (the runs of one task are not independent samples of the batch).
    pub scores: BTreeMap<String, ScoreStat>,
    pub rows: Vec<TaskRow>,
}

/// The batch's pass@k, with its denominator named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PassAtK {
    pub k: u32,
    /// `None` when no task has k finished runs.
    pub mean: Option<f64>,
    /// How many tasks the mean is over.
    pub of: usize,
    pub denominator: String,
}

/// One task over its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskRow {
    pub task_id: String,
    /// Runs planned.
    pub epochs: u32,
    /// Runs that finished (`n` of the estimator).
    pub finished: u32,
    /// Runs that passed (`c`).
    pub passed: u32,
    /// pass@k for k = 1..=finished.
    pub pass_at_k: Vec<f64>,
    /// By score name, over the runs that report it as a number.
    pub scores: BTreeMap<String, ScoreStat>,
    /// What the task's runs reported they consumed, summed (absent: none reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<casebatch_proto::Usage>,
}

/// The unbiased estimator of pass@k from `n` runs of which `c` passed: 1 − C(n−c, k)/C(n, k),
/// as the product form that neither overflows nor loses precision (Chen et al., 2021).
pub fn pass_at_k(n: u32, c: u32, k: u32) -> f64 {
    assert!(k >= 1 && k <= n && c <= n, "pass@{k} of {c}/{n}");
    if n - c < k {
        return 1.0;
    }
    1.0 - (n - c + 1..=n)
        .map(|i| 1.0 - f64::from(k) / f64::from(i))
        .product::<f64>()
}

impl TaskStats {
    /// `None` unless some task runs more than once (the batch's pass rate says it all then).
    pub fn of<C: CaseIdentity>(cases: &[C], results: &[Option<CaseResult>]) -> Option<Self> {
        if cases.iter().all(|c| c.epoch().is_none()) {
            return None;
        }
        // In plan order: a task's runs are consecutive, its first run places it.
        let mut order: Vec<&str> = Vec::new();
        let mut runs: BTreeMap<&str, (u32, Vec<Option<&CaseResult>>)> = BTreeMap::new();
        for (case, result) in cases.iter().zip(results) {
            let (task, epochs) = match case.epoch() {
                Some(e) => (e.task_id.as_str(), e.of),
                None => (case.case_id(), 1),
            };
            let entry = runs.entry(task).or_insert_with(|| {
                order.push(task);
                (epochs, Vec::new())
            });
            entry.1.push(result.as_ref());
        }
        let rows: Vec<TaskRow> = order
            .iter()
            .map(|task| {
                let (epochs, results) = &runs[task];
                task_row(task, *epochs, results)
            })
            .collect();
        let most = rows.iter().map(|r| r.finished).max().unwrap_or(0);
        let pass_at_k = (1..=most)
            .map(|k| {
                let of: Vec<f64> = rows
                    .iter()
                    .filter_map(|r| r.pass_at_k.get(k as usize - 1).copied())
                    .collect();
                PassAtK {
                    k,
                    mean: (!of.is_empty()).then(|| of.iter().sum::<f64>() / of.len() as f64),
                    of: of.len(),
                    denominator: format!("tasks with at least {k} finished run(s)"),
                }
            })
            .collect();
        let mut task_means: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for row in &rows {
            for (name, s) in &row.scores {
                task_means.entry(name.clone()).or_default().push(s.mean);
            }
        }
        Some(Self {
            tasks: rows.len(),
            pass_at_k,
            scores: task_means
                .into_iter()
                .map(|(name, xs)| (name, mean_and_stderr(&xs)))
                .collect(),
            rows,
        })
    }

    /// Sums each task's runs' usage (`rows`: the summary's, in plan order) into its row.
    pub fn add_usage<C: CaseIdentity>(&mut self, cases: &[C], rows: &[crate::SummaryRow]) {
        let mut by_task: BTreeMap<&str, casebatch_proto::Usage> = BTreeMap::new();
        for (case, row) in cases.iter().zip(rows) {
            let task = case.epoch().map_or(case.case_id(), |e| &e.task_id);
            if let Some(u) = &row.usage {
                by_task.entry(task).or_default().add(u);
            }
        }
        for row in &mut self.rows {
            row.usage = by_task.remove(row.task_id.as_str());
        }
    }
}

fn task_row(task: &str, epochs: u32, results: &[Option<&CaseResult>]) -> TaskRow {
    let finished: Vec<&CaseResult> = results
        .iter()
        .flatten()
        .copied()
        .filter(|r| matches!(r.state, CaseState::Succeeded | CaseState::Failed))
        .collect();
    let n = finished.len() as u32;
    let c = finished
        .iter()
        .filter(|r| r.state == CaseState::Succeeded)
        .count() as u32;
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in &finished {
        for (name, v) in &r.scores {
            if let Some(x) = v.as_f64() {
                values.entry(name.clone()).or_default().push(x);
            }
        }
    }
    TaskRow {
        task_id: task.to_string(),
        epochs,
        finished: n,
        passed: c,
        pass_at_k: (1..=n).map(|k| pass_at_k(n, c, k)).collect(),
        scores: values
            .into_iter()
            .map(|(name, xs)| (name, mean_and_stderr(&xs)))
            .collect(),
        usage: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C(n, k) by multiplication, for checking the product form against the definition.
    fn choose(n: u32, k: u32) -> f64 {
        if k > n {
            return 0.0;
        }
        (0..k).fold(1.0, |acc, i| acc * f64::from(n - i) / f64::from(i + 1))
    }

    #[test]
    fn pass_at_k_is_the_unbiased_estimator() {
        for n in 1..=12 {
            for c in 0..=n {
                for k in 1..=n {
                    let direct = 1.0 - choose(n - c, k) / choose(n, k);
                    let got = pass_at_k(n, c, k);
                    assert!((got - direct).abs() < 1e-12, "n={n} c={c} k={k}");
                }
            }
        }
        // By hand: 4 runs, 1 passed. pass@1 = 1/4; pass@2 = 1 − C(3,2)/C(4,2) = 1 − 3/6.
        assert_eq!(pass_at_k(4, 1, 1), 0.25);
        assert!((pass_at_k(4, 1, 2) - 0.5).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 0, 4), 0.0);
        assert_eq!(pass_at_k(4, 1, 4), 1.0);
    }
}
