//! The batch's side of shared runtimes ([`crate::runtime_slots`]): how it shares (priority,
//! weight, user), which runtime each case waits for, the grants that arrived, and what
//! `status` shows per runtime. Pure state; the case's ask and give-back are in
//! `case/slot.rs`.

use std::collections::BTreeSet;

use casebatch_proto::share::{RuntimeShare, ShareChange, ShareInput, SharedRuntime, SlotAnswer};

pub(crate) struct RuntimeShares {
    input: ShareInput,
    /// (case, attempt) granted a slot and not yet taken by its case.
    granted: BTreeSet<(u32, u32)>,
    /// Per runtime of `input.runtimes`: what `status` shows.
    views: Vec<RuntimeShare>,
    /// Bumped by every `set_share`; per runtime, the generation its slots were last told.
    generation: u64,
    told: Vec<u64>,
}

/// What a case's wait for a slot changed, for the timeline.
pub(crate) enum Turn {
    /// The first of the batch's cases to wait on this runtime: the batch is held back.
    HeldBack,
    /// The last waiting case got its slot.
    Released,
    Quiet,
}

impl RuntimeShares {
    /// `None` for a batch on no shared runtime (and for every run recorded before sharing).
    pub(crate) fn new(input: Option<&ShareInput>, change: Option<ShareChange>) -> Option<Self> {
        let mut input = input.filter(|s| !s.runtimes.is_empty())?.clone();
        if let Some(c) = change {
            input.settings.priority = c.priority;
            input.settings.weight = c.weight;
        }
        let views: Vec<RuntimeShare> = (input.runtimes.iter())
            .map(|r| RuntimeShare {
                runtime: r.name.clone(),
                ..RuntimeShare::default()
            })
            .collect();
        let told = vec![0; views.len()];
        Some(Self {
            input,
            granted: BTreeSet::new(),
            views,
            generation: 0,
            told,
        })
    }

    /// The shared runtime case `case` runs on, if it is one.
    pub(crate) fn runtime_of(&self, case: u32) -> Option<(usize, &SharedRuntime)> {
        let i = usize::from((*self.input.cases.get(case as usize)?)?);
        Some((i, self.input.runtimes.get(i)?))
    }

    pub(crate) fn input(&self) -> &ShareInput {
        &self.input
    }

    pub(crate) fn change(&mut self, to: ShareChange) -> ShareChange {
        let s = &mut self.input.settings;
        let before = ShareChange {
            priority: s.priority,
            weight: s.weight,
        };
        (s.priority, s.weight) = (to.priority, to.weight);
        self.generation += 1;
        before
    }

    /// Which `set_share` the batch is at: waiting cases wake when it changes.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the caller is the first to see that `runtime`'s slots have not been told of the
    /// latest share (it tells them; the others go on waiting).
    pub(crate) fn claim_push(&mut self, runtime: usize) -> bool {
        let told = &mut self.told[runtime];
        let first = *told != self.generation;
        *told = self.generation;
        first
    }

    pub(crate) fn settings(&self) -> ShareChange {
        let s = &self.input.settings;
        ShareChange {
            priority: s.priority,
            weight: s.weight,
        }
    }

    pub(crate) fn grant(&mut self, case: u32, attempt: u32) {
        self.granted.insert((case, attempt));
    }

    pub(crate) fn is_granted(&self, case: u32, attempt: u32) -> bool {
        self.granted.contains(&(case, attempt))
    }

    /// The runtime answered an ask: its view of the batch's share.
    pub(crate) fn answered(&mut self, runtime: usize, answer: &SlotAnswer) {
        let v = &mut self.views[runtime];
        v.fair_share_milli = answer.fair_share_milli;
        v.capacity = answer.capacity;
        v.position = (!answer.granted).then_some(answer.position);
        if answer.granted {
            v.held += 1;
        }
    }

    /// A case starts waiting for a grant on `runtime` (at workflow time `now_ms`).
    pub(crate) fn waits(&mut self, runtime: usize, now_ms: u64) -> Turn {
        let v = &mut self.views[runtime];
        v.waiting += 1;
        if v.waiting == 1 {
            v.waiting_since_ms = Some(now_ms);
            return Turn::HeldBack;
        }
        Turn::Quiet
    }

    /// A waiting case got its slot (`granted`) or stopped waiting without one.
    pub(crate) fn waited(&mut self, runtime: usize, case: u32, attempt: u32) -> Turn {
        let granted = self.granted.remove(&(case, attempt));
        let v = &mut self.views[runtime];
        v.waiting = v.waiting.saturating_sub(1);
        v.held += u32::from(granted);
        if v.waiting == 0 {
            v.waiting_since_ms = None;
            v.position = None;
            return Turn::Released;
        }
        Turn::Quiet
    }

    /// A held slot was given back.
    pub(crate) fn returned(&mut self, runtime: usize) {
        let v = &mut self.views[runtime];
        v.held = v.held.saturating_sub(1);
    }

    pub(crate) fn views(&self) -> Vec<RuntimeShare> {
        self.views.clone()
    }
}
