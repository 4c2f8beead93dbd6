//! Weighted fair queuing of one runtime's slots over the batches that wait for them: pure and
//! deterministic, so the `RuntimeSlots` workflow that holds it replays exactly.
//!
//! A free slot goes to the highest priority level that has a waiting ticket. Within the level
//! it goes to the user holding the fewest slots for their weight (a user's weight is the
//! largest of their batches' weights, so opening more batches earns a user nothing), then to
//! that user's batch holding the fewest for its weight, then to that batch's oldest ticket.
//! Ties go to whoever has waited longest. Held slots are never taken back: a higher level
//! gets the next free slots, not running ones.

use std::collections::{BTreeMap, VecDeque};

use casebatch_proto::share::{
    BatchShareView, ShareSettings, SlotAnswer, SlotAsk, SlotsView, Ticket,
};
use serde::{Deserialize, Serialize};

/// How far ahead a waiting ticket's place is worked out; past it the place is reported as
/// this (the queue is that long at least).
const POSITION_HORIZON: usize = 10_000;

/// One runtime's slots: who holds them, who waits, and how each batch shares.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FairQueue {
    /// The runtime's slots, as the last ask that knew them said; `None`: never learned, and
    /// every ask is granted (the runtime's own refusal is then the only limit).
    pub capacity: Option<u32>,
    /// By batch workflow id.
    batches: BTreeMap<String, BatchEntry>,
    /// Order of asks, for first-come ties.
    seq: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct BatchEntry {
    run_id: String,
    settings: ShareSettings,
    held: Vec<Ticket>,
    waiting: VecDeque<(u64, Ticket)>,
}

impl BatchEntry {
    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.waiting.is_empty()
    }
}

impl FairQueue {
    /// A ticket asks for a slot: granted at once if it is the next one owed a free slot.
    /// Grants this makes to *other* tickets are returned with the answer, for their batches
    /// to be told.
    pub fn ask(&mut self, ask: SlotAsk) -> (SlotAnswer, Vec<Ticket>) {
        if let Some(capacity) = ask.capacity {
            self.capacity = Some(capacity);
        }
        let ticket = ask.ticket;
        let entry = self.batches.entry(ticket.workflow_id.clone()).or_default();
        if entry.run_id != ticket.run_id {
            // A new run of the batch: the run before it has ended, and so has what it held.
            *entry = BatchEntry {
                run_id: ticket.run_id.clone(),
                ..BatchEntry::default()
            };
        }
        entry.settings = ask.share;
        let known = entry.held.contains(&ticket) || entry.waiting.iter().any(|(_, t)| *t == ticket);
        if !known {
            self.seq += 1;
            entry.waiting.push_back((self.seq, ticket.clone()));
        }
        let mut others = self.grant_free();
        let granted = match others.iter().position(|t| *t == ticket) {
            Some(i) => {
                others.remove(i);
                true
            }
            None => self.holds(&ticket),
        };
        let answer = self.answer(&ticket, granted);
        (answer, others)
    }

    /// A ticket is given back (its job ended) or withdrawn (its case no longer waits); the
    /// slots this frees are granted, and returned.
    pub fn give_back(&mut self, ticket: &Ticket) -> Vec<Ticket> {
        if let Some(entry) = self.batches.get_mut(&ticket.workflow_id) {
            entry.held.retain(|t| t != ticket);
            entry.waiting.retain(|(_, t)| t != ticket);
            if entry.is_empty() {
                self.batches.remove(&ticket.workflow_id);
            }
        }
        self.grant_free()
    }

    /// A batch run that is over (its grant could not be delivered, or it closed): everything
    /// it held or waited for is freed, and granted to others.
    pub fn forget_run(&mut self, workflow_id: &str, run_id: &str) -> Vec<Ticket> {
        if self
            .batches
            .get(workflow_id)
            .is_some_and(|e| e.run_id == run_id)
        {
            self.batches.remove(workflow_id);
        }
        self.grant_free()
    }

