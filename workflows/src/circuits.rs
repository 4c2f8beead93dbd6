//! What a batch knows about the circuits of its runtimes, and the decisions it makes from
//! that: which runtime of a case's list a dispatch goes to, and how wide the batch runs.
//!
//! The breakers themselves are shared workflows (`crate::breaker`); the batch learns their
//! state only from its `start` results (a dispatch that started closes a circuit in this
//! view, a `Skipped` or a reported failure opens it). Pure and deterministic: it sees only
//! the input, those results and workflow time.

use std::collections::BTreeMap;

use casebatch_proto::{BatchInput, Circuit, Routes};

pub(crate) struct Circuits {
    routes: Routes,
    /// By runtime index: circuits last seen open.
    open: BTreeMap<u16, Seen>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// When a probe may go through.
    retry_at_ms: u64,
    /// A case of this batch is dispatching there as the probe.
    probing: bool,
}

/// Where a dispatch goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Dispatch to this runtime (`probe`: its circuit is open and the cooldown is over).
    To { runtime: u16, probe: bool },
    /// Every runtime of the list is open: wait until this time, then pick again.
    WaitUntil(u64),
}

impl Circuits {
    /// `None` when no case names a list of runtimes: nothing is routed.
    pub(crate) fn new(input: &BatchInput) -> Option<Self> {
        let routes = input.routes.clone()?;
        Some(Self {
            routes,
            open: BTreeMap::new(),
        })
    }

    /// The case's list and the position of its share, when it was dealt from a list.
    pub(crate) fn route_of(&self, case: u32) -> Option<(Vec<u16>, u16)> {
        let route = (*self.routes.cases.get(case as usize)?)?;
        let list = self.routes.lists.get(route.0 as usize)?.clone();
        let home = *list.get(route.1 as usize)?;
        Some((list, home))
    }

    pub(crate) fn name(&self, runtime: u16) -> &str {
        self.routes
            .runtimes
            .get(runtime as usize)
            .map_or("?", |r| r.name.as_str())
    }

    fn index_of(&self, name: &str) -> Option<u16> {
        self.routes
            .runtimes
            .iter()
            .position(|r| r.name == name)
            .map(|i| i as u16)
    }

    pub(crate) fn is_open(&self, runtime: u16) -> bool {
        self.open.contains_key(&runtime)
    }

    /// Where the next dispatch of a case goes, preferring `current` (its share, or where it
    /// spilled to), then the rest of its list in order. A runtime whose cooldown is over gets
    /// this batch's probe first (one at a time), so circuits close as soon as they can.
    pub(crate) fn pick(&mut self, list: &[u16], current: u16, now_ms: u64) -> Pick {
        let start = list.iter().position(|&r| r == current).unwrap_or(0);
        let order: Vec<u16> = list[start..]
            .iter()
            .chain(&list[..start])
            .copied()
            .collect();
        let due = order.iter().copied().find(|r| {
            self.open
                .get(r)
                .is_some_and(|s| !s.probing && s.retry_at_ms <= now_ms)
        });
        if let Some(runtime) = due {
            if let Some(seen) = self.open.get_mut(&runtime) {
                seen.probing = true;
            }
            return Pick::To {
                runtime,
                probe: true,
            };
        }
        if let Some(&runtime) = order.iter().find(|r| !self.open.contains_key(r)) {
            return Pick::To {
                runtime,
                probe: false,
            };
        }
        let soonest = order
            .iter()
            .filter_map(|r| self.open.get(r))
            .map(|s| s.retry_at_ms)
            .min()
            .unwrap_or(now_ms);
        Pick::WaitUntil(soonest.max(now_ms + 1_000))
    }

    /// The next runtime of the list after `from` that is not seen open, for a spillover.
    pub(crate) fn spill_target(&self, list: &[u16], from: u16) -> Option<u16> {
        let start = list.iter().position(|&r| r == from)?;
        list[start + 1..]
            .iter()
            .chain(&list[..start])
            .copied()
            .find(|r| !self.open.contains_key(r))
    }

    /// A dispatch to `runtime` started: its circuit is closed. Returns whether that is news.
    pub(crate) fn started(&mut self, runtime: u16) -> bool {
        self.open.remove(&runtime).is_some()
    }

    /// A breaker's state from a `start` result. Returns whether the view changed between
    /// open and closed. A circuit seen open is never retried sooner than a second from now.
    pub(crate) fn saw(&mut self, circuit: &Circuit, now_ms: u64) -> bool {
        let Some(runtime) = self.index_of(&circuit.runtime) else {
            return false;
        };
        if !circuit.open {
            return self.started(runtime);
        }
        let retry_at_ms = circuit.retry_at_ms.max(now_ms + 1_000);
        self.open
            .insert(
                runtime,
                Seen {
                    retry_at_ms,
                    probing: false,
                },
            )
            .is_none()
    }

