//! Pure decisions of the case pipeline: what an attempt's stages add up to, and whether the
//! case gets another attempt. No SDK types here, so it is unit-tested directly.

use casebatch_proto::{
    ActorStatus, AttemptSummary, CaseState, FailureClass, FailureCode, OOM_BOOST_CAP_MB, Verdict,
};

/// Crashes that left nothing to adopt are re-dispatched without spending `max_retries`, up
/// to this many times per case.
pub const MAX_REDISPATCHES: u32 = 3;

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The case is over in this state.
    Finish(CaseState),
    /// Run another attempt because a retryable failure happened (counts against max_retries).
    Retry,
    /// Run another attempt because the job was lost with nothing to adopt.
    Redispatch,
    /// Run another attempt with this much memory (in-batch OOM auto-boost).
    Boost(u64),
    /// Run another attempt on another runtime of the case's list (the runtime failed it).
    /// Chosen by the pipeline, which knows the list, from [`spills`]; never by [`next`].
    Spill,
    /// Run another attempt after a wait, because the harness was rate limited (its own cap,
    /// not `max_retries`): the wait the harness asked for, if it did ([`rate_limit_wait_ms`]).
    RateLimited(Option<u64>),
}

/// The failure code a harness declares when an API it calls refused it for its rate.
pub const RATE_LIMITED: &str = "RATE_LIMITED";

/// Rate-limited attempts of one case retried before `max_retries` counts them (the
/// manifest's `max_rate_limit_retries`, when it does not say).
pub const DEFAULT_MAX_RATE_LIMIT_RETRIES: u32 = 10;

/// The wait before the `n`th (from 1) retry of a rate-limited case: what the harness asked
/// for, or else exponential backoff from 1 s, capped at 60 s, with jitter between half and
/// all of it so that cases limited together do not return together. `seed` makes the jitter:
/// the workflow has no randomness of its own, so the case's identity is hashed into it
/// (deterministic under replay, different for each case and attempt).
pub fn rate_limit_wait_ms(asked_ms: Option<u64>, n: u32, seed: u64) -> u64 {
    if let Some(ms) = asked_ms {
        return ms;
    }
    let ceiling = (1_000u64 << n.saturating_sub(1).min(16)).min(60_000);
    let half = ceiling / 2;
    half + splitmix64(seed) % (ceiling - half + 1)
}

/// SplitMix64's finalizer: spreads a seed's bits over the whole word.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether a failure is the runtime's, so the case may move to another runtime of its list:
/// a retryable infra failure of the dispatch (provision, submit), or a runtime that became
/// unreachable, lost the job or lost the node under it. Never an OOM kill (the case's own
/// size), config, harness or agent failures: those would fail the same way anywhere.
pub fn spills(f: &casebatch_proto::Failure) -> bool {
    use casebatch_proto::Stage;
    f.class == FailureClass::Infra
        && f.retryable
        && f.code != FailureCode::OomKilled
        && (matches!(f.stage, Stage::Provision | Stage::Submit)
            || matches!(
                f.code,
                FailureCode::RuntimeUnreachable | FailureCode::JobLost | FailureCode::NodeFailed
            ))
}

/// Whether a spillover of this failure is free of the per-list cap (see [`spills`]): the
/// failed probe of an open circuit, or a runtime that did not answer. Neither says anything
/// about the case, and each costs the breaker's cooldown or the runtime's grace, so the
/// circuits, not a count, bound how often a case moves.
pub fn spills_freely(probe: bool, f: &casebatch_proto::Failure) -> bool {
    spills(f) && (probe || f.code == FailureCode::RuntimeUnreachable)
}

/// What the batch allows beyond a first attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    pub max_retries: u32,
    pub oom_auto_boost: bool,
    /// Rate-limited attempts retried on their own count (0: they spend `max_retries`, as in
    /// runs recorded before the rule).
    pub max_rate_limit_retries: u32,
}

/// Budget already spent by earlier attempts of this case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    pub retries: u32,
    pub redispatches: u32,
    pub rate_limited: u32,
}

/// The outcome of a finished attempt, before any retry decision.
pub fn attempt_state(s: &AttemptSummary) -> CaseState {
    if s.actor == Some(ActorStatus::Cancelled) {
        return CaseState::Cancelled;
    }
    // A failed trace pull keeps the work but leaves the case incomplete: not a success. Only
    // retry-failed collects again; the workflow never re-runs an actor for a trace.
    if s.failure.is_some() || s.collect_failure.is_some() {
        return CaseState::Failed;
    }
    if is_verified_success(s.actor, s.evaluation_configured, s.verdict) {
        CaseState::Succeeded
    } else {
        CaseState::Failed
    }
}

