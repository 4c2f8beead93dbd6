//! Admission as a list of policies. Each is a pure type that says whether one more case may
//! take a lane now, later, or never; the batch's loop asks all of them and admits while every
//! one says now, so a new rule (a budget, a rate) is a new policy, not a change to the loop.
//! Which case goes next is the case source's choice (plan order, or [`crate::envelopes`] when
//! runtimes declare envelopes), not a policy's.

use casebatch_proto::{Budget, Spending};

use crate::pace::Pacing;

/// What a policy says about one more case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Gate {
    Now,
    /// Not before something changes (a case ends, a control arrives): the loop is woken then.
    Later,
    /// Not in this run.
    Never,
}

/// The two ways a case is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A slot: the case runs now (or a case provisioned ahead is granted one).
    Slot,
    /// Provisioning ahead of a free slot (`prepare_ahead`).
    Ahead,
}

/// What the batch holds now, as the policies see it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load {
    /// Cases holding a slot.
    pub running: usize,
    /// Slots the tail takes: duplicates in flight and stragglers asked to start one.
    pub tail: usize,
    /// Cases provisioned ahead, waiting for a slot.
    pub held: usize,
}

pub(crate) trait Policy {
    fn gate(&self, lane: Lane, load: &Load) -> Gate;
}

/// The operator's concurrency limit (`set_concurrency` changes it while the batch runs).
pub(crate) struct Concurrency(pub u32);

/// The width open circuits narrow the batch to ([`crate::circuits::Circuits::width`]).
pub(crate) struct CircuitWidth(pub u32);

/// How many cases provision ahead of a free slot.
pub(crate) struct ProvisionAhead(pub u32);

/// The batch's budget over what its cases spend ([`casebatch_proto::Budget::admits`]): every
/// case admitted and not finished, running or provisioned ahead, is reserved at the p90 of
/// what finished cases spent. Cases provisioned ahead were admitted under it: granting them
/// a slot does not ask it again.
pub(crate) struct WithinBudget {
    budget: Option<Budget>,
    /// (cost, tokens) spent, and reserved per case in flight.
    spent: (f64, f64),
    reserve: (f64, f64),
}

impl WithinBudget {
    /// Works the reserve out once for the admission pass.
    pub(crate) fn new(budget: Option<Budget>, spending: &Spending) -> Self {
        let (spent, reserve) = match budget {
            Some(_) => (spending.totals(), spending.reserve()),
            None => Default::default(),
        };
        Self {
            budget,
            spent,
            reserve,
        }
    }
}

impl Policy for WithinBudget {
    fn gate(&self, _lane: Lane, load: &Load) -> Gate {
        let Some(budget) = self.budget else {
            return Gate::Now;
        };
        let in_flight = load.running + load.tail + load.held;
        if budget.admits_at(self.spent, self.reserve, in_flight) {
            Gate::Now
        } else if in_flight == 0 {
            Gate::Never
        } else {
            // What the running cases really spend may leave room.
            Gate::Later
        }
    }
}

/// The batch's pace (`defaults.rate`): a start conforms now, or later (the loop then waits
/// for it on a timer, or asks the shared pace). Provisioning ahead is no start. Each start it
/// lets through must be booked with [`Paced::took`].
pub(crate) struct Paced<'a> {
    pub pacing: Option<&'a Pacing>,
    /// Workflow time of this admission pass.
    pub now_us: u64,
}

impl Paced<'_> {
    pub(crate) fn took(&self) {
        if let Some(p) = self.pacing {
            p.started(self.now_us);
        }
    }
}

impl Policy for Paced<'_> {
    fn gate(&self, lane: Lane, _load: &Load) -> Gate {
        match (lane, self.pacing) {
            (Lane::Slot, Some(p)) if !p.may_start(self.now_us) => Gate::Later,
            _ => Gate::Now,
        }
    }
}

/// Slots are shared by the cases running and the tail's duplicates.
fn room(limit: u32, load: &Load) -> Gate {
    if load.running + load.tail < limit as usize {
        Gate::Now
    } else {
        Gate::Later
    }
}

impl Policy for Concurrency {
    fn gate(&self, lane: Lane, load: &Load) -> Gate {
        match lane {
            Lane::Slot => room(self.0.max(1), load),
            Lane::Ahead => Gate::Now,
        }
    }
}

impl Policy for CircuitWidth {
    fn gate(&self, lane: Lane, load: &Load) -> Gate {
        match lane {
            Lane::Slot => room(self.0, load),
            Lane::Ahead => Gate::Now,
        }
    }
}

