//! The batch's width under rate-limit pressure, AIMD as TCP does it: each rate-limited attempt
//! halves the width (at most once per [`RateWidth::CUT_EVERY_MS`], so a burst of attempts
//! limited together is one cut), and each case that finishes gives one slot back, until the
//! width is the concurrency limit again. Cases report pressure as it happens (through
//! [`crate::shared::Shared`]); the batch, which knows its limit, applies it when it admits.

/// How the width changed, for the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Cut { from: u32, to: u32 },
    Restored { to: u32 },
}

#[derive(Debug, Default)]
pub(crate) struct RateWidth {
    /// `None`: not narrowed (the concurrency limit).
    width: Option<u32>,
    /// A rate-limited attempt was reported since the width was last cut.
    pending_cut: bool,
    /// Workflow time of the last cut.
    cut_at_ms: Option<u64>,
}

impl RateWidth {
    pub(crate) const CUT_EVERY_MS: u64 = 2_000;

    /// An attempt was rate limited at `now_ms`. Within [`Self::CUT_EVERY_MS`] of the last cut
    /// it counts for nothing more: the cut already answers it.
    pub(crate) fn pressure(&mut self, now_ms: u64) {
        let recent = self
            .cut_at_ms
            .is_some_and(|at| now_ms.saturating_sub(at) < Self::CUT_EVERY_MS);
        if !recent {
            self.pending_cut = true;
            self.cut_at_ms = Some(now_ms);
        }
    }

    /// Applies a reported pressure: halves the width (never below 1).
    pub(crate) fn apply(&mut self, limit: u32) -> Option<Change> {
        if !std::mem::take(&mut self.pending_cut) {
            return None;
        }
        let from = self.width(limit);
        let to = (from / 2).max(1);
        self.width = Some(to);
        (to != from).then_some(Change::Cut { from, to })
    }

    /// A case finished: one slot back.
    pub(crate) fn relieve(&mut self, limit: u32) -> Option<Change> {
        let w = self.width? + 1;
        if w >= limit {
            self.width = None;
            return Some(Change::Restored { to: limit });
        }
        self.width = Some(w);
        None
    }

    pub(crate) fn width(&self, limit: u32) -> u32 {
        self.width.map_or(limit, |w| w.min(limit))
    }

    /// The width while narrowed below `limit`.
    pub(crate) fn narrowed(&self, limit: u32) -> Option<u32> {
        self.width.filter(|w| *w < limit)
    }
}

impl Change {
    pub(crate) fn note(self) -> String {
        match self {
            Change::Cut { from, to } => format!("rate limited: width {from} → {to}"),
            Change::Restored { to } => format!("rate limits eased: width back to {to}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_halves_once_per_burst_and_finished_cases_give_slots_back() {
        let mut r = RateWidth::default();
        assert_eq!(r.apply(8), None, "no pressure, no cut");
        r.pressure(1_000);
        r.pressure(1_500); // the same burst
        assert_eq!(r.apply(8), Some(Change::Cut { from: 8, to: 4 }));
        assert_eq!(r.apply(8), None);
        r.pressure(2_000);
        assert_eq!(r.apply(8), None, "within the cut's period");
        r.pressure(3_000);
        assert_eq!(r.apply(8), Some(Change::Cut { from: 4, to: 2 }));
        assert_eq!(r.width(8), 2);
        assert_eq!(r.relieve(8), None);
        assert_eq!(r.width(8), 3);
        for _ in 0..4 {
            r.relieve(8);
        }
        assert_eq!(r.narrowed(8), Some(7));
        assert_eq!(r.relieve(8), Some(Change::Restored { to: 8 }));
        assert_eq!((r.width(8), r.narrowed(8)), (8, None));
        assert_eq!(r.relieve(8), None, "nothing to give back");
        // Never below one.
        let mut r = RateWidth::default();
        for t in 0..10 {
            r.pressure(t * 10_000);
            r.apply(2);
        }
        assert_eq!(r.width(2), 1);
    }
}
