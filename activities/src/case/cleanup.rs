//! `cleanup`: the end of every attempt. Kills what is left of it, writes its receipt and
//! record, and (unless it is evidence only) the case's result; a `settle` that closes a final
//! attempt ends it the same way.

use casebatch_proto::CaseState;
use std::sync::Arc;
use std::time::Instant;

use casebatch_bundle::closing::{self, Harvest};
use casebatch_bundle::{AttemptRecord, BundleError, CleanupReceipt, Entry, write_json_atomic};
use casebatch_proto::{
    AttemptSummary, CleanupInput, CleanupReport, Failure, FailureCode, Stage, UNANSWERED_WAIT_S,
    Usage,
};
use casebatch_runtime::AttemptEnv;
use casebatch_telemetry::AttemptEnd;
use casebatch_workflows::decide;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tracing::Instrument;

use super::context::{CaseActivities, attempt_span, heartbeating, journal_of};
use super::space::{bundle_write, make_dir};
use crate::beats::StageContext;
use crate::timings::StageTimings;

/// How an attempt is closed (from `cleanup`'s input; a `settle` closes only final attempts).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Closing {
    pub(crate) will_retry: bool,
    /// Its `start` never reached the runtime: nothing to stop or ask there.
    pub(crate) never_submitted: bool,
    /// Its runtime did not answer for its job: wait for it longer (up to `UNANSWERED_WAIT_S`).
    pub(crate) patient: bool,
}

impl Closing {
    pub(crate) fn of_final() -> Self {
        Self {
            will_retry: false,
            never_submitted: false,
            patient: false,
        }
    }
}

