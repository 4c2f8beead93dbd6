//! Where a case dealt from a runtime list runs: the dispatch of its `start` over the list as
//! the batch's circuits allow, and its spillover to the next runtime when one fails it.

use std::time::Duration;

use casebatch_proto::{AttemptKey, AttemptSummary, SettleShort, StartInput, StartResult};
use temporalio_sdk::{ActivityExecutionError, WorkflowCancellationToken, WorkflowContext};

use super::options::stage_options;
use super::params::CaseDone;
use crate::circuits::Pick;
use crate::contracts::Start;
use crate::decide;
use crate::shared::{Host, cost, note, workflow_ms};

/// Where a case dealt from a runtime list is: its list, the runtime it is on (its share
/// until it spills over), and how often it moved.
pub(crate) struct Route {
    pub(super) list: Vec<u16>,
    pub(super) current: u16,
    pub(super) spills: u32,
}

impl Route {
    pub(super) fn of<H: Host>(ctx: &WorkflowContext<H>, case: u32) -> Option<Self> {
        let (list, home) = ctx.state(|s| s.shared().circuits.as_ref()?.route_of(case))?;
        Some(Self {
            list,
            current: home,
            spills: 0,
        })
    }

    /// The next runtime of the list after the current one whose circuit the batch has not
    /// seen open, with the names of both (for the timeline).
    pub(super) fn next_healthy<H: Host>(
        &self,
        ctx: &WorkflowContext<H>,
    ) -> Option<(u16, String, String)> {
        ctx.state(|s| {
            let c = s.shared().circuits.as_ref()?;
            let to = c.spill_target(&self.list, self.current)?;
            Some((to, c.name(self.current).to_string(), c.name(to).to_string()))
        })
    }
}

/// What an attempt of a routed case updates besides its summary.
pub(super) struct Routed<'a> {
    pub(super) route: Option<&'a mut Route>,
    pub(super) done: &'a mut CaseDone,
}

/// Runs `start`. A routed case goes where the batch's view of the circuits says (setting
/// the key's runtime); a runtime whose breaker refuses the dispatch (`Skipped`) costs no
/// attempt, and the case goes to the next of its list, or waits for the soonest cooldown
/// when every circuit is open. `None`: cancelled while waiting. Also says whether the start
/// that counts was the probe of an open circuit.
pub(super) async fn dispatch<H: Host>(
    ctx: &WorkflowContext<H>,
    key: &mut AttemptKey,
    settle: Option<SettleShort>,
    cancel: &WorkflowCancellationToken,
    routed: &mut Routed<'_>,
) -> (Option<Result<StartResult, ActivityExecutionError>>, bool) {
    // A start that may watch its job gets that long on top.
    let watch = settle.as_ref().map_or(0, |s| s.within_ms);
    let short = Duration::from_secs(60) + Duration::from_millis(watch);
    let mut skips = 0u32;
    loop {
        let target = match routed.route.as_deref_mut() {
            Some(route) => match choose(ctx, route, key, cancel, routed.done).await {
                Chosen::Runtime(runtime, probe) => Some((runtime, probe)),
                Chosen::Waited if cancel.is_cancelled() => return (None, false),
                Chosen::Waited => continue,
                Chosen::Unrouted => None,
            },
            None => None,
        };
        // Every dispatch of an attempt has its own activity id; the first keeps the id
        // recorded before routing existed.
        let stage = match skips {
            0 => "start".to_string(),
            n => format!("start.{n}"),
        };
        let opts = stage_options(ctx, &stage, key, short, None, cancel);
        cost(ctx, |a| a.activities += 1);
        let input = match &settle {
            Some(settle) => StartInput::Settling {
                key: key.clone(),
                settle: Box::new(settle.clone()),
            },
            None => StartInput::Key(key.clone()),
        };
        let result = ctx.execute_activity(Start, input, opts).await;
        let Some((runtime, probe)) = target else {
            return (Some(result), false);
        };
        record_dispatch(ctx, runtime, probe, &result);
        if let Ok(StartResult::Skipped { .. }) = result {
            skips += 1;
            routed.done.tally.circuit_skips += 1;
            continue;
        }
        return (Some(result), probe);
    }
}

/// Where a routed dispatch goes.
enum Chosen {
    /// To this runtime of the list (and whether it is the probe of an open circuit).
    Runtime(u16, bool),
    /// Every circuit of the list is open: it waited for the soonest cooldown, or a cancel.
    Waited,
    /// The batch has no circuits.
    Unrouted,
}