    /// The batch runs holding a slot or waiting for one.
    pub fn runs(&self) -> Vec<(String, String)> {
        (self.batches.iter())
            .map(|(id, e)| (id.clone(), e.run_id.clone()))
            .collect()
    }

    pub fn is_idle(&self) -> bool {
        self.batches.is_empty()
    }

    fn holds(&self, ticket: &Ticket) -> bool {
        (self.batches.get(&ticket.workflow_id)).is_some_and(|e| e.held.contains(ticket))
    }

    fn held(&self) -> u32 {
        self.batches.values().map(|e| e.held.len() as u32).sum()
    }

    /// Grants free slots to waiting tickets, in fair order, until none is free or none waits.
    fn grant_free(&mut self) -> Vec<Ticket> {
        let mut granted = Vec::new();
        while self.capacity.is_none_or(|c| self.held() < c) {
            let Some(id) = self.next_batch(&self.holdings()) else {
                break;
            };
            let entry = self.batches.get_mut(&id).expect("chosen from the batches");
            let (_, ticket) = entry.waiting.pop_front().expect("chosen as waiting");
            entry.held.push(ticket.clone());
            granted.push(ticket);
        }
        granted
    }

    /// Slots held per batch, the start of a fair-order walk.
    fn holdings(&self) -> BTreeMap<&str, u32> {
        (self.batches.iter())
            .map(|(id, e)| (id.as_str(), e.held.len() as u32))
            .collect()
    }

