//! A new run's `BatchInput`: the plan's settings and schedule, the state it carries, the
//! memory `retry-failed` granted, and tail speculation's seed from the run history.

use std::collections::BTreeMap;

use casebatch_bundle::{Bundle, Lineage, read_json_if_present};
use casebatch_manifest::Plan;
use casebatch_proto::{BatchInput, Budget, Carried, Speculation};

use crate::error::Result;
use crate::options::DriveOptions;
use crate::prepare::RETRY_BACKOFF_MS;
use crate::{run_history, scheduling};

/// The input of a new run of the batch's workflow.
pub(crate) fn batch_input(
    bundle: &Bundle,
    plan: &Plan,
    carried: Option<Carried>,
    opts: &DriveOptions,
    search_attributes: bool,
) -> Result<BatchInput> {
    let (envelopes, case_loads) = scheduling::envelopes(plan);
    let routes = scheduling::routes(plan);
    let mut input = BatchInput {
        batch_id: plan.batch_id.clone(),
        bundle_dir: bundle.root().display().to_string(),
        fingerprint: plan.fingerprint.clone(),
        case_count: plan.cases.len() as u32,
        concurrency: plan.settings.concurrency,
        max_retries: plan.settings.max_retries,
        retry_backoff_ms: RETRY_BACKOFF_MS,
        max_timeout_seconds: plan
            .cases
            .iter()
            .map(|c| c.timeout_seconds)
            .max()
            .unwrap_or(600),
        carried,
        history_budget: opts.history_budget,
        oom_auto_boost: plan.settings.oom_auto_boost,
        memory_boosts: memory_boosts(bundle, plan)?,
        search_attributes,
        envelopes,
        case_loads,
        speculation: None,
        // A routed case's runtime is picked at dispatch: nothing to provision it on before.
        prepare_ahead: if routes.is_some() {
            0
        } else {
            plan.settings.prepare_ahead
        },
        routes,
        heartbeat_every_ms: plan.settings.heartbeat_every_seconds.map(|s| s * 1000),
        budget: budget(plan, opts),
        max_rate_limit_retries: plan.settings.max_rate_limit_retries,
        pace: plan.settings.rate.clone().map(Into::into),
        share: scheduling::shares(plan, crate::user::user_at_host()),
    };
    // Only cases dealt from a `runtime:` list are raced.
    if input.routes.is_some() && !opts.no_speculation {
        input.speculation = Some(Speculation {
            seed_ms: run_history::speculation_seed_ms(plan, bundle, opts.history_db.as_deref()),
        });
    }
    Ok(input)
}

/// The plan's budget with the run's own limits (`resume --budget`) over it, name by name.
fn budget(plan: &Plan, opts: &DriveOptions) -> Option<Budget> {
    let planned = plan.settings.budget.map(Budget::from);
    let Some(over) = opts.budget else {
        return planned;
    };
    let base = planned.unwrap_or_default();
    Some(Budget {
        cost_usd: over.cost_usd.or(base.cost_usd),
        tokens: over.tokens.or(base.tokens),
    })
}

/// Per-case memory granted by `retry-failed` (from lineage.json), by case index. Only a batch
/// made by `retry-failed` has a lineage; a damaged one is an error, not "no boosts", which
/// would run an OOM-killed case again at the size it died at.
fn memory_boosts(bundle: &Bundle, plan: &Plan) -> Result<BTreeMap<u32, u64>> {
    let Some(lineage) = read_json_if_present::<Lineage>(&bundle.lineage())? else {
        return Ok(Default::default());
    };
    Ok(plan
        .cases
        .iter()
        .filter_map(|c| {
            let mb = lineage.memory_boost_mb.get(&c.case_id)?;
            Some((c.index, *mb))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_lineage_is_an_error_not_no_boosts() {
        let dir = tempfile::tempdir().unwrap();
        let plan = crate::test_plan::two_cases(dir.path());
        let bundle = Bundle::at(dir.path().join("t"));
        assert!(memory_boosts(&bundle, &plan).unwrap().is_empty());
        std::fs::create_dir_all(bundle.root()).unwrap();
        std::fs::write(bundle.lineage(), b"{\"memory_boost_mb\": {\"a\": 12").unwrap();
        let err = memory_boosts(&bundle, &plan).unwrap_err();
        assert!(err.to_string().contains("lineage.json"), "{err}");
    }

    #[test]
    fn the_input_names_this_plan_and_bundle_and_carries_what_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let plan = crate::test_plan::two_cases(dir.path());
        let bundle = Bundle::at(dir.path().join("t"));
        let carried = Carried {
            slots: vec![Default::default(); 2],
            ..Carried::default()
        };
        let opts = DriveOptions {
            history_budget: Some(40),
            ..DriveOptions::default()
        };
        let input = batch_input(&bundle, &plan, Some(carried.clone()), &opts, true).unwrap();
        assert_eq!(input.fingerprint, plan.fingerprint);
        assert_eq!(input.bundle_dir, bundle.root().display().to_string());
        assert_eq!((input.case_count, input.history_budget), (2, Some(40)));
        assert_eq!(input.carried, Some(carried));
        assert!(input.search_attributes);
        // No runtime lists: nothing routed, nothing raced.
        assert!(input.routes.is_none() && input.speculation.is_none());
    }
}
