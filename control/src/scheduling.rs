//! What a batch workflow needs to know to schedule across runtimes, taken from the plan:
//! the runtimes' envelopes (admission), the runtime lists cases were dealt from (spillover,
//! circuit breakers) and the runtimes it shares with other batches (fair share), all compact
//! and indexed, and empty when unused so a batch without them starts exactly as before.

use std::collections::BTreeMap;

use casebatch_manifest::Plan;
use casebatch_manifest::model::RuntimeKind;
use casebatch_proto::share::{
    DEFAULT_PRIORITY, DEFAULT_WEIGHT, ShareInput, ShareSettings, SharedRuntime,
};
use casebatch_proto::{CaseLoad, CaseRoute, Envelope, RouteRuntime, Routes};

/// The envelopes the plan's runtimes declare, and each case's load against them; nothing
/// when no runtime declares one (the batch then admits as it always has).
pub(crate) fn envelopes(plan: &Plan) -> (Vec<Envelope>, Vec<CaseLoad>) {
    let envelopes: Vec<Envelope> = plan
        .runtimes
        .iter()
        .filter(|(_, s)| s.max_concurrent.is_some() || s.memory_budget_mb.is_some())
        .map(|(name, s)| Envelope {
            runtime: name.clone(),
            max_concurrent: s.max_concurrent,
            memory_budget_mb: s.memory_budget_mb,
        })
        .collect();
    if envelopes.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let case_loads = plan
        .cases
        .iter()
        .map(|c| {
            let envelope = c.runtime_name.as_ref().and_then(|name| {
                let i = envelopes.iter().position(|e| &e.runtime == name)?;
                u16::try_from(i).ok()
            });
            CaseLoad(envelope, c.resources.memory_mb.unwrap_or(0))
        })
        .collect();
    (envelopes, case_loads)
}

/// The runtimes the batch shares with other batches (agents, keyed by endpoint so two
/// manifests naming one agent differently share it), and which cases run on each; `None`
/// when no case runs on one. Cases dealt from a runtime list are not queued for a slot.
pub(crate) fn shares(plan: &Plan, user: String) -> Option<ShareInput> {
    let runtimes: Vec<SharedRuntime> = (plan.runtimes.iter())
        .filter(|(_, s)| s.kind == RuntimeKind::Agent)
        .filter_map(|(name, s)| {
            let key = s.endpoint.as_deref()?.trim().trim_end_matches('/');
            Some(SharedRuntime {
                name: name.clone(),
                key: key.to_string(),
                queue_limit: s.queue_limit,
            })
        })
        .collect();
    let cases: Vec<Option<u16>> = (plan.cases.iter())
        .map(|c| {
            if c.runtime_spread.len() >= 2 {
                return None;
            }
            let name = c.runtime_name.as_deref()?;
            let i = runtimes.iter().position(|r| r.name == name)?;
            u16::try_from(i).ok()
        })
        .collect();
    if cases.iter().all(Option::is_none) {
        return None;
    }
    Some(ShareInput {
        settings: ShareSettings {
            user,
            priority: plan.settings.priority.unwrap_or(DEFAULT_PRIORITY),
            weight: plan.settings.weight.unwrap_or(DEFAULT_WEIGHT),
        },
        runtimes,
        cases,
    })
}

/// The runtime lists cases were dealt from, when some case names two or more runtimes.
pub(crate) fn routes(plan: &Plan) -> Option<Routes> {
    let mut routes = Routes::default();
    let mut runtime_index: BTreeMap<&str, u16> = BTreeMap::new();
    let mut list_index: BTreeMap<&[String], u16> = BTreeMap::new();
    for case in &plan.cases {
        let spread = &case.runtime_spread;
        let home = spread.iter().position(|n| n == case.runtime_label());
        let (true, Some(home)) = (spread.len() >= 2, home) else {
            routes.cases.push(None);
            continue;
        };
        let list = match list_index.get(spread.as_slice()) {
            Some(&i) => i,
            None => {
                let indices = spread
                    .iter()
                    .map(|name| {
                        *runtime_index.entry(name).or_insert_with(|| {
                            let breaker = plan
                                .runtime_named(name)
                                .and_then(|(_, spec)| spec)
                                .map(|s| s.breaker())
                                .unwrap_or_default();
                            routes.runtimes.push(RouteRuntime {
                                name: name.clone(),
                                breaker,
                            });
                            (routes.runtimes.len() - 1) as u16
                        })
                    })
                    .collect();
                routes.lists.push(indices);
                let i = (routes.lists.len() - 1) as u16;
                list_index.insert(spread.as_slice(), i);
                i
            }
        };
        routes.cases.push(Some(CaseRoute(list, home as u16)));
    }
    (!routes.lists.is_empty()).then_some(routes)
}
