//! What cases spend (the `usage` a harness reports in its result) and a batch's budget over
//! it: the totals the batch carries, and the one rule admission asks of them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Numbers a harness reports about what one attempt consumed: `input_tokens`,
/// `output_tokens`, `cost_usd`, or any other name. Every value is finite and non-negative
/// ([`Usage::parse`] refuses the rest where a result is read), which is why `Eq` holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct Usage(pub BTreeMap<String, f64>);

impl Eq for Usage {}

impl Usage {
    pub const COST_USD: &str = "cost_usd";
    pub const INPUT_TOKENS: &str = "input_tokens";
    pub const OUTPUT_TOKENS: &str = "output_tokens";

    /// A result's `usage` object, checked: an object of names (1 to 64 characters of
    /// `[a-z0-9_]`) to finite, non-negative numbers. The error names the field at fault.
    pub fn parse(value: &serde_json::Value) -> Result<Self, String> {
        let serde_json::Value::Object(map) = value else {
            return Err(format!(
                "usage must be an object of numbers (e.g. {{\"cost_usd\": 0.02}}), got {value}"
            ));
        };
        let mut usage = BTreeMap::new();
        for (name, v) in map {
            let named = name.len() <= 64
                && !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !named {
                return Err(format!(
                    "usage.{name}: a usage name is 1 to 64 characters of a-z, 0-9 and _"
                ));
            }
            match v.as_f64() {
                Some(n) if n.is_finite() && n >= 0.0 => usage.insert(name.clone(), n),
                _ => {
                    return Err(format!(
                        "usage.{name} must be a non-negative number, got {v}"
                    ));
                }
            };
        }
        Ok(Self(usage))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `other` name by name.
    pub fn add(&mut self, other: &Usage) {
        for (name, n) in &other.0 {
            *self.0.entry(name.clone()).or_default() += n;
        }
    }

    pub fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    pub fn cost_usd(&self) -> f64 {
        self.get(Self::COST_USD)
    }

    /// Tokens, as a budget counts them: input plus output.
    pub fn tokens(&self) -> f64 {
        self.get(Self::INPUT_TOKENS) + self.get(Self::OUTPUT_TOKENS)
    }
}

/// What a batch may spend (`defaults.budget`): admissions stop once what is spent plus what
/// is in flight would pass either limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// Limits are finite (checked where a manifest or flag is read).
impl Eq for Budget {}

impl Budget {
    /// Whether a case more may start with `in_flight` cases running: what is spent plus every
    /// running case and the new one, each reserved at the p90 of what finished cases spent,
    /// stays within every limit.
    pub fn admits(&self, spending: &Spending, in_flight: usize) -> bool {
        self.admits_at(spending.totals(), spending.reserve(), in_flight)
    }

    /// [`Budget::admits`] from (cost, tokens) spent and reserved per case, worked out once
    /// for many questions (an admission pass asks for every case it admits).
    pub fn admits_at(&self, spent: (f64, f64), reserve: (f64, f64), in_flight: usize) -> bool {
        let cases = (in_flight + 1) as f64;
        let within =
            |limit: f64, spent: f64, each: f64| spent < limit && spent + cases * each <= limit;
        self.cost_usd.is_none_or(|l| within(l, spent.0, reserve.0))
            && self
                .tokens
                .is_none_or(|l| within(l as f64, spent.1, reserve.1))
    }

    /// `cost_usd 5 · tokens 100000`, for timelines and errors.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(c) = self.cost_usd {
            parts.push(format!("cost_usd {c}"));
        }
        if let Some(t) = self.tokens {
            parts.push(format!("tokens {t}"));
        }
        parts.join(" · ")
    }
}

/// What a batch has spent, carried across continue-as-new and resume: totals over its cases,
/// and (cost, tokens) of the last [`Spending::RECENT`] cases that finished, from which each
/// running case's reserve is estimated. Bounded whatever the batch's size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Spending {
    pub spent: Usage,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<(f64, f64)>,
}

impl Eq for Spending {}

