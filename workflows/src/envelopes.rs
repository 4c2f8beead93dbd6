//! The case source when runtimes declare envelopes: a runtime that declares `max_concurrent`
//! or `memory_budget_mb` gets no more of the batch's cases at once than that, and the rest
//! wait in the workflow instead of being refused by the runtime (`RUNTIME_FULL`).
//!
//! Queued cases are grouped by the envelope they count against, each group in plan order; the
//! next case admitted is the lowest-indexed group head that fits. Cases that declare no memory
//! form their own group per envelope, so they never wait behind a heavy case for memory they
//! do not use (they still count against `max_concurrent`). A case whose runtime has no
//! envelope is admitted outside it; the batch's own concurrency limit always holds. Pure and
//! deterministic: it sees only the input and the slots.

use std::collections::VecDeque;

use casebatch_proto::{BatchInput, CaseLoad, CaseSlot, CaseState, Envelope, EnvelopeUse};

pub(crate) struct Envelopes {
    limits: Vec<Envelope>,
    loads: Vec<CaseLoad>,
    /// Queued cases in plan order: per envelope, those declaring memory then those declaring
    /// none; the last group counts against no envelope.
    groups: Vec<VecDeque<u32>>,
    /// Per envelope: cases in flight and the memory they declare.
    in_flight: Vec<(u32, u64)>,
}

impl Envelopes {
    /// `None` when no runtime of the batch declares an envelope: admission is then the plain
    /// plan-order walk it always was (histories recorded before envelopes replay unchanged).
    pub(crate) fn new(input: &BatchInput, slots: &[CaseSlot]) -> Option<Self> {
        if input.envelopes.is_empty() {
            return None;
        }
        let limits = input.envelopes.clone();
        let mut groups = vec![VecDeque::new(); 2 * limits.len() + 1];
        for (i, slot) in slots.iter().enumerate() {
            if slot.state == CaseState::Queued {
                let load = input.case_loads.get(i).copied().unwrap_or_default();
                groups[group_of(load, limits.len())].push_back(i as u32);
            }
        }
        Some(Self {
            in_flight: vec![(0, 0); limits.len()],
            limits,
            loads: input.case_loads.clone(),
            groups,
        })
    }

    /// The next case to admit, now counted in flight; `None` when every queued case waits
    /// for room (or none is queued).
    pub(crate) fn next(&mut self) -> Option<u32> {
        let group = (0..self.groups.len())
            .filter(|&g| {
                self.groups[g]
                    .front()
                    .is_some_and(|&case| self.fits(self.load(case)))
            })
            .min_by_key(|&g| self.groups[g][0])?;
        let case = self.groups[group].pop_front()?;
        let CaseLoad(envelope, memory) = self.load(case);
        if let Some(e) = envelope {
            let (count, mb) = &mut self.in_flight[e as usize];
            *count += 1;
            *mb += memory;
        }
        Some(case)
    }

    /// A case admitted by [`Envelopes::next`] is no longer in flight.
    pub(crate) fn finished(&mut self, case: u32) {
        let CaseLoad(envelope, memory) = self.load(case);
        if let Some(e) = envelope {
            let (count, mb) = &mut self.in_flight[e as usize];
            *count = count.saturating_sub(1);
            *mb = mb.saturating_sub(memory);
        }
    }

    /// What each envelope holds now and what waits for it, for `status`.
    pub(crate) fn usage(&self) -> Vec<EnvelopeUse> {
        self.limits
            .iter()
            .zip(&self.in_flight)
            .enumerate()
            .map(|(e, (limit, &(running, memory_mb)))| EnvelopeUse {
                runtime: limit.runtime.clone(),
                running,
                memory_mb,
                waiting: (self.groups[2 * e].len() + self.groups[2 * e + 1].len()) as u32,
                max_concurrent: limit.max_concurrent,
                memory_budget_mb: limit.memory_budget_mb,
            })
            .collect()
    }

    fn load(&self, case: u32) -> CaseLoad {
        self.loads.get(case as usize).copied().unwrap_or_default()
    }