impl Policy for ProvisionAhead {
    fn gate(&self, lane: Lane, load: &Load) -> Gate {
        match lane {
            Lane::Slot => Gate::Now,
            Lane::Ahead if self.0 == 0 => Gate::Never,
            Lane::Ahead if load.held < self.0 as usize => Gate::Now,
            Lane::Ahead => Gate::Later,
        }
    }
}

/// What all of `policies` say together: the strictest answer (never over later over now).
pub(crate) fn gate(policies: &[&dyn Policy], lane: Lane, load: &Load) -> Gate {
    policies
        .iter()
        .map(|p| p.gate(lane, load))
        .max()
        .unwrap_or(Gate::Now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(running: usize, tail: usize, held: usize) -> Load {
        Load {
            running,
            tail,
            held,
        }
    }

    #[test]
    fn concurrency_counts_running_cases_and_the_tails_duplicates() {
        let p = Concurrency(3);
        assert_eq!(p.gate(Lane::Slot, &load(2, 0, 5)), Gate::Now);
        assert_eq!(p.gate(Lane::Slot, &load(2, 1, 0)), Gate::Later);
        assert_eq!(
            p.gate(Lane::Slot, &load(4, 0, 0)),
            Gate::Later,
            "lowered limit"
        );
        assert_eq!(p.gate(Lane::Ahead, &load(9, 9, 9)), Gate::Now);
        // A limit of 0 never wedges the batch: one case still runs.
        assert_eq!(Concurrency(0).gate(Lane::Slot, &load(0, 0, 0)), Gate::Now);
    }

    #[test]
    fn circuit_width_narrows_slots_only() {
        let p = CircuitWidth(1);
        assert_eq!(p.gate(Lane::Slot, &load(0, 0, 0)), Gate::Now);
        assert_eq!(p.gate(Lane::Slot, &load(1, 0, 0)), Gate::Later);
        assert_eq!(p.gate(Lane::Ahead, &load(1, 0, 0)), Gate::Now);
    }

    #[test]
    fn a_budget_reserves_running_tail_and_held_cases_and_is_never_once_spent() {
        let one = casebatch_proto::Usage([("cost_usd".to_string(), 1.0)].into());
        let mut spending = Spending::default();
        for _ in 0..3 {
            spending.record(&one, true);
        }
        let budget = Budget {
            cost_usd: Some(5.0),
            tokens: None,
        };
        let p = WithinBudget::new(Some(budget), &spending);
        assert_eq!(p.gate(Lane::Slot, &load(1, 0, 0)), Gate::Now);
        assert_eq!(p.gate(Lane::Slot, &load(1, 1, 0)), Gate::Later);
        assert_eq!(p.gate(Lane::Ahead, &load(1, 0, 1)), Gate::Later);
        spending.record(&one, true);
        spending.record(&one, true);
        let p = WithinBudget::new(Some(budget), &spending);
        assert_eq!(p.gate(Lane::Slot, &load(0, 0, 0)), Gate::Never);
        assert_eq!(
            WithinBudget::new(None, &spending).gate(Lane::Slot, &load(0, 0, 0)),
            Gate::Now
        );
    }

    #[test]
    fn provision_ahead_holds_its_depth_and_is_never_without_one() {
        assert_eq!(
            ProvisionAhead(2).gate(Lane::Ahead, &load(0, 0, 1)),
            Gate::Now
        );
        assert_eq!(
            ProvisionAhead(2).gate(Lane::Ahead, &load(0, 0, 2)),
            Gate::Later
        );
        assert_eq!(
            ProvisionAhead(0).gate(Lane::Ahead, &load(0, 0, 0)),
            Gate::Never
        );
        assert_eq!(
            ProvisionAhead(0).gate(Lane::Slot, &load(0, 0, 0)),
            Gate::Now
        );
    }

    #[test]
    fn together_the_strictest_answer_wins() {
        let (wide, narrow, none) = (Concurrency(8), CircuitWidth(2), ProvisionAhead(0));
        let all: [&dyn Policy; 3] = [&wide, &narrow, &none];
        assert_eq!(gate(&all, Lane::Slot, &load(1, 0, 0)), Gate::Now);
        assert_eq!(gate(&all, Lane::Slot, &load(2, 0, 0)), Gate::Later);
        assert_eq!(gate(&all, Lane::Ahead, &load(0, 0, 0)), Gate::Never);
        assert_eq!(gate(&[], Lane::Slot, &load(100, 0, 0)), Gate::Now);
    }
}
