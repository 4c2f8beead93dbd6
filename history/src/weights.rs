//! The weights math, apart from SQL so it is tested on plain numbers.

use std::collections::BTreeMap;

use crate::Weights;

/// Counted attempt durations, by batch, then by runtime (any order).
pub(crate) type Durations = BTreeMap<String, BTreeMap<String, Vec<u64>>>;

/// What a runtime weighs when nothing is known: all runtimes alike.
pub(crate) const UNIFORM: u32 = 100;
const MIN_WEIGHT: u32 = 1;
const MAX_WEIGHT: u32 = 10_000;

/// The median of `sorted` (ascending), or `None` when empty. An even count takes the mean of
/// the two middle values, rounded down.
pub(crate) fn median_u64(sorted: &[u64]) -> Option<u64> {
    let n = sorted.len();
    let hi = *sorted.get(n / 2)?;
    if n % 2 == 1 {
        return Some(hi);
    }
    let lo = sorted[n / 2 - 1];
    Some(lo / 2 + hi / 2 + (lo % 2 + hi % 2) / 2)
}

/// The median of `sorted` as a real number: exact for the ratios of the weights.
fn median_f64(sorted: &[u64]) -> Option<f64> {
    let n = sorted.len();
    let hi = *sorted.get(n / 2)? as f64;
    if n % 2 == 1 {
        return Some(hi);
    }
    Some((sorted[n / 2 - 1] as f64 + hi) / 2.0)
}

/// Per-runtime weights from the durations of `batches`. See [`crate::HistoryIndex::weights`]
/// for the rule.
pub(crate) fn weights(runtimes: &[String], batches: &Durations) -> Weights {
    // Once per name, in the order first given.
    let mut names: Vec<&String> = Vec::with_capacity(runtimes.len());
    for r in runtimes {
        if !names.contains(&r) {
            names.push(r);
        }
    }

    // Per runtime: sum and count of its relative durations (1.0 = the batch's mean).
    let mut rel: BTreeMap<&str, (f64, u32)> = BTreeMap::new();
    let mut batches_used = 0;
    for by_runtime in batches.values() {
        let medians: Vec<(&str, f64)> = names
            .iter()
            .filter_map(|name| {
                let mut d = by_runtime.get(name.as_str())?.clone();
                d.sort_unstable();
                Some((name.as_str(), median_f64(&d)?))
            })
            .collect();
        if medians.len() < 2 {
            continue;
        }
        let mean = medians.iter().map(|(_, m)| m).sum::<f64>() / medians.len() as f64;
        // All of zero length: no ratio to learn from.
        if mean <= 0.0 {
            continue;
        }
        batches_used += 1;
        for (name, m) in medians {
            let e = rel.entry(name).or_default();
            e.0 += m / mean;
            e.1 += 1;
        }
    }

    if batches_used == 0 {
        return Weights {
            by_runtime: names.iter().map(|n| ((*n).clone(), UNIFORM)).collect(),
            batches_used: 0,
            from_history: false,
        };
    }

    let known: BTreeMap<&str, u32> = rel
        .iter()
        .map(|(name, (sum, n))| (*name, weight_of(sum / f64::from(*n))))
        .collect();
    let average = {
        let sum: u64 = known.values().map(|w| u64::from(*w)).sum();
        (sum as f64 / known.len() as f64).round() as u32
    };
    Weights {
        by_runtime: names
            .iter()
            .map(|n| {
                (
                    (*n).clone(),
                    known.get(n.as_str()).copied().unwrap_or(average),
                )
            })
            .collect(),
        batches_used,
        from_history: true,
    }
}