/// Whether an attempt is over for good as soon as `settle` reports it, whatever the policy,
/// the budget left or a later cancel: its actor ran to its end, and it succeeded or failed for
/// a reason no retry, boost or spillover changes (nothing of class infra). `settle` closes
/// such an attempt itself; [`next`] and [`spills`] agree (tested below).
pub fn is_final_when_settled(s: &AttemptSummary) -> bool {
    s.actor == Some(ActorStatus::Finished)
        && (attempt_state(s) != CaseState::Failed
            || s.failure.as_ref().is_none_or(|f| {
                // An OOM kill is boosted whatever class a harness declared it with.
                f.class != FailureClass::Infra && f.code != FailureCode::OomKilled
            }))
}

/// The success rule: the actor finished, and its evaluator (when one is configured) said
/// pass. A finished actor with a pending or failed evaluation is not a verified success.
pub fn is_verified_success(
    actor: Option<ActorStatus>,
    evaluation_configured: bool,
    verdict: Option<Verdict>,
) -> bool {
    let verified = !evaluation_configured || verdict == Some(Verdict::Pass);
    actor == Some(ActorStatus::Finished) && verified
}

/// The memory an OOM-killed case gets next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomBoost {
    /// Double the size it died at.
    To(u64),
    /// Doubling would pass [`OOM_BOOST_CAP_MB`]: only a change of the spec can help.
    PastCap,
    /// It ran without a known limit, so there is nothing to double.
    UnknownSize,
}

/// Same size, same death: the next size doubles the last one (64 → 128 → 256 ...), capped.
pub fn oom_boost(limit_mb: Option<u64>) -> OomBoost {
    match limit_mb.map(|mb| mb * 2) {
        Some(mb) if mb <= OOM_BOOST_CAP_MB => OomBoost::To(mb),
        Some(_) => OomBoost::PastCap,
        None => OomBoost::UnknownSize,
    }
}

