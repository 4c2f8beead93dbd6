//! A mean with its standard error: what a batch's and a task's scores are reported as.

use serde::{Deserialize, Serialize};

/// Mean of one numeric score over the cases that report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ScoreStat {
    pub n: usize,
    pub mean: f64,
    /// Standard error of the mean (sample standard deviation / √n); `None` below 2 cases.
    pub stderr: Option<f64>,
}

/// The mean of `xs` (not empty) and its standard error.
pub(crate) fn mean_and_stderr(xs: &[f64]) -> ScoreStat {
    let n = xs.len();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let stderr = (n >= 2).then(|| {
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        (var / n as f64).sqrt()
    });
    ScoreStat { n, mean, stderr }
}
