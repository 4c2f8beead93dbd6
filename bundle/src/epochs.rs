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
    /// estimate over the tasks with at least k finished runs, with its standard error.
    pub pass_at_k: Vec<PassAtK>,
    /// By score name: the mean over tasks of each task's mean score, with the standard error
    /// across tasks (the runs of one task are not independent samples of the batch).
    pub scores: BTreeMap<String, ScoreStat>,
    /// Runs counted above that are re-runs of a run that had finished (`retry-failed` of
    /// another batch, `batch rerun` or `resume --retry-failed` of this one): a failed run run
    /// again and passing counts as a pass, so pass@k is not that of independent runs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reruns: usize,
    pub rows: Vec<TaskRow>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The batch's pass@k, with its denominator named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PassAtK {
    pub k: u32,
    /// `None` when no task has k finished runs.
    pub mean: Option<f64>,
    /// Standard error of `mean`: the sample standard deviation of the tasks' pass@k over
    /// √`of` (each task one sample, as for the scores by task); `None` below 2 tasks.
    #[serde(default)]
    pub stderr: Option<f64>,
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
    /// Of `finished`, the runs that are re-runs of a run that had finished (as the batch's
    /// `reruns` counts them).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub reruns: u32,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
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
                let stat = (!of.is_empty()).then(|| mean_and_stderr(&of));
                PassAtK {
                    k,
                    mean: stat.as_ref().map(|s| s.mean),
                    stderr: stat.and_then(|s| s.stderr),
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
            reruns: 0,
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

    /// What a reader of pass@k must be told when re-runs are inside it (`None`: none are).
    pub fn reruns_note(&self) -> Option<String> {
        let tasks = self.rows.iter().filter(|r| r.reruns > 0).count();
        (self.reruns > 0).then(|| {
            format!(
                "pass@k counts {} re-run run(s) of {tasks} task(s), run again by retry-failed or \
                 rerun after an earlier outcome: a run chosen again because it failed can only \
                 raise pass@k, so it reads higher than for independent runs",
                self.reruns
            )
        })
    }

    /// Counts the finished runs that are re-runs (`reran`: one flag per case, in plan order)
    /// into their task's row and the batch's total.
    pub fn add_reruns<C: CaseIdentity>(
        &mut self,
        cases: &[C],
        results: &[Option<CaseResult>],
        reran: &[bool],
    ) {
        let mut by_task: BTreeMap<&str, u32> = BTreeMap::new();
        for ((case, result), reran) in cases.iter().zip(results).zip(reran) {
            let finished = result
                .as_ref()
                .is_some_and(|r| matches!(r.state, CaseState::Succeeded | CaseState::Failed));
            if *reran && finished {
                let task = case.epoch().map_or(case.case_id(), |e| &e.task_id);
                *by_task.entry(task).or_default() += 1;
            }
        }
        for row in &mut self.rows {
            row.reruns = by_task.remove(row.task_id.as_str()).unwrap_or(0);
        }
        self.reruns = self.rows.iter().map(|r| r.reruns as usize).sum();
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
        reruns: 0,
    }
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// Runs of tasks, in plan order: `(task, score of each run)`; a run with score 1 passed.
    pub(crate) fn batch(
        tasks: &[(&str, &[f64])],
    ) -> (Vec<casebatch_manifest::CaseHead>, Vec<Option<CaseResult>>) {
        let mut cases = Vec::new();
        let mut results = Vec::new();
        for (task, scores) in tasks {
            for (i, score) in scores.iter().enumerate() {
                let case_id = format!("{task}#{}", i + 1);
                cases.push(casebatch_manifest::CaseHead {
                    case_id: case_id.clone(),
                    epoch: Some(casebatch_manifest::model::Epoch {
                        task_id: task.to_string(),
                        epoch: i as u32 + 1,
                        of: scores.len() as u32,
                    }),
                    case_dir: case_id.clone(),
                    runtime: casebatch_manifest::model::RuntimeKind::Fake,
                    runtime_name: None,
                    runtime_spread: Vec::new(),
                });
                let state = if *score >= 1.0 { "succeeded" } else { "failed" };
                results.push(Some(
                    serde_json::from_value(serde_json::json!({
                        "schema_version": "1", "case_id": case_id, "case_dir": case_id,
                        "state": state, "attempts": 1, "actor_status": "finished",
                        "exit_code": 0, "evaluation_configured": false, "verdict": null,
                        "cleanup_confirmed": true, "failure": null, "collect_failure": null,
                        "adopted": false, "scores": {"acc": score},
                    }))
                    .unwrap(),
                ));
            }
        }
        (cases, results)
    }

    pub(crate) fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// Three tasks of four runs: A passes 3 (mean 3/4), B none (0), C one (1/4). Over tasks:
    /// mean 1/3, deviations 5/12, −4/12, −1/12, whose squares sum to 42/144; the sample
    /// variance is 21/144 and the standard error √(21/144 / 3) = √7/12 ≈ 0.2205. Over the 12
    /// runs as if independent: 4 ones, sample variance (4·(2/3)² + 8·(1/3)²)/11 = 24/99, so
    /// √(24/99 / 12) = √(2/99) ≈ 0.1421, a third too small.
    pub(crate) const BY_HAND: [(&str, &[f64]); 3] = [
        ("A", &[1.0, 1.0, 0.0, 1.0]),
        ("B", &[0.0, 0.0, 0.0, 0.0]),
        ("C", &[1.0, 0.0, 0.0, 0.0]),
    ];

    #[test]
    fn pass_at_k_carries_its_standard_error_across_tasks() {
        let (cases, results) = batch(&BY_HAND);
        let t = TaskStats::of(&cases, &results).unwrap();
        let at = |k: usize| {
            (
                t.pass_at_k[k - 1].mean.unwrap(),
                t.pass_at_k[k - 1].stderr.unwrap(),
            )
        };
        // pass@1 by task is its share of passes (3/4, 0, 1/4): the scores' figures.
        let (mean, se) = at(1);
        assert!(
            close(mean, 1.0 / 3.0) && close(se, 7f64.sqrt() / 12.0),
            "{mean} {se}"
        );
        // pass@2: A 1 − C(1,2)/C(4,2) = 1, B 0, C 1 − C(3,2)/C(4,2) = 1/2. Mean 1/2, sample
        // variance (1/4 + 1/4 + 0)/2 = 1/4, standard error √(1/4 / 3) = √(1/12).
        let (mean, se) = at(2);
        assert!(
            close(mean, 0.5) && close(se, (1.0f64 / 12.0).sqrt()),
            "{mean} {se}"
        );
        // pass@4: 1, 0, 1. Mean 2/3, sample variance (1/9 + 4/9 + 1/9)/2 = 1/3, √(1/9) = 1/3.
        let (mean, se) = at(4);
        assert!(
            close(mean, 2.0 / 3.0) && close(se, 1.0 / 3.0),
            "{mean} {se}"
        );

        // One task is one sample: no standard error.
        let (cases, results) = batch(&[("A", &[1.0, 0.0])]);
        let t = TaskStats::of(&cases, &results).unwrap();
        assert_eq!(
            (t.pass_at_k[0].mean, t.pass_at_k[0].stderr),
            (Some(0.5), None)
        );
    }

    #[test]
    fn re_runs_are_counted_by_task_among_finished_runs() {
        let (cases, mut results) = batch(&BY_HAND);
        // C#1 and C#2 re-ran; A#4 was picked again but has not finished.
        let mut reran = vec![false; 12];
        reran[8] = true;
        reran[9] = true;
        reran[3] = true;
        results[3] = None;
        let mut t = TaskStats::of(&cases, &results).unwrap();
        t.add_reruns(&cases, &results, &reran);
        let by_task: Vec<u32> = t.rows.iter().map(|r| r.reruns).collect();
        assert_eq!(by_task, [0, 0, 2]);
        assert_eq!(t.reruns, 2);
    }
}