/// Decide the next step from the attempt's summary and the budget left. A batch cancel stops
/// retries; an attempt that ended before the cancel keeps its own outcome.
pub fn next(s: &AttemptSummary, cancelled: bool, policy: Policy, spent: Spent) -> Next {
    let state = attempt_state(s);
    if cancelled || state != CaseState::Failed {
        return Next::Finish(state);
    }
    let Some(failure) = &s.failure else {
        return Next::Finish(state);
    };
    if failure.code == FailureCode::OomKilled && policy.oom_auto_boost {
        return match oom_boost(s.memory_limit_mb) {
            OomBoost::To(mb) => Next::Boost(mb),
            OomBoost::PastCap | OomBoost::UnknownSize => Next::Finish(state),
        };
    }
    if failure.class != FailureClass::Infra || !failure.retryable {
        return Next::Finish(state);
    }
    if failure.code == FailureCode::JobLost && spent.redispatches < MAX_REDISPATCHES {
        return Next::Redispatch;
    }
    if failure.code.as_str() == RATE_LIMITED && spent.rate_limited < policy.max_rate_limit_retries {
        return Next::RateLimited(s.retry_after_ms);
    }
    if spent.retries < policy.max_retries {
        Next::Retry
    } else {
        Next::Finish(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::{Failure, Stage};

    fn retries(max_retries: u32) -> Policy {
        Policy {
            max_retries,
            oom_auto_boost: false,
            max_rate_limit_retries: DEFAULT_MAX_RATE_LIMIT_RETRIES,
        }
    }

    fn summary(actor: ActorStatus, failure: Option<Failure>) -> AttemptSummary {
        AttemptSummary {
            attempt: 1,
            actor: Some(actor),
            exit_code: Some(0),
            evaluation_configured: false,
            verdict: None,
            failure,
            collect_failure: None,
            adopted: false,
            memory_boost_mb: None,
            memory_limit_mb: None,
            cleanup_confirmed: None,
            started_at_ms: None,
            ended_at_ms: None,
            speculative_loser: false,
            probe: false,
            usage: None,
            retry_after_ms: None,
            stranded: false,
            logs_capped: None,
        }
    }

    /// Every failure code in every class, every actor status, with and without a verdict,
    /// under every policy and budget, cancelled or not: an attempt `settle` would close is one
    /// the workflow finishes in the state `settle` recorded, and never moves elsewhere.
    #[test]
    fn an_attempt_final_when_settled_is_finished_by_every_decision() {
        let classes = [
            FailureClass::Infra,
            FailureClass::Config,
            FailureClass::Harness,
            FailureClass::Agent,
        ];
        let mut failures = vec![None];
        for code in FailureCode::ALL {
            for class in classes {
                for retryable in [false, true] {
                    let f = Failure::new(Stage::Await, class, code.clone(), "x", retryable);
                    failures.push(Some(f));
                }
            }
        }
        let mut closed = 0;
        for actor in [
            ActorStatus::Finished,
            ActorStatus::Failed,
            ActorStatus::Cancelled,
        ] {
            for failure in &failures {
                for (configured, verdict) in [
                    (false, None),
                    (true, None),
                    (true, Some(Verdict::Pass)),
                    (true, Some(Verdict::Fail)),
                ] {
                    let mut s = summary(actor, failure.clone());
                    s.evaluation_configured = configured;
                    s.verdict = verdict;
                    s.memory_limit_mb = Some(64);
                    if !is_final_when_settled(&s) {
                        continue;
                    }
                    closed += 1;
                    assert!(failure.as_ref().is_none_or(|f| !spills(f)), "{s:?}");
                    for policy in [retries(0), retries(3)] {
                        for boost in [false, true] {
                            let policy = Policy {
                                oom_auto_boost: boost,
                                ..policy
                            };
                            for cancelled in [false, true] {
                                assert_eq!(
                                    next(&s, cancelled, policy, Spent::default()),
                                    Next::Finish(attempt_state(&s)),
                                    "{s:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(closed > 0);
    }

    #[test]
    fn a_failed_trace_pull_is_incomplete_and_never_retried_in_batch() {
        let mut s = summary(ActorStatus::Finished, None);
        s.collect_failure = Some(Failure::infra(
            Stage::Collect,
            FailureCode::TraceCollectFailed,
            "down",
        ));
        assert_eq!(attempt_state(&s), CaseState::Failed);
        assert_eq!(
            next(&s, false, retries(5), Spent::default()),
            Next::Finish(CaseState::Failed)
        );
    }

    #[test]
    fn oom_auto_boost_doubles_until_the_cap() {
        let mut s = summary(ActorStatus::Failed, Some(Failure::oom(Some(64))));
        s.memory_limit_mb = Some(64);
        let boost = Policy {
            max_retries: 0,
            oom_auto_boost: true,
            max_rate_limit_retries: 0,
        };
        assert_eq!(next(&s, false, boost, Spent::default()), Next::Boost(128));
        s.memory_limit_mb = Some(OOM_BOOST_CAP_MB);
        assert_eq!(
            next(&s, false, boost, Spent::default()),
            Next::Finish(CaseState::Failed)
        );
        s.memory_limit_mb = Some(64);
        assert_eq!(
            next(&s, false, retries(5), Spent::default()),
            Next::Finish(CaseState::Failed)
        );
    }

    #[test]
    fn finished_actor_without_evaluator_succeeds() {
        let s = summary(ActorStatus::Finished, None);
        assert_eq!(
            next(&s, false, retries(1), Spent::default()),
            Next::Finish(CaseState::Succeeded)
        );
    }

    #[test]
    fn finished_actor_with_missing_verdict_is_not_a_success() {
        let mut s = summary(ActorStatus::Finished, None);
        s.evaluation_configured = true;
        assert_eq!(attempt_state(&s), CaseState::Failed);
        s.verdict = Some(Verdict::Pass);
        assert_eq!(attempt_state(&s), CaseState::Succeeded);
    }

    #[test]
    fn retryable_infra_is_retried_until_budget_is_spent() {
        let f = Failure::infra(Stage::Submit, FailureCode::SpawnFailed, "boom");
        let s = summary(ActorStatus::Failed, Some(f));
        assert_eq!(next(&s, false, retries(2), Spent::default()), Next::Retry);
        let spent = Spent {
            retries: 2,
            ..Spent::default()
        };
        assert_eq!(
            next(&s, false, retries(2), spent),
            Next::Finish(CaseState::Failed)
        );
        assert_eq!(
            next(&s, false, retries(0), Spent::default()),
            Next::Finish(CaseState::Failed)
        );
    }

    #[test]
    fn harness_config_agent_and_oom_are_never_retried() {
        let failures = [
            Failure::harness(Stage::Await, FailureCode::HarnessExitNonzero, "exit 3"),
            Failure::config(Stage::Provision, FailureCode::NoHarness, "no harness"),
            Failure::agent("verdict fail"),
            Failure::oom(Some(64)),
        ];
        for f in failures {
            let s = summary(ActorStatus::Failed, Some(f.clone()));
            assert_eq!(
                next(&s, false, retries(5), Spent::default()),
                Next::Finish(CaseState::Failed),
                "{f}"
            );
        }
    }

    #[test]
    fn rate_limits_have_their_own_cap_and_then_spend_retries() {
        let f = Failure::new(
            Stage::Await,
            FailureClass::Infra,
            FailureCode::Declared(RATE_LIMITED.into()),
            "429",
            true,
        );
        let mut s = summary(ActorStatus::Failed, Some(f));
        s.retry_after_ms = Some(2000);
        assert_eq!(
            next(&s, false, retries(0), Spent::default()),
            Next::RateLimited(Some(2000))
        );
        let spent = Spent {
            rate_limited: DEFAULT_MAX_RATE_LIMIT_RETRIES,
            ..Spent::default()
        };
        assert_eq!(next(&s, false, retries(1), spent), Next::Retry);
        assert_eq!(
            next(&s, false, retries(0), spent),
            Next::Finish(CaseState::Failed)
        );
        // A run recorded before the rule spends max_retries, as it did.
        let before = Policy {
            max_rate_limit_retries: 0,
            ..retries(1)
        };
        assert_eq!(next(&s, false, before, Spent::default()), Next::Retry);
        // Not retryable, or not infra: the harness said it is final.
        s.failure.as_mut().unwrap().retryable = false;
        assert_eq!(
            next(&s, false, retries(3), Spent::default()),
            Next::Finish(CaseState::Failed)
        );
    }

    #[test]
    fn a_rate_limit_waits_as_asked_or_backs_off_exponentially_with_jitter() {
        assert_eq!(rate_limit_wait_ms(Some(2500), 7, 1), 2500);
        for n in 1..=12 {
            let ceiling = (1000u64 << (n - 1)).min(60_000);
            let waits: Vec<u64> = (0..50)
                .map(|seed| rate_limit_wait_ms(None, n, seed))
                .collect();
            assert!(
                waits.iter().all(|w| (ceiling / 2..=ceiling).contains(w)),
                "{n}: {waits:?}"
            );
            // Jitter: cases limited together come back apart.
            let mut distinct = waits.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert!(distinct.len() > 25, "{n}: {waits:?}");
        }
        assert_eq!(
            rate_limit_wait_ms(None, 3, 42),
            rate_limit_wait_ms(None, 3, 42)
        );
    }

    #[test]
    fn lost_jobs_are_redispatched_without_spending_retries() {
        let f = Failure::infra(Stage::Await, FailureCode::JobLost, "gone");
        let s = summary(ActorStatus::Failed, Some(f));
        assert_eq!(
            next(&s, false, retries(0), Spent::default()),
            Next::Redispatch
        );
        let spent = Spent {
            redispatches: MAX_REDISPATCHES,
            ..Spent::default()
        };
        assert_eq!(
            next(&s, false, retries(0), spent),
            Next::Finish(CaseState::Failed)
        );
    }

    #[test]
    fn cancel_stops_retries_but_keeps_finished_outcomes() {
        let f = Failure::infra(Stage::Submit, FailureCode::SpawnFailed, "boom");
        let failed = summary(ActorStatus::Failed, Some(f));
        let none = Spent::default();
        assert_eq!(
            next(&failed, true, retries(5), none),
            Next::Finish(CaseState::Failed)
        );
        let done = summary(ActorStatus::Finished, None);
        assert_eq!(
            next(&done, true, retries(5), none),
            Next::Finish(CaseState::Succeeded)
        );
        let cancelled = summary(ActorStatus::Cancelled, None);
        assert_eq!(
            next(&cancelled, true, retries(5), none),
            Next::Finish(CaseState::Cancelled)
        );
    }

    #[test]
    fn only_the_runtime_s_own_failures_spill_to_another_runtime() {
        let unreachable = Failure::infra(Stage::Submit, FailureCode::RuntimeUnreachable, "refused");
        assert!(spills(&unreachable));
        assert!(spills(&Failure::infra(
            Stage::Provision,
            FailureCode::ProvisionIo,
            "disk"
        )));
        assert!(spills(&Failure::infra(
            Stage::Await,
            FailureCode::JobLost,
            "gone"
        )));
        // A job that failed on a healthy runtime would fail the same way elsewhere.
        assert!(!spills(&Failure::infra(
            Stage::Await,
            FailureCode::ActivityError,
            "x"
        )));
        assert!(!spills(&Failure::oom(Some(64))));
        assert!(!spills(&Failure::config(
            Stage::Submit,
            FailureCode::SpawnFailed,
            "no such harness"
        )));
        assert!(!spills(&Failure::agent("the agent gave up")));
        let mut fatal = unreachable;
        fatal.retryable = false;
        assert!(!spills(&fatal));
    }
}
