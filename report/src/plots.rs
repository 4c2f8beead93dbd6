//! Geometry of the report's SVG plots, in SVG user units. Rectangles, lines and text only, so
//! a plot needs no script and renders the same in every browser. Every plot has axes
//! ([`crate::axes`]).

use casebatch_bundle::BatchSummary;
use casebatch_bundle::epochs::PassAtK;
use serde::Serialize;

use crate::axes::{Axes, Tick, count_scale};

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
    pub const PASS_AT_K: &str = "#5d4037";
}

/// Width of every plot; labels take the left part of a bar chart.
const WIDTH: u32 = 640;
const LABEL_WIDTH: u32 = 150;
const ROW: u32 = 28;
const BAR: u32 = 20;
/// Room below a plot's area for the x ticks' labels and the axis title.
const X_AXIS_ROOM: u32 = 40;
/// Room left of a vertical plot's area for the y ticks' labels and the axis title.
const Y_AXIS_ROOM: u32 = 56;

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

/// Horizontal bars, one row per label, over a count axis.
#[derive(Debug, Serialize)]
pub struct BarChart {
    pub width: u32,
    pub height: u32,
    pub label_width: u32,
    pub bars: Vec<Bar>,
    pub axes: Axes,
}

impl BarChart {
    fn of(rows: Vec<(String, usize, &'static str)>, counted: &str) -> Self {
        let most = rows.iter().map(|r| r.1).max().unwrap_or(0);
        let (end, step) = count_scale(most);
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
                width: ((value as u64 * span as u64 / end as u64) as u32)
                    .max(u32::from(value > 0) * 2),
                height: BAR,
            })
            .collect::<Vec<_>>();
        let bottom = bars.len() as u32 * ROW;
        let x_ticks = (0..=end)
            .step_by(step)
            .map(|n| Tick {
                at: LABEL_WIDTH + (n as u64 * span as u64 / end as u64) as u32,
                label: n.to_string(),
            })
            .collect();
        Self {
            width: WIDTH,
            height: bottom + X_AXIS_ROOM,
            label_width: LABEL_WIDTH,
            bars,
            axes: Axes {
                left: LABEL_WIDTH,
                right: LABEL_WIDTH + span,
                top: 0,
                bottom,
                x_ticks,
                y_ticks: Vec::new(),
                x_title: counted.into(),
                y_title: String::new(),
            },
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
        "cases",
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
        "failed cases",
    )
}

/// Attempt durations in equal-width bins from 0 to the longest, over a count axis.
#[derive(Debug, Serialize)]
pub struct Histogram {
    pub width: u32,
    pub height: u32,
    pub bars: Vec<Bar>,
    pub axes: Axes,
    pub n: usize,
}

const BINS: u64 = 12;
const HIST_HEIGHT: u32 = 160;
/// Room above a vertical plot's area, so its top tick's label is not cut.
const TOP: u32 = 8;

