//! The paired bootstrap: how sure a difference between two batches is, from the cases both
//! finished. Each case's difference (b − a) is one sample; resampling cases with replacement
//! keeps every case's pair together, so a task that is hard in both batches does not widen
//! the interval the way two independent samples would.

use casebatch_views::compare::{Interval, PairedDelta};

/// Enough resamples for a stable 2.5th/97.5th percentile, cheap for 100,000 pairs.
pub const RESAMPLES: u32 = 2000;

/// Mean of `a`, of `b`, their difference, and its 95 % interval over `pairs` (a, b).
pub fn paired_delta(pairs: &[(f64, f64)]) -> PairedDelta {
    let n = pairs.len();
    if n == 0 {
        return PairedDelta::default();
    }
    let mean = |f: fn(&(f64, f64)) -> f64| pairs.iter().map(f).sum::<f64>() / n as f64;
    let (mean_a, mean_b) = (mean(|p| p.0), mean(|p| p.1));
    let diffs: Vec<f64> = pairs.iter().map(|(a, b)| b - a).collect();
    PairedDelta {
        n,
        mean_a,
        mean_b,
        delta: mean_b - mean_a,
        ci95: (n >= 2).then(|| interval(&diffs, RESAMPLES)),
    }
}

/// The percentile interval of the mean of `samples` over `resamples` resamples. Seeded by a
/// constant: a report read twice says the same thing.
fn interval(samples: &[f64], resamples: u32) -> Interval {
    let n = samples.len();
    let mut rng = SplitMix64(0x6361_7365_6261_7463); // "casebatc"
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| {
            let sum: f64 = (0..n).map(|_| samples[rng.below(n)]).sum();
            sum / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * f64::from(resamples)) as usize).min(means.len() - 1)];
    Interval {
        low: at(0.025),
        high: at(0.975),
        resamples,
    }
}

/// A small, well-mixed generator; nothing here needs more.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias is below 2⁻⁴⁰ for any batch size).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_difference_in_every_case_is_certain() {
        let d = paired_delta(&[(0.0, 1.0), (0.5, 1.5), (1.0, 2.0)]);
        assert_eq!((d.n, d.delta), (3, 1.0));
        let ci = d.ci95.unwrap();
        assert_eq!((ci.low, ci.high), (1.0, 1.0));
    }

    #[test]
    fn the_interval_holds_the_delta_and_narrows_with_more_cases() {
        // b passes 3 of every 5 cases a failed, and fails 1 of every 5 a passed.
        let block = [(0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)];
        let few: Vec<_> = block.iter().copied().cycle().take(20).collect();
        let many: Vec<_> = block.iter().copied().cycle().take(2000).collect();
        let (f, m) = (paired_delta(&few), paired_delta(&many));
        assert!((f.delta - 0.4).abs() < 1e-12 && (m.delta - 0.4).abs() < 1e-12);
        let (fi, mi) = (f.ci95.unwrap(), m.ci95.unwrap());
        for i in [&fi, &mi] {
            assert!(i.low < 0.4 && 0.4 < i.high, "{i:?}");
        }
        assert!(mi.high - mi.low < (fi.high - fi.low) / 4.0, "{fi:?} {mi:?}");
        // The standard error of 2,000 such pairs is about 0.018: a 95 % interval about ±0.035.
        assert!(mi.high - mi.low > 0.05 && mi.high - mi.low < 0.09, "{mi:?}");
    }

    #[test]
    fn one_pair_or_none_has_no_interval_and_the_same_input_gives_the_same_interval() {
        assert_eq!(paired_delta(&[]).n, 0);
        assert!(paired_delta(&[(0.0, 1.0)]).ci95.is_none());
        let pairs = [(0.0, 1.0), (1.0, 1.0), (1.0, 0.0), (0.3, 0.9)];
        assert_eq!(paired_delta(&pairs), paired_delta(&pairs));
    }
}
