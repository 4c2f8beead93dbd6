//! Tail speculation: the batch's view of how long its attempts take, and which stragglers
//! get a duplicate on another runtime of their list.
//!
//! Once every case has been dispatched, a routed case in flight longer than the threshold
//! (`2 ×` the median duration of the batch's attempts that ran to their end, or of the
//! history index's seed before any has; never under [`Speculation::FLOOR_MS`]) is *asked*
//! to speculate. The case itself starts the duplicate and races the two (`crate::case`);
//! this module only keeps the facts and makes the decisions. Pure and deterministic: it sees
//! workflow time and what the cases report, nothing else.

use std::collections::{BTreeMap, BTreeSet};

use casebatch_proto::Speculation;

pub(crate) struct Tail {
    seed_ms: Option<u64>,
    /// Durations of attempts that ran to their end in this run, sorted (for the median).
    durations: Vec<u64>,
    /// Routed cases waiting on their job, by case: when the attempt was dispatched.
    running: BTreeMap<u32, u64>,
    /// Cases asked to speculate that have not yet started their duplicate.
    asked: BTreeSet<u32>,
    /// Cases that had their one duplicate in this run.
    spent: BTreeSet<u32>,
    /// Duplicates in flight: they take a slot of the batch's width like any case.
    pub(crate) duplicates: u32,
}

impl Tail {
    pub(crate) fn new(speculation: &Speculation) -> Self {
        Self {
            seed_ms: speculation.seed_ms,
            durations: Vec::new(),
            running: BTreeMap::new(),
            asked: BTreeSet::new(),
            spent: BTreeSet::new(),
            duplicates: 0,
        }
    }

    /// How long a routed case may be in flight before it is asked to speculate; `None`
    /// until a median (or a seed) is known.
    pub(crate) fn threshold_ms(&self) -> Option<u64> {
        let median = match self.durations.len() {
            0 => self.seed_ms?,
            n => self.durations[(n - 1) / 2],
        };
        Some((2 * median).max(Speculation::FLOOR_MS))
    }

    /// A routed case's attempt is waiting on its job since `dispatched_ms`.
    pub(crate) fn waiting(&mut self, case: u32, dispatched_ms: u64) {
        self.running.insert(case, dispatched_ms);
    }

    /// The case's job settled (or its race ended): it is no longer a straggler.
    pub(crate) fn settled(&mut self, case: u32) {
        self.running.remove(&case);
        self.asked.remove(&case);
    }

    /// An attempt ran to its end in `duration_ms`: the median learns from it.
    pub(crate) fn ran(&mut self, duration_ms: u64) {
        let at = self.durations.partition_point(|&d| d <= duration_ms);
        self.durations.insert(at, duration_ms);
    }

    /// When the next straggler crosses the threshold, if any may still be asked.
    pub(crate) fn next_due(&self) -> Option<u64> {
        let threshold = self.threshold_ms()?;
        self.candidates().map(|(_, at)| at + threshold).min()
    }

    /// Asks every straggler past the threshold at `now_ms`, at most `room` of them (the
    /// batch's free slots), oldest dispatch first. Returns how many were asked.
    pub(crate) fn ask_due(&mut self, now_ms: u64, room: u32) -> u32 {
        let Some(threshold) = self.threshold_ms() else {
            return 0;
        };
        let mut due: Vec<(u32, u64)> = self
            .candidates()
            .filter(|&(_, at)| at + threshold <= now_ms)
            .collect();
        due.sort_by_key(|&(case, at)| (at, case));
        due.truncate(room as usize);
        for (case, _) in &due {
            self.asked.insert(*case);
        }
        due.len() as u32
    }

    pub(crate) fn is_asked(&self, case: u32) -> bool {
        self.asked.contains(&case)
    }

    /// The case took its one chance (a duplicate started, or none could).
    pub(crate) fn spend(&mut self, case: u32) {
        self.asked.remove(&case);
        self.spent.insert(case);
    }

    /// Asks not yet taken up: they hold a slot until their case starts the duplicate.
    pub(crate) fn pending_asks(&self) -> u32 {
        self.asked.len() as u32
    }

    fn candidates(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.running
            .iter()
            .filter(|(case, _)| !self.spent.contains(case) && !self.asked.contains(case))
            .map(|(&case, &at)| (case, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(seed_ms: Option<u64>) -> Tail {
        Tail::new(&Speculation { seed_ms })
    }

    #[test]
    fn the_threshold_is_twice_the_median_with_a_floor_and_waits_for_a_median_or_seed() {
        let mut t = tail(None);
        assert_eq!(t.threshold_ms(), None, "nothing known: no speculation");
        t.ran(3_000);
        assert_eq!(t.threshold_ms(), Some(10_000), "2 × 3 s is under the floor");
        t.ran(9_000);
        t.ran(8_000);
        assert_eq!(t.threshold_ms(), Some(16_000), "median of 3, 8, 9 s is 8 s");
        assert_eq!(tail(Some(7_000)).threshold_ms(), Some(14_000), "the seed");
    }

    #[test]
    fn stragglers_past_the_threshold_are_asked_oldest_first_within_the_room() {
        let mut t = tail(Some(6_000));
        t.waiting(4, 1_000);
        t.waiting(2, 2_000);
        t.waiting(9, 50_000);
        assert_eq!(t.next_due(), Some(13_000));
        assert_eq!(t.ask_due(12_999, 8), 0);
        assert_eq!(t.ask_due(14_000, 1), 1, "one free slot");
        assert!(t.is_asked(4) && !t.is_asked(2));
        assert_eq!(t.pending_asks(), 1);
        assert_eq!(t.next_due(), Some(14_000), "case 2 is next");
        t.spend(4);
        assert_eq!(t.pending_asks(), 0);
        assert_eq!(t.ask_due(14_000, 8), 1);
        t.spend(2);
        t.settled(2);
        assert_eq!(
            t.next_due(),
            Some(62_000),
            "spent cases are never asked again"
        );
        t.settled(9);
        assert_eq!(t.next_due(), None);
    }
}