pub fn duration_histogram(ms: &[u64]) -> Option<Histogram> {
    let longest = *ms.iter().max()?;
    let bin_ms = (longest / BINS + 1).max(1);
    let mut counts = vec![0usize; BINS as usize];
    for &d in ms {
        counts[((d / bin_ms) as usize).min(BINS as usize - 1)] += 1;
    }
    let most = *counts.iter().max().expect("12 bins");
    let (end, step) = count_scale(most);
    let (left, bottom) = (Y_AXIS_ROOM, TOP + HIST_HEIGHT);
    let slot = (WIDTH - left - 8) / BINS as u32;
    let y_of = |n: usize| bottom - (n as u64 * u64::from(HIST_HEIGHT) / end as u64) as u32;
    let bars = counts
        .iter()
        .enumerate()
        .map(|(i, &n)| Bar {
            label: format!(
                "{:.1}–{:.1} s",
                (i as u64 * bin_ms) as f64 / 1000.0,
                ((i as u64 + 1) * bin_ms) as f64 / 1000.0
            ),
            value: n,
            color: colors::DURATION,
            x: left + i as u32 * slot + 1,
            y: y_of(n),
            width: slot - 2,
            height: bottom - y_of(n),
        })
        .collect();
    // A tick at every other bin edge: in milliseconds when the whole span is under 2 s (tenths
    // of a second would read 0.0, 0.0, 0.1), else in seconds.
    let in_ms = BINS * bin_ms < 2000;
    let x_ticks = (0..=BINS)
        .step_by(2)
        .map(|i| Tick {
            at: left + i as u32 * slot,
            label: if in_ms {
                (i * bin_ms).to_string()
            } else {
                seconds(i * bin_ms)
            },
        })
        .collect();
    let y_ticks = (0..=end)
        .step_by(step)
        .map(|n| Tick {
            at: y_of(n),
            label: n.to_string(),
        })
        .collect();
    Some(Histogram {
        width: WIDTH,
        height: bottom + X_AXIS_ROOM,
        bars,
        axes: Axes {
            left,
            right: left + BINS as u32 * slot,
            top: TOP,
            bottom,
            x_ticks,
            y_ticks,
            x_title: format!(
                "attempt duration, dispatch to end ({})",
                if in_ms { "ms" } else { "s" }
            ),
            y_title: "attempts".into(),
        },
        n: ms.len(),
    })
}

/// `12.5`: seconds to one decimal, whole seconds without one.
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        (ms / 1000).to_string()
    } else {
        format!("{:.1}", ms as f64 / 1000.0)
    }
}

/// pass@k for each k as a bar from 0 to 100 %, with its standard error as a whisker.
#[derive(Debug, Serialize)]
pub struct PassAtKPlot {
    pub width: u32,
    pub height: u32,
    pub bars: Vec<Bar>,
    /// One per bar with a standard error: the whisker from `y_low` to `y_high` at `x`.
    pub whiskers: Vec<Whisker>,
    pub axes: Axes,
}

#[derive(Debug, Serialize)]
pub struct Whisker {
    pub x: u32,
    pub y_low: u32,
    pub y_high: u32,
}

const PASS_AT_K_HEIGHT: u32 = 180;