    fn fits(&self, CaseLoad(envelope, memory): CaseLoad) -> bool {
        let Some(e) = envelope.map(usize::from).filter(|&e| e < self.limits.len()) else {
            return true;
        };
        let (count, mb) = self.in_flight[e];
        let limit = &self.limits[e];
        let count_ok = limit.max_concurrent.is_none_or(|max| count < max);
        // Undeclared memory is outside the budget; a case alone always fits, so one that
        // declares more than the budget (refused at plan time) still cannot wedge the batch.
        let memory_ok = memory == 0
            || count == 0
            || limit
                .memory_budget_mb
                .is_none_or(|budget| mb + memory <= budget);
        count_ok && memory_ok
    }
}

fn group_of(CaseLoad(envelope, memory): CaseLoad, envelopes: usize) -> usize {
    match envelope.map(usize::from).filter(|&e| e < envelopes) {
        Some(e) => 2 * e + usize::from(memory == 0),
        None => 2 * envelopes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(envelopes: Vec<Envelope>, loads: Vec<CaseLoad>) -> BatchInput {
        serde_json::from_value(serde_json::json!({
            "batch_id": "b", "bundle_dir": "/b", "fingerprint": "f",
            "case_count": loads.len(), "concurrency": 64, "max_retries": 0,
            "retry_backoff_ms": 0, "max_timeout_seconds": 60,
            "envelopes": envelopes, "case_loads": loads,
        }))
        .unwrap()
    }

    fn budget(runtime: &str, max: Option<u32>, mb: Option<u64>) -> Envelope {
        Envelope {
            runtime: runtime.into(),
            max_concurrent: max,
            memory_budget_mb: mb,
        }
    }

    fn admit_all(e: &mut Envelopes) -> Vec<u32> {
        std::iter::from_fn(|| e.next()).collect()
    }

    #[test]
    fn a_memory_budget_admits_what_fits_and_the_rest_waits_in_plan_order() {
        // Four 512 MB cases on a 600 MB runtime, one undeclared case on it, one elsewhere.
        let loads = vec![
            CaseLoad(Some(0), 512),
            CaseLoad(Some(0), 512),
            CaseLoad(Some(0), 0),
            CaseLoad(None, 4096),
            CaseLoad(Some(0), 512),
        ];
        let slots = vec![CaseSlot::default(); loads.len()];
        let mut e =
            Envelopes::new(&input(vec![budget("box", None, Some(600))], loads), &slots).unwrap();
        assert_eq!(admit_all(&mut e), [0, 2, 3], "one 512 MB case at a time");
        let usage = &e.usage()[0];
        assert_eq!((usage.running, usage.memory_mb, usage.waiting), (2, 512, 2));
        e.finished(0);
        assert_eq!(admit_all(&mut e), [1]);
        e.finished(1);
        assert_eq!(admit_all(&mut e), [4]);
        assert_eq!(admit_all(&mut e), [] as [u32; 0]);
    }

    #[test]
    fn max_concurrent_counts_cases_and_finished_ones_make_room() {
        let loads = vec![CaseLoad(Some(0), 0); 5];
        let slots = vec![CaseSlot::default(); 5];
        let mut e =
            Envelopes::new(&input(vec![budget("box", Some(2), None)], loads), &slots).unwrap();
        assert_eq!(admit_all(&mut e), [0, 1]);
        e.finished(1);
        assert_eq!(admit_all(&mut e), [2]);
    }

    #[test]
    fn only_queued_cases_are_admitted_and_no_envelopes_means_the_old_walk() {
        let loads = vec![CaseLoad(Some(0), 100); 3];
        let mut slots = vec![CaseSlot::default(); 3];
        slots[0].state = CaseState::Succeeded;
        let mut e =
            Envelopes::new(&input(vec![budget("box", Some(8), None)], loads), &slots).unwrap();
        assert_eq!(admit_all(&mut e), [1, 2]);
        assert!(Envelopes::new(&input(Vec::new(), Vec::new()), &slots).is_none());
    }
}