impl Spending {
    pub const RECENT: usize = 64;

    /// Counts a case's usage. `finished`: it ran to an outcome (not cancelled or requeued),
    /// so it is a sample of what a case costs.
    pub fn record(&mut self, usage: &Usage, finished: bool) {
        self.spent.add(usage);
        if finished {
            if self.recent.len() == Self::RECENT {
                self.recent.remove(0);
            }
            self.recent.push((usage.cost_usd(), usage.tokens()));
        }
    }

    /// (cost, tokens) spent.
    pub fn totals(&self) -> (f64, f64) {
        (self.spent.cost_usd(), self.spent.tokens())
    }

    /// What one running case is reserved at: the p90 of the recent finished cases' cost and
    /// tokens (nothing before one has finished).
    pub fn reserve(&self) -> (f64, f64) {
        let p90 = |mut v: Vec<f64>| {
            if v.is_empty() {
                return 0.0;
            }
            v.sort_by(f64::total_cmp);
            v[((v.len() * 9).div_ceil(10)).saturating_sub(1)]
        };
        (
            p90(self.recent.iter().map(|r| r.0).collect()),
            p90(self.recent.iter().map(|r| r.1).collect()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_is_numbers_only_and_a_bad_value_names_its_field() {
        let u =
            Usage::parse(&json!({"input_tokens": 1200, "output_tokens": 300, "cost_usd": 0.02}))
                .unwrap();
        assert_eq!(u.tokens(), 1500.0);
        assert_eq!(u.cost_usd(), 0.02);
        let err = Usage::parse(&json!({"cost_usd": "0.02"})).unwrap_err();
        assert!(
            err.contains("usage.cost_usd must be a non-negative number"),
            "{err}"
        );
        let err = Usage::parse(&json!({"input_tokens": -1})).unwrap_err();
        assert!(err.contains("usage.input_tokens"), "{err}");
        let err = Usage::parse(&json!({"Cost": 1})).unwrap_err();
        assert!(err.contains("usage.Cost"), "{err}");
        assert!(Usage::parse(&json!([1, 2])).is_err());
    }

    #[test]
    fn a_budget_reserves_each_running_case_at_the_p90_of_finished_ones() {
        let budget = Budget {
            cost_usd: Some(5.0),
            tokens: None,
        };
        let mut s = Spending::default();
        // Nothing finished: nothing to reserve, the batch opens at its width.
        assert!(budget.admits(&s, 10));
        let one = Usage::parse(&json!({"cost_usd": 1.0})).unwrap();
        for _ in 0..3 {
            s.record(&one, true);
        }
        // Spent 3, one running at 1: a second would make 5, within the budget.
        assert!(budget.admits(&s, 1));
        assert!(!budget.admits(&s, 2));
        s.record(&one, true);
        assert!(budget.admits(&s, 0));
        assert!(!budget.admits(&s, 1));
        s.record(&one, true);
        // All of it spent: nothing more, even with no reserve.
        assert!(!budget.admits(&s, 0));
        assert!(
            !Budget {
                cost_usd: None,
                tokens: Some(5)
            }
            .admits(
                &Spending {
                    spent: Usage::parse(&json!({"input_tokens": 4, "output_tokens": 1})).unwrap(),
                    recent: vec![],
                },
                0
            )
        );
    }

    #[test]
    fn the_reserve_is_the_p90_and_the_samples_stay_bounded() {
        let mut s = Spending::default();
        for i in 1..=100 {
            s.record(
                &Usage(BTreeMap::from([("cost_usd".into(), f64::from(i))])),
                true,
            );
        }
        // A cancelled case's usage is spent, not a sample.
        s.record(&Usage(BTreeMap::from([("cost_usd".into(), 1000.0)])), false);
        assert_eq!(s.recent.len(), Spending::RECENT);
        assert_eq!(s.spent.cost_usd(), 5050.0 + 1000.0);
        // The last 64 are 37..=100: their p90 is the 58th, 94.
        assert_eq!(s.reserve().0, 94.0);
    }
}