/// Picks the runtime of the case's list for the next dispatch, as the batch's circuits
/// say, and sets the key's runtime; waits when every circuit of the list is open.
async fn choose<H: Host>(
    ctx: &WorkflowContext<H>,
    route: &mut Route,
    key: &mut AttemptKey,
    cancel: &WorkflowCancellationToken,
    done: &mut CaseDone,
) -> Chosen {
    let now = workflow_ms(ctx);
    let (pick, avoided) = ctx.state_mut(|s| {
        let Some(c) = s.shared_mut().circuits.as_mut() else {
            return (None, false);
        };
        let avoided = c.is_open(route.current);
        (Some(c.pick(&route.list, route.current, now)), avoided)
    });
    match pick {
        Some(Pick::To { runtime, probe }) => {
            // Sent elsewhere, untried, because the batch knows its circuit is open.
            if avoided && runtime != route.current {
                done.tally.circuit_skips += 1;
            }
            route.current = runtime;
            key.runtime = ctx.state(|s| {
                s.shared()
                    .circuits
                    .as_ref()
                    .map(|c| c.name(runtime).to_string())
            });
            Chosen::Runtime(runtime, probe)
        }
        Some(Pick::WaitUntil(at)) => {
            let wait = Duration::from_millis(at.saturating_sub(now));
            cost(ctx, |a| a.timers += 1);
            temporalio_sdk::workflows::select! {
                _ = ctx.timer(wait) => {}
                _ = cancel.cancelled() => {}
            }
            Chosen::Waited
        }
        None => Chosen::Unrouted,
    }
}

/// What a routed `start` tells the batch's circuits: a runtime that started a job, or one
/// whose breaker answered. A circuit is the runtime's news, not the case's: it goes on the
/// timeline at once, and the admission loop is woken (the width may change).
fn record_dispatch<H: Host>(
    ctx: &WorkflowContext<H>,
    runtime: u16,
    probe: bool,
    result: &Result<StartResult, ActivityExecutionError>,
) {
    let now = workflow_ms(ctx);
    let (news, name) = ctx.state_mut(|s| {
        let shared = s.shared_mut();
        let c = shared
            .circuits
            .as_mut()
            .expect("a routed case has circuits");
        let news = match result {
            Ok(
                StartResult::Started(_) | StartResult::Watched { .. } | StartResult::Settled { .. },
            ) => c.started(runtime).then_some(false),
            Ok(
                StartResult::Skipped { circuit }
                | StartResult::Failed {
                    circuit: Some(circuit),
                    ..
                },
            ) => c.saw(circuit, now).then_some(circuit.open),
            _ => None,
        };
        if probe {
            c.probe_done(runtime);
        }
        if news.is_some() {
            shared.wakeups += 1;
        }
        (news, c.name(runtime).to_string())
    });
    match news {
        Some(true) => note(ctx, None, format!("runtime {name}: circuit open")),
        Some(false) => note(
            ctx,
            None,
            format!("runtime {name}: circuit closed (a dispatch reached it)"),
        ),
        None => {}
    }
}

/// Moves a routed case whose attempt the runtime failed ([`decide::spills`]) to the next
/// runtime of its list not seen open, at most once per runtime of the list. Returns the
/// timeline note.
pub(super) fn spill_over<H: Host>(
    ctx: &WorkflowContext<H>,
    s: &AttemptSummary,
    cancel: &WorkflowCancellationToken,
    routed: &mut Routed<'_>,
    outage_rules: bool,
) -> Option<String> {
    let route = routed.route.as_deref_mut()?;
    let failure = s.failure.as_ref()?;
    // A failed probe, or a runtime that did not answer, moves the case on whenever another
    // runtime of its list is not seen open: the case fails for an unreachable runtime only
    // once every runtime of its list was tried and is open. Other dispatch failures move it
    // at most once per runtime of the list.
    let free = outage_rules && decide::spills_freely(s.probe, failure);
    if cancel.is_cancelled()
        || !decide::spills(failure)
        || (!free && route.spills >= route.list.len() as u32)
    {
        return None;
    }
    let (to, from_name, to_name) = route.next_healthy(ctx)?;
    route.current = to;
    route.spills += u32::from(!free);
    Some(format!(
        "runtime spillover {from_name} → {to_name} ({})",
        failure.code.as_str()
    ))
}