/// Weight of a runtime whose attempts take `rel` times the mean: its speed, in hundredths.
fn weight_of(rel: f64) -> u32 {
    if rel <= 0.0 {
        return MAX_WEIGHT;
    }
    let w = (100.0 / rel).round();
    if w >= f64::from(MAX_WEIGHT) {
        MAX_WEIGHT
    } else {
        (w as u32).max(MIN_WEIGHT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A batch as `(batch, [(runtime, durations)])`.
    type Batch<'a> = (&'a str, &'a [(&'a str, &'a [u64])]);

    fn history(batches: &[Batch]) -> Durations {
        batches
            .iter()
            .map(|(b, rs)| {
                let rs = rs
                    .iter()
                    .map(|(r, d)| (r.to_string(), d.to_vec()))
                    .collect();
                (b.to_string(), rs)
            })
            .collect()
    }

    fn by(w: &Weights) -> Vec<(&str, u32)> {
        w.by_runtime.iter().map(|(n, w)| (n.as_str(), *w)).collect()
    }

    #[test]
    fn medians() {
        assert_eq!(median_u64(&[]), None);
        assert_eq!(median_u64(&[5]), Some(5));
        assert_eq!(median_u64(&[1, 2, 9]), Some(2));
        assert_eq!(median_u64(&[1, 4]), Some(2));
        assert_eq!(median_u64(&[3, 5]), Some(4));
        assert_eq!(median_u64(&[u64::MAX, u64::MAX]), Some(u64::MAX));
        assert_eq!(median_f64(&[1, 4]), Some(2.5));
    }

    #[test]
    fn three_times_slower_weighs_a_third() {
        let h = history(&[("b1", &[("fast", &[900, 1000, 1100]), ("slow", &[3000])])]);
        let w = weights(&names(&["fast", "slow"]), &h);
        assert_eq!(by(&w), [("fast", 200), ("slow", 67)]);
        assert_eq!(w.batches_used, 1);
        assert!(w.from_history);
    }

    #[test]
    fn each_batch_is_normalized_by_its_own_mean() {
        // A short batch and a long one, the same 1:3 ratio.
        let h = history(&[
            ("short", &[("fast", &[10]), ("slow", &[30])]),
            ("long", &[("fast", &[100_000]), ("slow", &[300_000])]),
        ]);
        let w = weights(&names(&["slow", "fast"]), &h);
        assert_eq!(by(&w), [("slow", 67), ("fast", 200)]);
        assert_eq!(w.batches_used, 2);
    }

    #[test]
    fn a_batch_on_one_runtime_of_the_list_does_not_count() {
        let h = history(&[
            ("b1", &[("fast", &[1000]), ("slow", &[3000])]),
            ("alone", &[("fast", &[1]), ("other", &[1_000_000])]),
        ]);
        let w = weights(&names(&["fast", "slow"]), &h);
        assert_eq!(by(&w), [("fast", 200), ("slow", 67)]);
        assert_eq!(w.batches_used, 1);
    }

    #[test]
    fn a_runtime_without_history_gets_the_average() {
        let h = history(&[("b1", &[("fast", &[1000]), ("slow", &[3000])])]);
        let w = weights(&names(&["fast", "new", "slow"]), &h);
        // (200 + 67) / 2 = 133.5
        assert_eq!(by(&w), [("fast", 200), ("new", 134), ("slow", 67)]);
    }

    #[test]
    fn no_history_is_uniform() {
        let w = weights(&names(&["a", "b"]), &BTreeMap::new());
        assert_eq!(by(&w), [("a", 100), ("b", 100)]);
        assert_eq!((w.batches_used, w.from_history), (0, false));
        let zero = history(&[("b", &[("a", &[0]), ("b", &[0])])]);
        assert!(!weights(&names(&["a", "b"]), &zero).from_history);
    }

    #[test]
    fn duplicates_are_computed_once() {
        let h = history(&[("b1", &[("fast", &[1000]), ("slow", &[3000])])]);
        let w = weights(&names(&["slow", "fast", "slow"]), &h);
        assert_eq!(by(&w), [("slow", 67), ("fast", 200)]);
    }

    #[test]
    fn weights_are_clamped() {
        let h = history(&[("b1", &[("instant", &[0]), ("slow", &[1000])])]);
        let w = weights(&names(&["instant", "slow"]), &h);
        assert_eq!(by(&w), [("instant", 10_000), ("slow", 50)]);
        let h = history(&[(
            "b1",
            &[
                ("a", &[1]),
                ("b", &[1]),
                ("c", &[1]),
                ("glacial", &[100_000_000]),
            ],
        )]);
        let w = weights(&names(&["a", "b", "c", "glacial"]), &h);
        assert_eq!(w.by_runtime[3], ("glacial".into(), 25));
        assert_eq!(weight_of(1e9), 1);
        assert_eq!(weight_of(1e-9), 10_000);
    }
}