    /// The batch whose oldest waiting ticket is owed the next slot, given what each holds;
    /// `skip` tickets of each batch are taken as granted already (for a walk ahead).
    fn pick<'q>(
        &'q self,
        held: &BTreeMap<&str, u32>,
        skip: &BTreeMap<&str, usize>,
    ) -> Option<String> {
        let waiting =
            |id: &str, e: &'q BatchEntry| e.waiting.get(skip.get(id).copied().unwrap_or(0));
        let level = (self.batches.iter())
            .filter(|(id, e)| waiting(id, e).is_some())
            .map(|(_, e)| e.settings.priority)
            .max()?;
        // Per user at this level: slots held, weight, and the oldest waiting ticket.
        let mut users: BTreeMap<&str, (u32, u32, u64)> = BTreeMap::new();
        for (id, e) in &self.batches {
            if e.settings.priority != level {
                continue;
            }
            let u = users
                .entry(e.settings.user.as_str())
                .or_insert((0, 1, u64::MAX));
            u.0 += held.get(id.as_str()).copied().unwrap_or(0);
            u.1 = u.1.max(e.settings.weight);
            if let Some((seq, _)) = waiting(id, e) {
                u.2 = u.2.min(*seq);
            }
        }
        let user = (users.iter())
            .filter(|(_, u)| u.2 != u64::MAX)
            .min_by(|a, b| fewest_for_weight((a.1.0, a.1.1, a.1.2), (b.1.0, b.1.1, b.1.2)))
            .map(|(user, _)| *user)?;
        (self.batches.iter())
            .filter(|(_, e)| e.settings.priority == level && e.settings.user == user)
            .filter_map(|(id, e)| {
                let (seq, _) = waiting(id, e)?;
                let h = held.get(id.as_str()).copied().unwrap_or(0);
                Some((id, (h, e.settings.weight, *seq)))
            })
            .min_by(|a, b| fewest_for_weight(a.1, b.1))
            .map(|(id, _)| id.clone())
    }

    fn next_batch(&self, held: &BTreeMap<&str, u32>) -> Option<String> {
        self.pick(held, &BTreeMap::new())
    }

    /// Waiting tickets that would be granted before `ticket`, walking the fair order ahead.
    fn position(&self, ticket: &Ticket) -> u32 {
        let mut held = self.holdings();
        let mut skip: BTreeMap<&str, usize> = BTreeMap::new();
        for ahead in 0..POSITION_HORIZON {
            let Some(id) = self.pick(&held, &skip) else {
                break;
            };
            let (id, entry) = self.batches.get_key_value(&id).expect("picked");
            let n = skip.entry(id.as_str()).or_insert(0);
            if entry.waiting[*n].1 == *ticket {
                return ahead as u32;
            }
            *n += 1;
            *held.entry(id.as_str()).or_insert(0) += 1;
        }
        POSITION_HORIZON as u32
    }

    fn answer(&self, ticket: &Ticket, granted: bool) -> SlotAnswer {
        let view = self.view();
        let me = view
            .batches
            .iter()
            .find(|b| b.workflow_id == ticket.workflow_id);
        SlotAnswer {
            granted,
            position: if granted { 0 } else { self.position(ticket) },
            held: me.map_or(0, |b| b.held),
            fair_share_milli: me.map_or(0, |b| (b.fair_share * 1000.0).round() as u32),
            capacity: view.capacity,
        }
    }

    /// Who holds and waits, and each batch's fair share: the runtime's slots water-filled
    /// over the priority levels from the top, each level's over its users by weight, each
    /// user's over their batches by weight, never more than a batch asks for.
    pub fn view(&self) -> SlotsView {
        let capacity = self.capacity.unwrap_or(self.held());
        let mut batches: Vec<BatchShareView> = (self.batches.iter())
            .map(|(id, e)| BatchShareView {
                workflow_id: id.clone(),
                user: e.settings.user.clone(),
                priority: e.settings.priority,
                weight: e.settings.weight,
                held: e.held.len() as u32,
                waiting: e.waiting.len() as u32,
                fair_share: 0.0,
            })
            .collect();
        let mut left = f64::from(capacity);
        let mut levels: Vec<u32> = batches.iter().map(|b| b.priority).collect();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.dedup();
        for level in levels {
            let at: Vec<usize> = (0..batches.len())
                .filter(|&i| batches[i].priority == level)
                .collect();
            let mut users: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for &i in &at {
                users.entry(batches[i].user.as_str()).or_default().push(i);
            }
            let user_asks: Vec<(f64, f64)> = (users.values())
                .map(|members| {
                    let demand = members.iter().map(|&i| demand(&batches[i])).sum();
                    let weight = members.iter().map(|&i| batches[i].weight).max();
                    (demand, f64::from(weight.unwrap_or(1)))
                })
                .collect();
            let user_shares = water_fill(left, &user_asks);
            let mut shares = vec![0.0; batches.len()];
            for (members, share) in users.values().zip(&user_shares) {
                let asks: Vec<(f64, f64)> = (members.iter())
                    .map(|&i| (demand(&batches[i]), f64::from(batches[i].weight)))
                    .collect();
                for (&i, s) in members.iter().zip(water_fill(*share, &asks)) {
                    shares[i] = s;
                }
            }
            for i in at {
                batches[i].fair_share = shares[i];
                left -= shares[i];
            }
        }
        SlotsView {
            capacity,
            held: self.held(),
            waiting: batches.iter().map(|b| b.waiting).sum(),
            batches,
        }
    }
}

/// Fewer slots held per unit of weight first (compared without division), then the oldest
/// waiting ticket: `(held, weight, seq)`.
fn fewest_for_weight(a: (u32, u32, u64), b: (u32, u32, u64)) -> std::cmp::Ordering {
    let lhs = u64::from(a.0) * u64::from(b.1.max(1));
    let rhs = u64::from(b.0) * u64::from(a.1.max(1));
    lhs.cmp(&rhs).then(a.2.cmp(&b.2))
}

fn demand(b: &BatchShareView) -> f64 {
    f64::from(b.held + b.waiting)
}

