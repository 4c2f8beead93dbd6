//! Pacing case starts (`defaults.rate`) by the generic cell rate algorithm: one theoretical
//! arrival time (`tat`) says when the next start is due at the steady rate; a start conforms
//! from `tat − (burst − 1) × every` on, so a batch that waited may start a second's worth at
//! once and never more. Integer microseconds of workflow time: deterministic on replay. The
//! batch paces itself with one ([`crate::batch`]), and a shared key's [`crate::rate_pacer`]
//! workflow paces every batch that names it with another.

use std::cell::Cell;

use casebatch_proto::Pace;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gcra {
    /// When the next start is due at the steady rate, µs of workflow time.
    pub tat_us: u64,
}

impl Gcra {
    /// The earliest time one more start conforms.
    pub fn next_at(&self, pace: &Pace) -> u64 {
        self.tat_us
            .saturating_sub((pace.burst() - 1).saturating_mul(pace.every_us()))
    }

    /// Books one start at the earliest conforming time at or after `now_us`, and returns it.
    pub fn book(&mut self, pace: &Pace, now_us: u64) -> u64 {
        let at = now_us.max(self.next_at(pace));
        self.tat_us = self.tat_us.max(at) + pace.every_us();
        at
    }
}

/// A batch's pace as its admission loop keeps it (not carried across continue-as-new: a new
/// run may start one burst at once). Cells, so the admission policy that reads it can book
/// each start it lets through.
#[derive(Debug)]
pub(crate) struct Pacing {
    pace: Pace,
    /// The batch's own pace; with a key, the fallback when the shared one cannot be asked.
    own: Cell<Gcra>,
    /// A start the shared pace booked for this batch and not used yet (µs).
    granted: Cell<Option<u64>>,
}

/// What a paced batch waits for when a start does not conform yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// A start conforms at this time (µs): a timer wakes the loop.
    At(u64),
    /// Ask the shared pace for the next start.
    Ask,
}

impl Pacing {
    pub(crate) fn new(pace: Pace) -> Self {
        Self {
            pace,
            own: Cell::default(),
            granted: Cell::default(),
        }
    }

    pub(crate) fn pace(&self) -> &Pace {
        &self.pace
    }

    pub(crate) fn may_start(&self, now_us: u64) -> bool {
        match &self.pace.key {
            None => self.own.get().next_at(&self.pace) <= now_us,
            Some(_) => self.granted.get().is_some_and(|at| at <= now_us),
        }
    }

    /// A case started now: book it (its own pace), or use up the shared pace's grant.
    pub(crate) fn started(&self, now_us: u64) {
        match &self.pace.key {
            None => {
                let mut own = self.own.get();
                own.book(&self.pace, now_us);
                self.own.set(own);
            }
            Some(_) => self.granted.set(None),
        }
    }

    /// What to wait for, a start not conforming now.
    pub(crate) fn due(&self) -> Due {
        match (&self.pace.key, self.granted.get()) {
            (None, _) => Due::At(self.own.get().next_at(&self.pace)),
            (Some(_), Some(at)) => Due::At(at),
            (Some(_), None) => Due::Ask,
        }
    }

    /// The shared pace's answer: the time it booked, or (`None`: it could not be asked) a
    /// start on the batch's own pace, so the batch keeps its rate alone.
    pub(crate) fn grant(&self, booked: Option<u64>, now_us: u64) {
        let at = booked.unwrap_or_else(|| {
            let mut own = self.own.get();
            let at = own.book(&self.pace, now_us);
            self.own.set(own);
            at
        });
        self.granted.set(Some(at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(n: u32) -> Pace {
        Pace {
            starts_per_minute: n,
            key: None,
        }
    }

    #[test]
    fn sixty_a_minute_spaces_starts_a_second_apart_however_many_ask_at_once() {
        let (p, mut g) = (pace(60), Gcra::default());
        let at: Vec<u64> = (0..4).map(|_| g.book(&p, 5_000_000)).collect();
        assert_eq!(at, [5_000_000, 6_000_000, 7_000_000, 8_000_000]);
        // Asked late, a start goes at once; the spacing continues from there.
        assert_eq!(g.book(&p, 20_000_000), 20_000_000);
        assert_eq!(g.next_at(&p), 21_000_000);
    }

    #[test]
    fn a_fast_pace_lets_a_seconds_worth_start_at_once_then_keeps_its_rate() {
        let (p, mut g) = (pace(6000), Gcra::default());
        let at: Vec<u64> = (0..101).map(|_| g.book(&p, 0)).collect();
        assert!(at[..100].iter().all(|&t| t == 0), "{at:?}");
        assert_eq!(at[100], 10_000);
        // Over any long stretch: no more than the rate plus one burst.
        let mut g = Gcra::default();
        let starts = (0..)
            .map(|_| g.book(&p, 0))
            .take_while(|&t| t <= 60_000_000)
            .count();
        assert_eq!(starts, 6000 + 100);
    }

    #[test]
    fn a_batch_on_its_own_pace_books_each_start_and_waits_for_the_next() {
        let p = Pacing::new(pace(60));
        assert!(p.may_start(1_000));
        p.started(1_000);
        assert!(!p.may_start(1_000));
        assert_eq!(p.due(), Due::At(1_001_000));
        assert!(p.may_start(1_001_000));
    }

    #[test]
    fn a_shared_pace_starts_only_on_a_grant_and_falls_back_to_its_own() {
        let p = Pacing::new(Pace {
            starts_per_minute: 60,
            key: Some("k".into()),
        });
        assert!(!p.may_start(0));
        assert_eq!(p.due(), Due::Ask);
        p.grant(Some(3_000_000), 0);
        assert_eq!(p.due(), Due::At(3_000_000));
        assert!(!p.may_start(2_999_999) && p.may_start(3_000_000));
        p.started(3_000_000);
        assert_eq!(p.due(), Due::Ask);
        // The pacer did not answer: the batch's own pace books the start.
        p.grant(None, 5_000_000);
        assert!(p.may_start(5_000_000));
        p.started(5_000_000);
        p.grant(None, 5_000_000);
        assert_eq!(p.due(), Due::At(6_000_000));
    }
}
