//! A batch's pace (`defaults.rate`): how fast its cases may start, alone or shared with every
//! batch that names the same `rate_key` through one `RatePacer` workflow.

use serde::{Deserialize, Serialize};

/// `defaults.rate`, as the batch workflow gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Pace {
    pub starts_per_minute: u32,
    /// The shared pace's name (`rate_key`); `None`: this batch's own pace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl Pace {
    /// Microseconds between starts at the steady rate.
    pub fn every_us(&self) -> u64 {
        60_000_000 / u64::from(self.starts_per_minute.max(1))
    }

    /// How many starts may go at once after a wait: a second's worth, at least one.
    pub fn burst(&self) -> u64 {
        u64::from(self.starts_per_minute / 60).max(1)
    }

    pub fn describe(&self) -> String {
        match &self.key {
            Some(key) => format!(
                "{} starts/min shared by rate key {key}",
                self.starts_per_minute
            ),
            None => format!("{} starts/min", self.starts_per_minute),
        }
    }
}

/// What a batch asks a shared pace for: the time one more case may start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PaceAsk {
    pub pace: Pace,
}

/// The shared pace's workflow: one per key on the namespace.
pub fn pacer_workflow_id(key: &str) -> String {
    format!("casebatch-rate-{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_spaces_starts_and_allows_a_seconds_worth_at_once() {
        let p = |n| Pace {
            starts_per_minute: n,
            key: None,
        };
        assert_eq!((p(60).every_us(), p(60).burst()), (1_000_000, 1));
        assert_eq!((p(1).every_us(), p(1).burst()), (60_000_000, 1));
        assert_eq!((p(6000).every_us(), p(6000).burst()), (10_000, 100));
        assert_eq!(pacer_workflow_id("team-a"), "casebatch-rate-team-a");
    }
}