/// Max-min fair division of `total` over `(demand, weight)` asks: each gets its weight's
/// part of what is left, never more than it asks for, and what it leaves goes to the rest.
fn water_fill(total: f64, asks: &[(f64, f64)]) -> Vec<f64> {
    let mut shares = vec![0.0; asks.len()];
    let mut open: Vec<usize> = (0..asks.len()).filter(|&i| asks[i].0 > 0.0).collect();
    let mut left = total.max(0.0);
    while !open.is_empty() && left > 1e-9 {
        let weights: f64 = open.iter().map(|&i| asks[i].1).sum();
        let sated: Vec<usize> = (open.iter().copied())
            .filter(|&i| asks[i].0 - shares[i] <= left * asks[i].1 / weights)
            .collect();
        if sated.is_empty() {
            for &i in &open {
                shares[i] += left * asks[i].1 / weights;
            }
            break;
        }
        for i in sated {
            left -= asks[i].0 - shares[i];
            shares[i] = asks[i].0;
            open.retain(|&j| j != i);
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use casebatch_proto::share::SharedRuntime;

    use super::*;

    fn ticket(batch: &str, case: u32) -> Ticket {
        Ticket {
            workflow_id: batch.into(),
            run_id: "r1".into(),
            case,
            attempt: 1,
        }
    }

    fn ask(
        q: &mut FairQueue,
        batch: &str,
        user: &str,
        case: u32,
        priority: u32,
        weight: u32,
    ) -> bool {
        let (answer, others) = q.ask(SlotAsk {
            runtime: SharedRuntime::default(),
            ticket: ticket(batch, case),
            share: ShareSettings {
                user: user.into(),
                priority,
                weight,
            },
            capacity: Some(8),
        });
        assert!(
            others.is_empty(),
            "an ask grants nobody else while slots are full"
        );
        answer.granted
    }

    /// Fills the queue with `n` waiting tickets per (batch, user, priority, weight), then runs
    /// `rounds` job ends (the oldest holder ends each time) and counts grants per batch.
    fn run(
        q: &mut FairQueue,
        batches: &[(&str, &str, u32, u32)],
        n: u32,
        rounds: usize,
    ) -> BTreeMap<String, u32> {
        let mut running: VecDeque<Ticket> = VecDeque::new();
        let mut count = BTreeMap::new();
        for case in 0..n {
            for &(b, u, p, w) in batches {
                if ask(q, b, u, case, p, w) {
                    running.push_back(ticket(b, case));
                }
            }
        }
        for _ in 0..rounds {
            let done = running.pop_front().expect("a slot is held");
            for t in q.give_back(&done) {
                *count.entry(t.workflow_id.clone()).or_insert(0) += 1;
                running.push_back(t);
            }
        }
        count
    }

    #[test]
    fn two_users_share_equally_however_wide_either_asks() {
        let mut q = FairQueue::default();
        // The wide batch fills all 8 slots before the narrow one asks.
        for case in 0..64 {
            ask(&mut q, "wide", "ann", case, 3, 1);
        }
        assert_eq!(q.view().held, 8);
        for case in 0..8 {
            assert!(!ask(&mut q, "narrow", "bob", case, 3, 1));
        }
        assert_eq!(
            q.position(&ticket("narrow", 0)),
            0,
            "the narrow batch is next"
        );
        assert_eq!(q.position(&ticket("narrow", 1)), 1);
        // Were no slot given back, all eight of the narrow batch's would go first.
        assert_eq!(q.position(&ticket("wide", 8)), 8);
        let mut running: VecDeque<Ticket> = (0..8).map(|c| ticket("wide", c)).collect();
        let mut grants = BTreeMap::<String, u32>::new();
        for _ in 0..8 {
            let done = running.pop_front().unwrap();
            for t in q.give_back(&done) {
                *grants.entry(t.workflow_id.clone()).or_default() += 1;
                running.push_back(t);
            }
        }
        // The first four freed slots go to the narrow batch (it held none), the next four
        // back to the wide one: four each from then on.
        assert_eq!(grants["narrow"], 4, "{grants:?}");
        assert_eq!((q.view().batches[0].held, q.view().batches[1].held), (4, 4));
        let view = q.view();
        let share = |id: &str| {
            view.batches
                .iter()
                .find(|b| b.workflow_id == id)
                .unwrap()
                .fair_share
        };
        assert!((share("narrow") - 4.0).abs() < 1e-9 && (share("wide") - 4.0).abs() < 1e-9);
    }

    #[test]
    fn weights_one_one_two_hold_a_quarter_a_quarter_and_a_half() {
        let mut q = FairQueue::default();
        let batches = [("a", "ann", 3, 1), ("b", "bob", 3, 1), ("c", "cat", 3, 2)];
        let grants = run(&mut q, &batches, 200, 300);
        let total: u32 = grants.values().sum();
        let part = |b: &str| f64::from(grants[b]) / f64::from(total);
        assert!((part("a") - 0.25).abs() < 0.02, "{grants:?}");
        assert!((part("b") - 0.25).abs() < 0.02, "{grants:?}");
        assert!((part("c") - 0.5).abs() < 0.02, "{grants:?}");
        let view = q.view();
        let shares: Vec<f64> = view.batches.iter().map(|b| b.fair_share).collect();
        assert_eq!(shares, [2.0, 2.0, 4.0]);
    }

    #[test]
    fn a_user_gains_nothing_by_opening_more_batches() {
        let mut q = FairQueue::default();
        let batches = [
            ("a1", "ann", 3, 1),
            ("a2", "ann", 3, 1),
            ("a3", "ann", 3, 1),
            ("b", "bob", 3, 1),
        ];
        let grants = run(&mut q, &batches, 200, 200);
        let ann: u32 = ["a1", "a2", "a3"].iter().map(|b| grants[*b]).sum();
        let diff = i64::from(ann) - i64::from(grants["b"]);
        assert!(diff.abs() <= 8, "{grants:?}");
    }

    #[test]
    fn a_higher_priority_takes_every_free_slot_but_no_held_one() {
        let mut q = FairQueue::default();
        for case in 0..20 {
            ask(&mut q, "low", "ann", case, 3, 1);
        }
        for case in 0..4 {
            assert!(
                !ask(&mut q, "urgent", "bob", case, 5, 1),
                "no held slot is taken back"
            );
        }
        let freed: Vec<Ticket> = (0..4)
            .flat_map(|c| q.give_back(&ticket("low", c)))
            .collect();
        assert!(freed.iter().all(|t| t.workflow_id == "urgent"), "{freed:?}");
        let more = q.give_back(&ticket("low", 4));
        assert_eq!(
            more[0].workflow_id, "low",
            "with nothing urgent waiting, low goes on"
        );
    }

    #[test]
    fn a_withdrawn_or_forgotten_ticket_frees_its_slot_and_a_new_run_drops_the_old_one() {
        let mut q = FairQueue::default();
        for case in 0..9 {
            ask(&mut q, "a", "ann", case, 3, 1);
        }
        assert!(!ask(&mut q, "b", "bob", 0, 3, 1));
        // Withdrawing a waiting ticket grants nothing; returning a held one grants bob.
        assert!(q.give_back(&ticket("a", 8)).is_empty());
        assert_eq!(q.give_back(&ticket("a", 0)), [ticket("b", 0)]);
        // Run r1 of `a` is over: its 7 slots are free.
        assert!(q.forget_run("a", "r1").is_empty());
        assert_eq!(q.view().held, 1);
        // Asking twice is harmless: the same ticket is not queued twice.
        assert!(ask(&mut q, "b", "bob", 0, 3, 1));
        assert_eq!(q.view().held, 1);
        // A new run of a batch drops what the old one held.
        ask(&mut q, "b", "bob", 1, 3, 1);
        let mut next = ticket("b", 5);
        next.run_id = "r2".into();
        let (answer, _) = q.ask(SlotAsk {
            runtime: SharedRuntime::default(),
            ticket: next,
            share: ShareSettings::default(),
            capacity: None,
        });
        assert!(answer.granted && answer.held == 1, "{answer:?}");
    }

    #[test]
    fn water_filling_gives_what_a_small_ask_leaves_to_the_rest() {
        let shares = water_fill(8.0, &[(1.0, 1.0), (100.0, 1.0), (100.0, 2.0)]);
        assert_eq!(shares[0], 1.0);
        assert!((shares[1] - 7.0 / 3.0).abs() < 1e-9 && (shares[2] - 14.0 / 3.0).abs() < 1e-9);
    }
}
