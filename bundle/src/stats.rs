//! The numbers eval engineers compare batches by: pass rates with their denominators named,
//! score means with standard errors, attempt duration percentiles. Pure: computed from the
//! records a bundle holds.

use casebatch_proto::CaseState;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use casebatch_proto::{FailureClass, Stage};

use crate::mean::{ScoreStat, mean_and_stderr};
use crate::{AttemptRecord, CaseResult};

/// A share of cases, with what it is a share of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Rate {
    pub passed: usize,
    pub of: usize,
    /// What `of` counts, in words (the denominator named).
    pub denominator: String,
    /// `passed / of`; `None` when `of` is 0.
    pub rate: Option<f64>,
}

impl Rate {
    fn new(passed: usize, of: usize, denominator: &str) -> Self {
        Self {
            passed,
            of,
            denominator: denominator.into(),
            rate: (of > 0).then(|| passed as f64 / of as f64),
        }
    }
}

/// Percentiles of durations, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Durations {
    pub n: usize,
    pub p50_ms: u64,
    pub p90_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
}

impl Durations {
    /// `None` without any value.
    pub fn of(mut ms: Vec<u64>) -> Option<Self> {
        ms.sort_unstable();
        let max_ms = *ms.last()?;
        Some(Self {
            n: ms.len(),
            p50_ms: percentile(&ms, 50),
            p90_ms: percentile(&ms, 90),
            p99_ms: percentile(&ms, 99),
            max_ms,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchStats {
    /// Succeeded among the cases that finished (succeeded or failed).
    pub pass_rate: Rate,
    /// The same with infra failures left out: what the agent scored, not the platform.
    pub pass_rate_excluding_infra: Rate,
    /// By score name, the headline mean and standard error (what `scores_over` says they are
    /// over): over the latest result of every case that has it as a number, or, when some
    /// task runs several times (`epochs`), over tasks (`tasks.scores`: each task's mean over
    /// its runs, the standard error clustered by task).
    pub scores: BTreeMap<String, ScoreStat>,
    /// What each value behind `scores` is: a case, or a task's mean over its runs.
    #[serde(default)]
    pub scores_over: ScoresOver,
    /// With epochs only: the mean over every run, its standard error computed as if the runs
    /// were independent samples. They are not (a task's runs share the task), so this standard
    /// error is too small; it is kept for comparison, named so that it is not read as the
    /// batch's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scores_unclustered: BTreeMap<String, ScoreStat>,
    /// Attempts (dispatch to end) with both ends recorded, speculative losers excluded;
    /// `None` without any.
    pub durations: Option<Durations>,
    /// By stage, in pipeline order (`provision` … `cleanup`), over every timed run of it in
    /// the batch's attempts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stage_durations: BTreeMap<Stage, Durations>,
    /// By task, when some task runs several times (`epochs`): pass@k and score means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Box<crate::epochs::TaskStats>>,
}

/// What the values behind a batch's headline score means are.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ScoresOver {
    /// One value per case: no task runs more than once.
    #[default]
    Cases,
    /// One value per task, its mean over its runs: the standard error is clustered by task.
    Tasks,
}

/// What the batch files need from its attempt records, counted one record at a time: the
/// closing write of a large batch streams the records to disk and keeps only this.
#[derive(Debug, Default)]
pub struct AttemptTally {
    pub total: usize,
    pub adopted: usize,
    pub speculative_losers: usize,
    pub stranded: usize,
    /// Attempts kept as evidence whose runtime held a job for them.
    pub jobs_paid_twice: usize,
    /// Dispatch to end, speculative losers left out.
    durations_ms: Vec<u64>,
    stage_ms: BTreeMap<Stage, Vec<u64>>,
}

impl AttemptTally {
    pub fn of(attempts: &[AttemptRecord]) -> Self {
        let mut tally = Self::default();
        attempts.iter().for_each(|a| tally.add(a));
        tally
    }

    pub fn add(&mut self, a: &AttemptRecord) {
        let s = &a.summary;
        self.total += 1;
        self.adopted += usize::from(s.adopted);
        self.speculative_losers += usize::from(s.speculative_loser);
        self.stranded += usize::from(s.stranded);
        self.jobs_paid_twice += usize::from(s.is_evidence_only() && a.held_job == Some(true));
        if let Some(ms) = s.duration_ms().filter(|_| !s.speculative_loser) {
            self.durations_ms.push(ms);
        }
        // One figure per stage and attempt: a stage that ran several times (a wait watched
        // by `start`, then by `settle`, or taken over after an outage) counts whole.
        let mut per_stage: BTreeMap<Stage, u64> = BTreeMap::new();
        for t in &a.stages {
            *per_stage.entry(t.stage).or_default() += t.duration_ms;
        }
        for (stage, ms) in per_stage {
            self.stage_ms.entry(stage).or_default().push(ms);
        }
    }
}

impl BatchStats {
    pub fn of(results: &[Option<CaseResult>], attempts: &[AttemptRecord]) -> Self {
        Self::of_tally(results, AttemptTally::of(attempts))
    }

    /// [`BatchStats::of`] with the attempts already counted.
    pub fn of_tally(results: &[Option<CaseResult>], attempts: AttemptTally) -> Self {
        let finished: Vec<&CaseResult> = results
            .iter()
            .flatten()
            .filter(|r| matches!(r.state, CaseState::Succeeded | CaseState::Failed))
            .collect();
        let passed = finished
            .iter()
            .filter(|r| r.state == CaseState::Succeeded)
            .count();
        let infra = finished
            .iter()
            .filter(|r| {
                r.state == CaseState::Failed
                    && r.failure
                        .as_ref()
                        .is_some_and(|f| f.class == FailureClass::Infra)
            })
            .count();

        let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in results.iter().flatten() {
            for (name, v) in &r.scores {
                if let Some(x) = v.as_f64() {
                    values.entry(name.clone()).or_default().push(x);
                }
            }
        }

        Self {
            pass_rate: Rate::new(
                passed,
                finished.len(),
                "finished cases (succeeded + failed)",
            ),
            pass_rate_excluding_infra: Rate::new(
                passed,
                finished.len() - infra,
                "finished cases without an infra failure",
            ),
            scores: values
                .into_iter()
                .map(|(name, xs)| (name, mean_and_stderr(&xs)))
                .collect(),
            scores_over: ScoresOver::Cases,
            scores_unclustered: BTreeMap::new(),
            durations: Durations::of(attempts.durations_ms),
            stage_durations: attempts
                .stage_ms
                .into_iter()
                .filter_map(|(stage, ms)| Some((stage, Durations::of(ms)?)))
                .collect(),
            tasks: None,
        }
    }

    /// The same with the batch's tasks, when some task runs several times: the headline score
    /// means become the tasks' (clustered by task), and the means over runs are kept as
    /// `scores_unclustered`.
    pub fn with_tasks(self, tasks: Option<crate::epochs::TaskStats>) -> Self {
        let Some(tasks) = tasks else {
            return self;
        };
        Self {
            scores: tasks.scores.clone(),
            scores_over: ScoresOver::Tasks,
            scores_unclustered: self.scores,
            tasks: Some(Box::new(tasks)),
            ..self
        }
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: usize) -> u64 {
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epochs::TaskStats;
    use crate::epochs::tests::{BY_HAND, batch, close};

    #[test]
    fn the_standard_error_is_the_sample_deviation_over_root_n() {
        let s = mean_and_stderr(&[1.0, 0.0, 1.0, 0.0]);
        assert_eq!(s.mean, 0.5);
        // sample variance 1/3, so √(1/3 / 4)
        assert!((s.stderr.unwrap() - (1.0f64 / 12.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_and_stderr(&[0.7]).stderr, None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(
            (percentile(&v, 50), percentile(&v, 90), percentile(&v, 99)),
            (50, 90, 99)
        );
        assert_eq!(percentile(&[7], 99), 7);
        assert_eq!(percentile(&[1, 2, 3], 50), 2);
    }

    #[test]
    fn the_headline_standard_error_of_an_epochs_batch_is_clustered_by_task() {
        let (cases, results) = batch(&BY_HAND);
        let stats = BatchStats::of(&results, &[]).with_tasks(TaskStats::of(&cases, &results));
        assert_eq!(stats.scores_over, ScoresOver::Tasks);
        let headline = &stats.scores["acc"];
        assert_eq!(headline.n, 3, "one value per task");
        assert!(close(headline.mean, 1.0 / 3.0));
        assert!(
            close(headline.stderr.unwrap(), 7f64.sqrt() / 12.0),
            "{headline:?}"
        );
        let tasks = stats.tasks.as_ref().unwrap();
        assert_eq!(
            &tasks.scores["acc"], headline,
            "the per-task figure is the headline"
        );
        let unclustered = &stats.scores_unclustered["acc"];
        assert_eq!(unclustered.n, 12);
        assert!(close(unclustered.stderr.unwrap(), (2.0f64 / 99.0).sqrt()));

        // Cross-check against the cluster-robust (CR1) standard error of the mean over runs,
        // √(C/(C−1) · Σ_c (Σ_i (x_ci − x̄))²) / N: with equal runs per task it is the standard
        // error of the tasks' means.
        let runs: Vec<f64> = BY_HAND
            .iter()
            .flat_map(|(_, xs)| xs.iter().copied())
            .collect();
        let mean = runs.iter().sum::<f64>() / runs.len() as f64;
        let c = BY_HAND.len() as f64;
        let sum_sq: f64 = BY_HAND
            .iter()
            .map(|(_, xs)| xs.iter().map(|x| x - mean).sum::<f64>().powi(2))
            .sum();
        let cr1 = (c / (c - 1.0) * sum_sq).sqrt() / runs.len() as f64;
        assert!(close(cr1, headline.stderr.unwrap()), "{cr1}");
    }

    #[test]
    fn without_epochs_the_headline_is_over_cases() {
        let (cases, results) = batch(&[("A", &[1.0]), ("B", &[0.0])]);
        // Every task runs once: no task table, and the cases are the samples.
        let cases: Vec<_> = cases
            .into_iter()
            .map(|c| casebatch_manifest::CaseHead { epoch: None, ..c })
            .collect();
        let tasks = TaskStats::of(&cases, &results);
        assert!(tasks.is_none());
        let stats = BatchStats::of(&results, &[]).with_tasks(tasks);
        assert_eq!(stats.scores_over, ScoresOver::Cases);
        assert!(stats.scores_unclustered.is_empty());
        // Sample deviation of {1, 0} is √0.5; over √2 that is 0.5.
        assert!(close(stats.scores["acc"].stderr.unwrap(), 0.5));
    }
}