/// `None` when no k has a mean (no task finished a run).
pub fn pass_at_k_plot(at: &[PassAtK]) -> Option<PassAtKPlot> {
    if at.iter().all(|p| p.mean.is_none()) {
        return None;
    }
    let (left, bottom) = (Y_AXIS_ROOM, TOP + PASS_AT_K_HEIGHT);
    let slot = ((WIDTH - left - 8) / at.len() as u32).min(80);
    let y_of =
        |share: f64| bottom - (share.clamp(0.0, 1.0) * f64::from(PASS_AT_K_HEIGHT)).round() as u32;
    let mut bars = Vec::new();
    let mut whiskers = Vec::new();
    for (i, p) in at.iter().enumerate() {
        let Some(mean) = p.mean else { continue };
        let x = left + i as u32 * slot + slot / 5;
        let width = slot * 3 / 5;
        bars.push(Bar {
            label: format!("pass@{}", p.k),
            value: p.of,
            color: colors::PASS_AT_K,
            x,
            y: y_of(mean),
            width,
            height: bottom - y_of(mean),
        });
        if let Some(se) = p.stderr {
            whiskers.push(Whisker {
                x: x + width / 2,
                y_low: y_of(mean - se),
                y_high: y_of(mean + se),
            });
        }
    }
    let x_ticks = at
        .iter()
        .enumerate()
        .map(|(i, p)| Tick {
            at: left + i as u32 * slot + slot / 2,
            label: p.k.to_string(),
        })
        .collect();
    let y_ticks = (0..=4)
        .map(|q| Tick {
            at: y_of(f64::from(q) / 4.0),
            label: format!("{}%", q * 25),
        })
        .collect();
    Some(PassAtKPlot {
        width: WIDTH,
        height: bottom + X_AXIS_ROOM,
        bars,
        whiskers,
        axes: Axes {
            left,
            right: left + at.len() as u32 * slot,
            top: TOP,
            bottom,
            x_ticks,
            y_ticks,
            x_title: "k (runs of a task)".into(),
            y_title: "pass@k".into(),
        },
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
        // The longest are in the last bin; the fullest bin (4) reaches the axis's top (4).
        assert_eq!(h.bars.last().unwrap().value, 2);
        assert_eq!((h.bars[0].value, h.bars[0].height), (4, HIST_HEIGHT));
        assert!(duration_histogram(&[]).is_none());
    }

    #[test]
    fn the_histogram_has_a_count_axis_and_a_seconds_axis() {
        let h = duration_histogram(&[500, 1500, 1600, 11_990]).unwrap();
        let a = &h.axes;
        // Counts: the fullest bin has 2; ticks 0, 1, 2 from the bottom up.
        let y: Vec<(&str, u32)> = a.y_ticks.iter().map(|t| (t.label.as_str(), t.at)).collect();
        assert_eq!(
            y,
            [
                ("0", a.bottom),
                ("1", a.bottom - HIST_HEIGHT / 2),
                ("2", a.top)
            ]
        );
        assert_eq!(a.y_title, "attempts");
        // Seconds: bins of 1 s (11.99 s / 12, + 1 ms), a tick every other edge.
        let x: Vec<&str> = a.x_ticks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(x, ["0", "2", "4", "6", "8", "10", "12"]);
        assert_eq!(a.x_ticks.first().unwrap().at, a.left);
        assert_eq!(a.x_ticks.last().unwrap().at, a.right);
        assert!(a.x_title.ends_with("(s)"), "{}", a.x_title);
        // A bar of 2 stands on the axis and reaches the top tick.
        let full = h.bars.iter().find(|b| b.value == 2).unwrap();
        assert_eq!((full.y, full.y + full.height), (a.top, a.bottom));
    }

    #[test]
    fn sub_second_durations_are_ticked_in_milliseconds() {
        // Bins of 10 ms (119 ms / 12, + 1 ms).
        let a = duration_histogram(&[5, 40, 119]).unwrap().axes;
        let x: Vec<&str> = a.x_ticks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(x, ["0", "20", "40", "60", "80", "100", "120"]);
        assert!(a.x_title.ends_with("(ms)"), "{}", a.x_title);
    }

    #[test]
    fn pass_at_k_bars_reach_their_share_with_a_whisker_of_one_standard_error() {
        let at = |k, mean, stderr| PassAtK {
            k,
            mean: Some(mean),
            stderr,
            of: 3,
            denominator: String::new(),
        };
        let plot = pass_at_k_plot(&[
            at(1, 0.5, Some(0.25)),
            at(2, 1.0, Some(0.5)),
            at(3, 0.0, None),
        ])
        .unwrap();
        let a = &plot.axes;
        let half = a.bottom - PASS_AT_K_HEIGHT / 2;
        assert_eq!(
            (plot.bars[0].y, plot.bars[0].height),
            (half, PASS_AT_K_HEIGHT / 2)
        );
        // 0.5 ± 0.25; 1.0 ± 0.5 is cut at 100 %. No standard error, no whisker.
        assert_eq!(plot.whiskers.len(), 2);
        let w = &plot.whiskers[0];
        assert_eq!((w.y_high, w.y_low), (a.bottom - 135, a.bottom - 45));
        assert_eq!(
            (plot.whiskers[1].y_high, plot.whiskers[1].y_low),
            (a.top, half)
        );
        let y: Vec<&str> = a.y_ticks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(y, ["0%", "25%", "50%", "75%", "100%"]);
        assert!(
            pass_at_k_plot(&[PassAtK {
                mean: None,
                ..at(1, 0.0, None)
            }])
            .is_none()
        );
    }
}
