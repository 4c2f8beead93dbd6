//! Environments provisioned ahead of their slot (`prepare_ahead`): `prepare` provisions an
//! attempt while other cases run, `release` cleans up one that will not start in this run.

use std::sync::Arc;
use std::time::Instant;

use casebatch_bundle::ReleasedRecord;
use casebatch_bundle::{Entry, PreparedRecord, RECORD_SCHEMA_VERSION, now_ms, write_json_atomic};
use casebatch_proto::{AttemptKey, CleanupReport, Prepared, ReleaseInput, Stage, StageResult};
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tracing::Instrument;

use super::context::{CaseActivities, attempt_span, heartbeating};
use crate::beats::StageContext;

impl CaseActivities {
    pub(crate) async fn prepare_ahead(
        self: Arc<Self>,
        ctx: ActivityContext,
        key: AttemptKey,
    ) -> Result<Prepared, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let began = Instant::now();
        let env = self.env(&key)?;
        let span = attempt_span(&env);
        async move {
            let host_queue = self.runtimes.executor(&env).host_queue();
            let mut timings = ctx.timings();
            let provisioned = timings.time(Stage::Provision, self.provision_stage(&ctx, &env));
            let provisioned = heartbeating(&ctx, (), provisioned).await?;
            timings.append_to(&env);
            let failure = match provisioned {
                StageResult::Ok => {
                    let record = PreparedRecord {
                        schema_version: RECORD_SCHEMA_VERSION.into(),
                        marker: env.marker(),
                        prepared_at_ms: now_ms(),
                    };
                    env.record(&[Entry::Prepared(Some(record))])?;
                    None
                }
                StageResult::Failed(f) => Some(f),
            };
            tracing::info!(failure = ?failure, "provisioned ahead");
            self.metrics.stage("prepare", began.elapsed());
            Ok(Prepared {
                host_queue,
                failure,
            })
        }
        .instrument(span)
        .await
    }

    pub(crate) async fn release_unused(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: ReleaseInput,
    ) -> Result<CleanupReport, ActivityError> {
        let ctx = StageContext::new(ctx, &self.metrics);
        let env = self.env(&input.key)?;
        let span = attempt_span(&env);
        async move {
            // Released already (this is a retry): nothing of it is left.
            if !env.dir.exists() {
                return Ok(CleanupReport {
                    cleanup_confirmed: true,
                    failure: None,
                    held_job: false,
                    heartbeats: ctx.sent(),
                });
            }
            let receipt = heartbeating(&ctx, (), async {
                self.runtimes.executor(&env).cleanup(&env).await
            })
            .await;
            let confirmed = receipt.cleanup_confirmed;
            let at_ms = now_ms();
            let method = receipt.method.clone().unwrap_or_default();
            let record = ReleasedRecord {
                schema_version: RECORD_SCHEMA_VERSION.into(),
                case_id: env.case.case_id.clone(),
                attempt: env.key.attempt,
                why: input.why.clone(),
                released_at_ms: at_ms,
                receipt,
            };
            let path = env
                .bundle
                .released(&env.case.case_dir, env.key.attempt, at_ms);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            write_json_atomic(&path, &record)?;
            if confirmed {
                std::fs::remove_dir_all(&env.dir)?;
            } else {
                // Kept as evidence; the attempt provisions afresh when it runs.
                let _ = env.record(&[Entry::Prepared(None)]);
            }
            tracing::info!(why = %input.why, cleanup_confirmed = confirmed, "released unused");
            self.metrics.released(env.case.runtime.as_str());
            env.event(
                "prepared_released",
                format!(
                    "environment provisioned ahead, released unused ({}): cleanup {} ({method})",
                    input.why,
                    if confirmed {
                        "confirmed"
                    } else {
                        "NOT confirmed"
                    }
                ),
            );
            Ok(CleanupReport {
                cleanup_confirmed: confirmed,
                failure: None,
                held_job: false,
                heartbeats: ctx.sent(),
            })
        }
        .instrument(span)
        .await
    }
}
