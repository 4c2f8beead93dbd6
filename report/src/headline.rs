//! The report's headline numbers, as the text report gives them: score means with standard
//! errors (clustered by task when tasks run several times, the unclustered figure named as
//! such), pass@k with its standard error, usage and cost in total, by task and by case, the
//! table of an epochs batch's tasks. Formatted here; the template only places them.

use casebatch_bundle::BatchSummary;
use casebatch_bundle::epochs::TaskStats;
use casebatch_bundle::mean::ScoreStat;
use casebatch_bundle::stats::{BatchStats, ScoresOver};
use casebatch_proto::Usage;
use serde::Serialize;

/// Task rows beyond this many are left to `batch_summary.json` (`stats.tasks.rows`).
pub const MAX_TASK_ROWS: usize = 2000;

/// One score's mean, as the headline or as the unclustered figure beside it.
#[derive(Debug, Serialize)]
pub struct ScoreRow {
    pub name: String,
    /// Empty for the headline; says what the figure is otherwise.
    pub qualifier: &'static str,
    pub mean: String,
    /// `None` below two values.
    pub stderr: Option<String>,
    /// What the values are, and what that means for the standard error.
    pub over: String,
}

/// The headline score means, then (with epochs) the unclustered ones, named as such.
pub fn score_rows(st: &BatchStats) -> Vec<ScoreRow> {
    let row = |name: &String, s: &ScoreStat, qualifier, over: String| ScoreRow {
        name: name.clone(),
        qualifier,
        mean: format!("{:.3}", s.mean),
        stderr: s.stderr.map(|e| format!("{e:.3}")),
        over,
    };
    let headline = st.scores.iter().map(|(name, s)| {
        let over = match st.scores_over {
            ScoresOver::Cases => format!("n={} cases", s.n),
            ScoresOver::Tasks => format!(
                "n={} tasks: each task's mean over its runs, the standard error clustered by task",
                s.n
            ),
        };
        row(name, s, "", over)
    });
    let unclustered = st.scores_unclustered.iter().map(|(name, s)| {
        let over = format!(
            "n={} runs taken as independent, which a task's runs are not: this standard error \
             is too small",
            s.n
        );
        row(name, s, "over runs, unclustered", over)
    });
    headline.chain(unclustered).collect()
}

/// pass@k for one k, in percent.
#[derive(Debug, Serialize)]
pub struct PassAtKRow {
    pub k: u32,
    pub mean: Option<String>,
    pub stderr: Option<String>,
    pub of: usize,
    pub denominator: String,
}

pub fn pass_at_k_rows(t: &TaskStats) -> Vec<PassAtKRow> {
    t.pass_at_k
        .iter()
        .map(|p| PassAtKRow {
            k: p.k,
            mean: p.mean.map(percent),
            stderr: p.stderr.map(percent),
            of: p.of,
            denominator: p.denominator.clone(),
        })
        .collect()
}

/// What the batch's attempts reported they consumed: the total, and each case's share (in
/// the order of the summary's rows), one column per name reported anywhere.
#[derive(Debug, Serialize)]
pub struct UsageTable {
    pub names: Vec<String>,
    pub total: Vec<String>,
    /// Cases that reported any usage.
    pub cases: usize,
    pub by_case: Vec<Vec<String>>,
}

/// `None` when no attempt reported usage.
pub fn usage_table(s: &BatchSummary) -> Option<UsageTable> {
    let total = s.usage.as_ref()?;
    let names: Vec<String> = total.0.keys().cloned().collect();
    Some(UsageTable {
        total: cells(&names, Some(total)),
        cases: s.rows.iter().filter(|r| r.usage.is_some()).count(),
        by_case: s
            .rows
            .iter()
            .map(|r| cells(&names, r.usage.as_ref()))
            .collect(),
        names,
    })
}

/// An epochs batch's tasks, one row each.
#[derive(Debug, Serialize)]
pub struct TaskTable {
    /// The k of each pass@k column.
    pub ks: Vec<u32>,
    /// The score of each score column.
    pub scores: Vec<String>,
    /// The usage name of each usage column.
    pub usage: Vec<String>,
    pub rows: Vec<TaskLine>,
    /// Tasks past [`MAX_TASK_ROWS`], not shown.
    pub left_out: usize,
}

#[derive(Debug, Serialize)]
pub struct TaskLine {
    pub task_id: String,
    pub epochs: u32,
    pub finished: u32,
    pub passed: u32,
    pub reruns: u32,
    /// Empty where the task has fewer finished runs than k.
    pub pass_at_k: Vec<String>,
    /// `mean ± standard error` over the task's runs, empty where none reported the score.
    pub scores: Vec<String>,
    pub usage: Vec<String>,
}

pub fn task_table(t: &TaskStats, usage: &[String]) -> TaskTable {
    let ks: Vec<u32> = t.pass_at_k.iter().map(|p| p.k).collect();
    let mut scores: Vec<String> = t
        .rows
        .iter()
        .flat_map(|r| r.scores.keys().cloned())
        .collect();
    scores.sort();
    scores.dedup();
    let rows = t
        .rows
        .iter()
        .take(MAX_TASK_ROWS)
        .map(|r| TaskLine {
            task_id: r.task_id.clone(),
            epochs: r.epochs,
            finished: r.finished,
            passed: r.passed,
            reruns: r.reruns,
            pass_at_k: (0..ks.len())
                .map(|i| {
                    r.pass_at_k
                        .get(i)
                        .map(|x| format!("{x:.2}"))
                        .unwrap_or_default()
                })
                .collect(),
            scores: scores
                .iter()
                .map(|name| match r.scores.get(name) {
                    Some(s) => match s.stderr {
                        Some(e) => format!("{:.3} ± {e:.3}", s.mean),
                        None => format!("{:.3}", s.mean),
                    },
                    None => String::new(),
                })
                .collect(),
            usage: cells(usage, r.usage.as_ref()),
        })
        .collect();
    TaskTable {
        ks,
        scores,
        usage: usage.to_vec(),
        rows,
        left_out: t.rows.len().saturating_sub(MAX_TASK_ROWS),
    }
}

/// `names`' values in `usage`, empty where it has none.
fn cells(names: &[String], usage: Option<&Usage>) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            usage
                .and_then(|u| u.0.get(name))
                .map(|x| number(*x))
                .unwrap_or_default()
        })
        .collect()
}

/// `0.4` as `40.0%`.
fn percent(share: f64) -> String {
    format!("{:.1}%", 100.0 * share)
}

/// Whole numbers as such (token counts), the rest to four decimals at most (costs), as the
/// text report prints usage.
pub fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        let s = format!("{x:.4}");
        s.trim_end_matches('0').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_reads_as_the_text_report_prints_it() {
        assert_eq!(number(12000.0), "12000");
        assert_eq!(number(1.25), "1.25");
        assert_eq!(number(0.123456), "0.1235");
        assert_eq!(percent(0.5), "50.0%");
    }
}
