//! Geometry of the report's SVG plots, in SVG user units. Rectangles only, so a plot needs no
//! script and renders the same in every browser.

use casebatch_bundle::BatchSummary;
use serde::Serialize;

/// Fills, one per state and failure class, so a plot reads at a glance (and a screenshot can
/// be checked for them).
pub mod colors {
    pub const SUCCEEDED: &str = "#2e7d32";
    pub const FAILED: &str = "#c62828";
    pub const CANCELLED: &str = "#616161";
    pub const QUEUED: &str = "#1565c0";
    pub const RUNNING: &str = "#f9a825";
    pub const INFRA: &str = "#ef6c00";
    pub const CONFIG: &str = "#00838f";
    pub const HARNESS: &str = "#ad1457";
    pub const AGENT: &str = "#4527a0";
    pub const DURATION: &str = "#6a1b9a";
}

/// Width of every plot; labels take the left part of a bar chart.
const WIDTH: u32 = 640;
const LABEL_WIDTH: u32 = 150;
const ROW: u32 = 28;
const BAR: u32 = 20;

#[derive(Debug, Serialize)]
pub struct Bar {
    pub label: String,
    pub value: usize,
    pub color: &'static str,
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

/// Horizontal bars, one row per label.
#[derive(Debug, Serialize)]
pub struct BarChart {
    pub width: u32,
    pub height: u32,
    pub label_width: u32,
    pub bars: Vec<Bar>,
}

impl BarChart {
    fn of(rows: Vec<(String, usize, &'static str)>) -> Self {
        let most = rows.iter().map(|r| r.1).max().unwrap_or(0).max(1);
        // Room after the longest bar for its count.
        let span = WIDTH - LABEL_WIDTH - 60;
        let bars = rows
            .into_iter()
            .enumerate()
            .map(|(i, (label, value, color))| Bar {
                label,
                value,
                color,
                x: LABEL_WIDTH,
                y: i as u32 * ROW + (ROW - BAR) / 2,
                // A non-zero count is never drawn as nothing.
                width: ((value as u64 * span as u64 / most as u64) as u32)
                    .max(u32::from(value > 0) * 2),
                height: BAR,
            })
            .collect::<Vec<_>>();
        Self {
            width: WIDTH,
            height: bars.len() as u32 * ROW,
            label_width: LABEL_WIDTH,
            bars,
        }
    }
}

/// Cases by state, in lifecycle order; states with no case are left out.
pub fn outcome_bars(s: &BatchSummary) -> BarChart {
    let states = [
        ("succeeded", colors::SUCCEEDED),
        ("failed", colors::FAILED),
        ("cancelled", colors::CANCELLED),
        ("retrying", colors::RUNNING),
        ("running", colors::RUNNING),
        ("queued", colors::QUEUED),
    ];
    BarChart::of(
        states
            .into_iter()
            .filter(|(state, _)| s.count(state) > 0)
            .map(|(state, color)| (state.to_owned(), s.count(state), color))
            .collect(),
    )
}

/// Failed cases by the class of their deciding failure (the stage × class table has the rest).
pub fn class_bars(s: &BatchSummary) -> BarChart {
    let mut by_class = std::collections::BTreeMap::<&str, usize>::new();
    for (key, n) in &s.failures_by_stage_class {
        let class = key.rsplit('/').next().unwrap_or(key);
        *by_class.entry(class).or_default() += n;
    }
    let color = |class: &str| match class {
        "infra" => colors::INFRA,
        "config" => colors::CONFIG,
        "harness" => colors::HARNESS,
        _ => colors::AGENT,
    };
    BarChart::of(
        ["infra", "config", "harness", "agent"]
            .into_iter()
            .filter_map(|c| by_class.get(c).map(|n| (c.to_owned(), *n, color(c))))
            .collect(),
    )
}

/// Attempt durations in equal-width bins from 0 to the longest.
#[derive(Debug, Serialize)]
pub struct Histogram {
    pub width: u32,
    pub height: u32,
    /// Height of the plotting area above the axis labels.
    pub plot_height: u32,
    pub bars: Vec<Bar>,
    /// Upper end of the last bin, in seconds (the axis's right label).
    pub max_seconds: String,
    pub n: usize,
}

const BINS: u64 = 12;
const HIST_HEIGHT: u32 = 160;

pub fn duration_histogram(ms: &[u64]) -> Option<Histogram> {
    let longest = *ms.iter().max()?;
    let bin_ms = (longest / BINS + 1).max(1);
    let mut counts = vec![0usize; BINS as usize];
    for &d in ms {
        counts[((d / bin_ms) as usize).min(BINS as usize - 1)] += 1;
    }
    let most = *counts.iter().max().expect("12 bins") as u64;
    let slot = WIDTH / BINS as u32;
    let bars = counts
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let height = (n as u64 * u64::from(HIST_HEIGHT) / most) as u32;
            Bar {
                label: format!(
                    "{:.1}–{:.1} s",
                    (i as u64 * bin_ms) as f64 / 1000.0,
                    ((i as u64 + 1) * bin_ms) as f64 / 1000.0
                ),
                value: n,
                color: colors::DURATION,
                x: i as u32 * slot + 1,
                y: HIST_HEIGHT - height,
                width: slot - 2,
                height,
            }
        })
        .collect();
    Some(Histogram {
        width: WIDTH,
        height: HIST_HEIGHT + 20,
        plot_height: HIST_HEIGHT,
        bars,
        max_seconds: format!("{:.1} s", (BINS * bin_ms) as f64 / 1000.0),
        n: ms.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_duration_lands_in_one_bin() {
        let ms = [0, 10, 999, 1000, 12_000, 12_000];
        let h = duration_histogram(&ms).unwrap();
        assert_eq!(h.bars.iter().map(|b| b.value).sum::<usize>(), ms.len());
        // The longest are in the last bin; the fullest bin is drawn full height.
        assert_eq!(h.bars.last().unwrap().value, 2);
        assert_eq!((h.bars[0].value, h.bars[0].height), (4, HIST_HEIGHT));
        assert!(duration_histogram(&[]).is_none());
    }
}
