//! Axes for the report's plots: where a plot's frame is, its ticks at round values, and what
//! each axis measures, so every plot can be read without its caption.

use serde::Serialize;

/// One tick: its position along the axis (SVG user units) and its label.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tick {
    pub at: u32,
    pub label: String,
}

/// A plot's frame: the plotting area's edges, the ticks on the bottom (x) and left (y) axes,
/// and their titles. The template draws it the same way for every plot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Axes {
    pub left: u32,
    pub right: u32,
    pub top: u32,
    pub bottom: u32,
    pub x_ticks: Vec<Tick>,
    pub y_ticks: Vec<Tick>,
    pub x_title: String,
    pub y_title: String,
}

/// A step of 1, 2 or 5 times a power of ten that splits `most` into at most `parts` parts,
/// and the round value the axis ends at (at least `most`, at least one step).
pub fn round_scale(most: f64, parts: u32) -> (f64, f64) {
    let rough = (most / f64::from(parts)).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * power);
    let end = ((most / step).ceil() * step).max(step);
    (step, end)
}

/// Counts from 0 to a round end at or above `most`, in whole steps: `(end, step)`.
pub fn count_scale(most: usize) -> (usize, usize) {
    let (step, end) = round_scale(most.max(1) as f64, 4);
    let step = (step.round() as usize).max(1);
    (end.round() as usize, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_end_on_a_round_value_at_or_above_the_most() {
        assert_eq!(count_scale(1), (1, 1));
        assert_eq!(count_scale(3), (3, 1));
        assert_eq!(count_scale(7), (8, 2));
        assert_eq!(count_scale(10), (10, 5));
        assert_eq!(count_scale(37), (40, 10));
        assert_eq!(count_scale(0), (1, 1));
        let (step, end) = round_scale(12.3, 4);
        assert_eq!((step, end), (5.0, 15.0));
        let (step, end) = round_scale(0.42, 4);
        assert!(
            (step - 0.2).abs() < 1e-12 && (end - 0.6).abs() < 1e-12,
            "{step} {end}"
        );
    }
}
