//! Settings layered by precedence, lowest first: built-in defaults < defaults file < manifest
//! `defaults` < command-line flags < the case's own fields. Object-valued settings (`sandbox`,
//! `resources`, `fake`) are replaced whole by a more specific layer, never merged field by
//! field: a sandbox is only meaningful as a complete description. The environment (`env`,
//! `pass_env`) is the exception: it merges by variable name (see [`merge_environment`]).
//!
//! [`overlay`] stacks the layers below the cases once per batch; a case's own fields are laid
//! over the result where the case is resolved (`case`), next to the checks that must tell a
//! case's own setting from an inherited one.

use std::collections::BTreeMap;

use crate::model::Defaults;

/// Later layer wins field by field; object-valued fields are taken whole.
pub(super) fn overlay(lower: Defaults, upper: &Defaults) -> Defaults {
    let u = upper.clone();
    let (env, pass_env) = merge_environment(
        (lower.env, lower.pass_env),
        (u.env.as_ref(), u.pass_env.as_deref()),
    );
    Defaults {
        concurrency: u.concurrency.or(lower.concurrency),
        max_retries: u.max_retries.or(lower.max_retries),
        max_rate_limit_retries: u.max_rate_limit_retries.or(lower.max_rate_limit_retries),
        timeout_seconds: u.timeout_seconds.or(lower.timeout_seconds),
        sandbox: u.sandbox.or(lower.sandbox),
        resources: u.resources.or(lower.resources),
        harness: u.harness.or(lower.harness),
        evaluator: u.evaluator.or(lower.evaluator),
        pass_when: u.pass_when.or(lower.pass_when),
        runtime: u.runtime.or(lower.runtime),
        controller_url: u.controller_url.or(lower.controller_url),
        device_controller_url: u.device_controller_url.or(lower.device_controller_url),
        fake: u.fake.or(lower.fake),
        oom_auto_boost: u.oom_auto_boost.or(lower.oom_auto_boost),
        prepare_ahead: u.prepare_ahead.or(lower.prepare_ahead),
        priority: u.priority.or(lower.priority),
        weight: u.weight.or(lower.weight),
        heartbeat_every_seconds: u.heartbeat_every_seconds.or(lower.heartbeat_every_seconds),
        epochs: u.epochs.or(lower.epochs),
        budget: u.budget.or(lower.budget),
        rate: u.rate.or(lower.rate),
        env,
        pass_env,
    }
}

/// A layer's `env` and `pass_env`.
type Environment = (Option<BTreeMap<String, String>>, Option<Vec<String>>);

/// Unlike the object-valued settings, environments merge by name: a more specific layer
/// adds variables, and for a name it sets (as a literal in `env` or copied by `pass_env`)
/// its setting replaces the lower layer's.
pub(super) fn merge_environment(
    (lower_env, lower_pass): Environment,
    (upper_env, upper_pass): (Option<&BTreeMap<String, String>>, Option<&[String]>),
) -> Environment {
    if upper_env.is_none() && upper_pass.is_none() {
        return (lower_env, lower_pass);
    }
    let upper_names = |name: &String| {
        upper_env.is_some_and(|e| e.contains_key(name))
            || upper_pass.is_some_and(|p| p.contains(name))
    };
    let mut env: BTreeMap<String, String> = lower_env
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !upper_names(k))
        .collect();
    env.extend(
        upper_env
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let mut pass: Vec<String> = lower_pass
        .unwrap_or_default()
        .into_iter()
        .filter(|k| !upper_names(k))
        .collect();
    pass.extend(upper_pass.into_iter().flatten().cloned());
    (Some(env), Some(pass))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Sandbox;

    #[test]
    fn overlay_replaces_objects_whole() {
        let lower = Defaults {
            concurrency: Some(3),
            sandbox: Some(Sandbox {
                provider: "a".into(),
                template: Some("t".into()),
                platform: None,
                lifetime: Some(60),
                ..Sandbox::local()
            }),
            ..Defaults::default()
        };
        let upper = Defaults {
            sandbox: Some(Sandbox {
                provider: "b".into(),
                template: None,
                platform: None,
                lifetime: None,
                ..Sandbox::local()
            }),
            ..Defaults::default()
        };
        let merged = overlay(lower, &upper);
        assert_eq!(merged.concurrency, Some(3));
        assert_eq!(merged.sandbox.unwrap().template, None);
    }
}