    /// A probe ended without a verdict (its activity failed): another may go.
    pub(crate) fn probe_done(&mut self, runtime: u16) {
        if let Some(seen) = self.open.get_mut(&runtime) {
            seen.probing = false;
        }
    }

    /// How many cases the batch runs at once: its limit while every circuit is closed, half
    /// of it while some are open, one (a trickle that keeps probing) while all are.
    pub(crate) fn width(&self, limit: u32) -> u32 {
        let open = self.open.len();
        if open == 0 {
            limit
        } else if open >= self.routes.runtimes.len() {
            1
        } else {
            (limit / 2).max(1)
        }
    }

    /// The circuits seen open, for `status`.
    pub(crate) fn open_circuits(&self) -> Vec<Circuit> {
        self.open
            .iter()
            .map(|(&r, s)| Circuit {
                runtime: self.name(r).to_string(),
                open: true,
                retry_at_ms: s.retry_at_ms,
            })
            .collect()
    }

    /// The names of the runtimes seen open, for the timeline.
    pub(crate) fn open_names(&self) -> String {
        let names: Vec<&str> = self.open.keys().map(|&r| self.name(r)).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::{CaseRoute, RouteRuntime};

    fn circuits(runtimes: &[&str]) -> Circuits {
        let input = BatchInput {
            routes: Some(Routes {
                runtimes: runtimes
                    .iter()
                    .map(|n| RouteRuntime {
                        name: n.to_string(),
                        breaker: Default::default(),
                    })
                    .collect(),
                lists: vec![(0..runtimes.len() as u16).collect()],
                cases: vec![Some(CaseRoute(0, 1)), None],
            }),
            ..BatchInput::default()
        };
        Circuits::new(&input).unwrap()
    }

    fn open(runtime: &str, retry_at_ms: u64) -> Circuit {
        Circuit {
            runtime: runtime.into(),
            open: true,
            retry_at_ms,
        }
    }

    #[test]
    fn a_case_goes_to_its_share_until_that_circuit_opens() {
        let mut c = circuits(&["a", "b", "c"]);
        assert_eq!(c.route_of(0), Some((vec![0, 1, 2], 1)));
        assert_eq!(c.route_of(1), None);
        let to = |runtime| Pick::To {
            runtime,
            probe: false,
        };
        assert_eq!(c.pick(&[0, 1, 2], 1, 0), to(1));
        assert!(c.saw(&open("b", 30_000), 0));
        // The rest of the list, in order after the share.
        assert_eq!(c.pick(&[0, 1, 2], 1, 0), to(2));
        assert_eq!(c.spill_target(&[0, 1, 2], 2), Some(0));
        assert_eq!(c.spill_target(&[0, 1, 2], 0), Some(2));
    }

    #[test]
    fn after_the_cooldown_one_case_probes_and_a_start_closes_the_circuit() {
        let mut c = circuits(&["a", "b"]);
        c.saw(&open("a", 30_000), 0);
        assert_eq!(
            c.pick(&[0, 1], 0, 29_999),
            Pick::To {
                runtime: 1,
                probe: false
            }
        );
        assert_eq!(
            c.pick(&[0, 1], 1, 30_000),
            Pick::To {
                runtime: 0,
                probe: true
            }
        );
        // One probe at a time: the next case goes elsewhere.
        assert_eq!(
            c.pick(&[0, 1], 0, 30_001),
            Pick::To {
                runtime: 1,
                probe: false
            }
        );
        assert!(c.started(0));
        assert!(!c.is_open(0));
    }

    #[test]
    fn every_runtime_open_means_waiting_for_the_soonest_cooldown_at_width_one() {
        let mut c = circuits(&["a", "b"]);
        assert_eq!(c.width(8), 8);
        c.saw(&open("a", 30_000), 0);
        assert_eq!(c.width(8), 4);
        assert_eq!(c.width(1), 1);
        c.saw(&open("b", 20_000), 0);
        assert_eq!(c.width(8), 1);
        assert_eq!(c.pick(&[0, 1], 0, 5_000), Pick::WaitUntil(20_000));
        assert_eq!(c.spill_target(&[0, 1], 0), None);
        // A closed circuit reported restores the width.
        let closed = Circuit {
            runtime: "b".into(),
            open: false,
            retry_at_ms: 0,
        };
        assert!(c.saw(&closed, 6_000));
        assert_eq!(c.width(8), 4);
    }
}