impl CaseActivities {
    pub(crate) async fn cleanup_attempt(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: CleanupInput,
    ) -> Result<CleanupReport, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(&input.key)?;
        let span = attempt_span(&env);
        async move {
            let closing = Closing {
                will_retry: input.will_retry,
                never_submitted: input.never_submitted,
                patient: input.patient,
            };
            let report = self
                .close(&ctx, &env, &input.summary, closing, ctx.timings())
                .await;
            self.metrics.stage("cleanup", began.elapsed());
            report
        }
        .instrument(span)
        .await
    }

    /// The runtime's cleanup of the attempt, or the receipt of one that never reached it.
    async fn runtime_cleanup(&self, env: &AttemptEnv, closing: Closing) -> CleanupReceipt {
        // A remote runtime never reached holds nothing: asking it would only wait out its
        // grace. Local runtimes clean up what provisioning made here all the same.
        if closing.never_submitted && self.runtimes.executor(env).is_remote() {
            return CleanupReceipt {
                cleanup_confirmed: true,
                message: format!(
                    "runtime `{}` holds nothing of this attempt: its submit never reached it \
                     (no connection), or it refused the job",
                    env.case.runtime_label()
                ),
                checks: vec!["not_submitted".into()],
                held_job: Some(false),
                ..CleanupReceipt::begun(env.marker(), "not_submitted")
            };
        }
        if closing.patient {
            // Five times the runtime's own patience (at most `UNANSWERED_WAIT_S`, all of it
            // when it declares none): long enough to ride out what made it stop answering.
            let declared = env
                .runtime_spec
                .as_ref()
                .and_then(|s| s.unreachable_grace_s);
            let patience =
                declared.map_or(UNANSWERED_WAIT_S, |g| (5 * g).clamp(10, UNANSWERED_WAIT_S));
            let env = env.clone().with_unreachable_grace(patience);
            return self.runtimes.executor(&env).cleanup(&env).await;
        }
        self.runtimes.executor(env).cleanup(env).await
    }

    /// Kills what is left of the attempt, writes its receipt and its record, and (unless it
    /// is evidence only: a speculation's loser, a stranded attempt) the case's result: the
    /// end of every attempt, by `cleanup` or by a `settle` that closed a final attempt. Safe
    /// to run again (a retry): the attempt is logged once per distinct record.
    pub(crate) async fn close(
        &self,
        ctx: &StageContext,
        env: &AttemptEnv,
        s: &AttemptSummary,
        closing: Closing,
        mut timings: StageTimings,
    ) -> Result<CleanupReport, ActivityError> {
        let will_retry = closing.will_retry;
        bundle_write(ctx, Stage::Cleanup, || make_dir(&env.dir)).await?;
        let cleaned = timings.time(Stage::Cleanup, self.runtime_cleanup(env, closing));
        let receipt = heartbeating(ctx, (), cleaned).await;
        let held_job = receipt.held_job == Some(true);
        let confirmed = receipt.cleanup_confirmed;

        let record = closing::attempt_record(&env.case, s, &receipt, will_retry, Vec::new());
        // Cleanup can run more than once for an attempt (an activity retry, or a local
        // activity re-run on replay): log an attempt only once per distinct record (its
        // timings aside: each run of cleanup has its own).
        let journal = journal_of(env).await;
        let already_logged = journal.record.as_ref().is_some_and(|p| {
            AttemptRecord {
                stages: Vec::new(),
                ..p.clone()
            } == record
        });
        let record = AttemptRecord {
            stages: timings.with_recorded(journal.stages.clone()),
            ..record
        };
        // The receipt and the record, in one write.
        let unconfirmed_why = receipt.message.clone();
        let closed = [Entry::Cleanup(receipt), Entry::Record(record)];
        bundle_write(ctx, Stage::Cleanup, || {
            env.record(&closed).map_err(BundleError::from)
        })
        .await?;
        let end = |outcome| AttemptEnd {
            outcome,
            failure_class: s.failure.as_ref().map(|f| f.class.as_str()),
            failure_code: s.failure.as_ref().map(|f| f.code.as_str()),
            is_final: !will_retry,
            adopted: s.adopted,
            cleanup_confirmed: confirmed,
            runtime: env.case.runtime.as_str(),
            duration: s.duration_ms().map(std::time::Duration::from_millis),
        };
        // Evidence, never the case's result: the attempt that counts writes that.
        if s.is_evidence_only() {
            if !already_logged {
                let (outcome, what) = if s.speculative_loser {
                    (
                        "speculative_loser",
                        "speculative loser: stopped, the other copy counts".to_string(),
                    )
                } else {
                    let found = if held_job {
                        "its runtime answered holding the job (stopped; paid for twice)"
                    } else {
                        "its runtime answered holding nothing of it"
                    };
                    (
                        "stranded",
                        format!("stranded while the case moved on: {found}"),
                    )
                };
                self.metrics.attempt_closed(end(outcome));
                let unconfirmed = if confirmed {
                    ""
                } else {
                    "; cleanup NOT confirmed"
                };
                env.event("attempt_finished", format!("{what}{unconfirmed}"));
            }
            return Ok(CleanupReport {
                cleanup_confirmed: confirmed,
                failure: None,
                held_job,
                heartbeats: ctx.sent(),
            });
        }

        let state = if will_retry {
            CaseState::Retrying
        } else {
            decide::attempt_state(s)
        };
        // The one full parse of the harness's result: its outputs and scores move into the
        // case result.
        let harvest = Harvest {
            job_starts: self.runtimes.executor(env).job_starts(env),
            harness: env.harness_result().await,
            evaluation: journal.evaluation.clone(),
        };
        let result = closing::case_result(&env.bundle, &env.case, s, state, confirmed, harvest);
        let result_path = env.bundle.case_result(&env.case.case_dir);
        bundle_write(ctx, Stage::Cleanup, || {
            write_json_atomic(&result_path, &result)
        })
        .await?;
        let simulated = if result.simulated { " (simulated)" } else { "" };
        if !already_logged {
            tracing::info!(
                state = state.as_str(),
                cleanup_confirmed = confirmed,
                "attempt closed"
            );
            self.metrics.attempt_closed(end(state.as_str()));
            if let Some(u) = &s.usage {
                let (input, output) = (u.get(Usage::INPUT_TOKENS), u.get(Usage::OUTPUT_TOKENS));
                self.metrics.usage(input, output, u.cost_usd());
            }
            env.event(
                "attempt_finished",
                format!(
                    "{}{simulated}: {}{}",
                    state.as_str(),
                    s.failure
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_else(|| "ok".into()),
                    if confirmed {
                        ""
                    } else {
                        "; cleanup NOT confirmed"
                    }
                ),
            );
        }
        Ok(CleanupReport {
            cleanup_confirmed: confirmed,
            held_job,
            heartbeats: ctx.sent(),
            failure: (!confirmed).then(|| {
                Failure::infra(
                    Stage::Cleanup,
                    FailureCode::CleanupUnconfirmed,
                    unconfirmed_why.clone(),
                )
            }),
        })
    }
}
