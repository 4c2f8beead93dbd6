//! Assembling the batch-level files from the per-case records.
//!
//! Per-case files are the source of truth on disk (they stream in as each case finishes);
//! the batch files are a projection that `finalize` and `report` rebuild at any time.

use std::collections::BTreeMap;
use std::path::Path;

use casebatch_manifest::model::{CaseIdentity, Plan};
use casebatch_proto::Usage;
use serde::{Deserialize, Serialize};

use crate::journal::AttemptJournal;
use crate::records::{AttemptRecord, CaseRecordState, CaseResult, RECORD_SCHEMA_VERSION};
use crate::{Bundle, BundleError, read_json_if_present, write_json_atomic};

/// `batch_summary.json`: counts, failure breakdown, one row per case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchSummary {
    pub schema_version: String,
    pub batch_id: String,
    pub total: usize,
    pub counts: BTreeMap<String, usize>,
    /// Failed cases by `stage/class` of their deciding failure.
    pub failures_by_stage_class: BTreeMap<String, usize>,
    pub failures_by_code: BTreeMap<String, usize>,
    /// Cases by the runtime that ran their latest attempt (provenance; queued cases ran nowhere).
    #[serde(default)]
    pub cases_by_runtime: BTreeMap<String, usize>,
    pub cleanup_unconfirmed: usize,
    pub collect_failed: usize,
    pub adopted_attempts: usize,
    pub attempts_total: usize,
    /// Attempts that lost a tail-speculation race (stopped, kept as evidence; included in
    /// `attempts_total`).
    #[serde(default)]
    pub speculative_losers: usize,
    /// Attempts left stranded on a runtime that stopped answering while their case moved on
    /// (cleaned up once it answered; kept as evidence; included in `attempts_total`).
    #[serde(default)]
    pub stranded_attempts: usize,
    /// Jobs paid for twice: attempts kept as evidence (speculations' losers, stranded ones)
    /// whose runtime held a job for them. With one job per case, job starts are
    /// `total + jobs_paid_twice`.
    #[serde(default)]
    pub jobs_paid_twice: usize,
    /// The Temporal actions the batch cost, as its workflow counted them when it ended
    /// (absent before that, and in bundles older than the count). `report` keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporal_actions: Option<casebatch_proto::TemporalActions>,
    pub simulated: bool,
    /// What every attempt of the batch reported it consumed (its harness's `usage`), summed;
    /// absent when none reported any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Pass rates, score means with standard errors, duration percentiles (absent in
    /// summaries written before they existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<crate::stats::BatchStats>,
    pub rows: Vec<SummaryRow>,
}

impl BatchSummary {
    /// How many cases are in this state (`"succeeded"`, `"failed"`, ...).
    pub fn count(&self, state: &str) -> usize {
        self.counts.get(state).copied().unwrap_or(0)
    }

    pub fn succeeded(&self) -> usize {
        self.count("succeeded")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SummaryRow {
    pub case_id: String,
    pub case_dir: String,
    pub state: CaseRecordState,
    pub attempts: u32,
    pub actor_status: Option<String>,
    pub verdict: Option<String>,
    pub cleanup_confirmed: Option<bool>,
    pub failure_stage: Option<String>,
    pub failure_class: Option<String>,
    pub failure_code: Option<String>,
    /// What the failure says: the path a bundle write was refused at, for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// The runtime that ran the latest attempt (provenance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Values of `summary.fields`, by dotted path.
    pub fields: BTreeMap<String, serde_json::Value>,
    /// What the case's attempts reported they consumed, summed (absent: none reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Everything read back from a bundle.
pub struct Assembled {
    pub results: Vec<Option<CaseResult>>,
    pub attempts: Vec<AttemptRecord>,
    pub summary: BatchSummary,
}

/// Reads every case's records and builds the batch-level view.
pub fn assemble<C: CaseIdentity>(
    bundle: &Bundle,
    plan: &Plan<C>,
) -> Result<Assembled, BundleError> {
    let mut results = Vec::with_capacity(plan.cases.len());
    let mut attempts = Vec::new();
    let mut rows = Vec::with_capacity(plan.cases.len());
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_stage_class = BTreeMap::new();
    let mut by_code = BTreeMap::new();
    let mut by_runtime = BTreeMap::new();
    let (mut cleanup_unconfirmed, mut collect_failed, mut adopted) = (0, 0, 0);
    let mut simulated = false;

    for case in &plan.cases {
        // Absent: the case has not finished an attempt yet. Damaged: an error, never "queued".
        let result: Option<CaseResult> =
            read_json_if_present(&bundle.case_result(case.case_dir()))?;
        let case_attempts = read_attempts(bundle, case.case_dir())?;
        adopted += case_attempts.iter().filter(|a| a.summary.adopted).count();
        let usage = usage_of(&case_attempts);
        attempts.extend(case_attempts);

        let state = result.as_ref().map_or(CaseRecordState::Queued, |r| r.state);
        *counts.entry(state.as_str().to_string()).or_default() += 1;
        let row = match &result {
            Some(r) => {
                simulated |= r.simulated;
                if !r.cleanup_confirmed {
                    cleanup_unconfirmed += 1;
                }
                if r.collect_failure.is_some() {
                    collect_failed += 1;
                }
                if let (CaseRecordState::Failed, Some(f)) = (r.state, &r.failure) {
                    let key = format!("{}/{}", f.stage.as_str(), f.class.as_str());
                    *by_stage_class.entry(key).or_default() += 1;
                    *by_code.entry(f.code.to_string()).or_default() += 1;
                }
                if let Some(runtime) = &r.runtime {
                    *by_runtime.entry(runtime.clone()).or_default() += 1;
                }
                // As JSON only for the fields the manifest asks for.
                let json = (!plan.summary.fields.is_empty())
                    .then(|| serde_json::to_value(r).expect("records serialize"));
                SummaryRow {
                    case_id: r.case_id.clone(),
                    case_dir: r.case_dir.clone(),
                    state: r.state,
                    attempts: r.attempts,
                    actor_status: r.actor_status.map(|a| enum_name(&a)),
                    verdict: r.verdict.map(|v| enum_name(&v)),
                    cleanup_confirmed: Some(r.cleanup_confirmed),
                    failure_stage: r.failure.as_ref().map(|f| f.stage.as_str().into()),
                    failure_class: r.failure.as_ref().map(|f| f.class.as_str().into()),
                    failure_code: r.failure.as_ref().map(|f| f.code.to_string()),
                    failure_message: r.failure.as_ref().map(|f| f.message.clone()),
                    runtime: r.runtime.clone(),
                    fields: plan
                        .summary
                        .fields
                        .iter()
                        .filter_map(|p| Some((p.clone(), lookup(json.as_ref()?, p))))
                        .collect(),
                    usage,
                }
            }
            None => SummaryRow {
                case_id: case.case_id().to_owned(),
                case_dir: case.case_dir().to_owned(),
                state,
                attempts: 0,
                actor_status: None,
                verdict: None,
                cleanup_confirmed: None,
                failure_stage: None,
                failure_class: None,
                failure_code: None,
                failure_message: None,
                runtime: None,
                fields: BTreeMap::new(),
                usage,
            },
        };
        rows.push(row);
        results.push(result);
    }

    let mut tasks = crate::epochs::TaskStats::of(&plan.cases, &results);
    if let Some(tasks) = tasks.as_mut() {
        tasks.add_usage(&plan.cases, &rows);
    }
    let total_usage = sum_usage(rows.iter().filter_map(|r| r.usage.as_ref()));
    let summary = BatchSummary {
        schema_version: RECORD_SCHEMA_VERSION.into(),
        batch_id: plan.batch_id.clone(),
        total: plan.cases.len(),
        counts,
        failures_by_stage_class: by_stage_class,
        failures_by_code: by_code,
        cases_by_runtime: by_runtime,
        cleanup_unconfirmed,
        collect_failed,
        adopted_attempts: adopted,
        attempts_total: attempts.len(),
        speculative_losers: attempts
            .iter()
            .filter(|a| a.summary.speculative_loser)
            .count(),
        stranded_attempts: attempts.iter().filter(|a| a.summary.stranded).count(),
        jobs_paid_twice: attempts
            .iter()
            .filter(|a| a.summary.is_evidence_only() && a.held_job == Some(true))
            .count(),
        temporal_actions: previous_actions(bundle),
        simulated,
        usage: total_usage,
        stats: Some(crate::stats::BatchStats {
            tasks: tasks.map(Box::new),
            ..crate::stats::BatchStats::of(&results, &attempts)
        }),
        rows,
    };
    Ok(Assembled {
        results,
        attempts,
        summary,
    })
}

/// Cases by state as their results show them (queued: no attempt finished yet), from one
/// small read per case: what `status` shows when no worker answers, without the attempts'
/// records that [`assemble`] reads too.
pub fn count_states<C: CaseIdentity>(
    bundle: &Bundle,
    plan: &Plan<C>,
) -> Result<BTreeMap<CaseRecordState, usize>, BundleError> {
    #[derive(Deserialize)]
    struct StateOnly {
        state: CaseRecordState,
    }
    let mut counts = BTreeMap::new();
    for case in &plan.cases {
        let result: Option<StateOnly> = read_json_if_present(&bundle.case_result(case.case_dir()))?;
        let state = result.map_or(CaseRecordState::Queued, |r| r.state);
        *counts.entry(state).or_default() += 1;
    }
    Ok(counts)
}

/// The actions count of the summary written before, which only the workflow can know.
fn previous_actions(bundle: &Bundle) -> Option<casebatch_proto::TemporalActions> {
    #[derive(Deserialize)]
    struct ActionsOnly {
        temporal_actions: Option<casebatch_proto::TemporalActions>,
    }
    // Unreadable or absent: the rebuilt summary simply has no count.
    read_json_if_present::<ActionsOnly>(&bundle.summary())
        .ok()
        .flatten()
        .and_then(|s| s.temporal_actions)
}

/// Writes `batch_results.json`, `batch_attempts.json`, `batch_summary.json` (and the CSV when
/// the manifest asks for it).
pub fn write_batch_files<C: CaseIdentity>(
    bundle: &Bundle,
    plan: &Plan<C>,
) -> Result<BatchSummary, BundleError> {
    let a = assemble(bundle, plan)?;
    write_assembled(bundle, plan, &a)?;
    Ok(a.summary)
}

/// [`write_batch_files`] at the batch's end, with the Temporal actions its workflow counted.
pub fn write_final_batch_files<C: CaseIdentity>(
    bundle: &Bundle,
    plan: &Plan<C>,
    actions: casebatch_proto::TemporalActions,
) -> Result<BatchSummary, BundleError> {
    let mut a = assemble(bundle, plan)?;
    a.summary.temporal_actions = Some(actions);
    write_assembled(bundle, plan, &a)?;
    Ok(a.summary)
}

/// [`write_batch_files`] for records already read.
pub fn write_assembled<C>(
    bundle: &Bundle,
    plan: &Plan<C>,
    a: &Assembled,
) -> Result<(), BundleError> {
    // Serialized from where the records are: a `json!` value would copy 100,000 of them into
    // a JSON tree first.
    #[derive(Serialize)]
    struct ResultsFile<'a> {
        schema_version: &'a str,
        batch_id: &'a str,
        results: Vec<&'a CaseResult>,
    }
    #[derive(Serialize)]
    struct AttemptsFile<'a> {
        schema_version: &'a str,
        batch_id: &'a str,
        attempts: &'a [AttemptRecord],
    }
    write_json_atomic(
        &bundle.results(),
        &ResultsFile {
            schema_version: RECORD_SCHEMA_VERSION,
            batch_id: &plan.batch_id,
            results: a.results.iter().flatten().collect(),
        },
    )?;
    write_json_atomic(
        &bundle.attempts(),
        &AttemptsFile {
            schema_version: RECORD_SCHEMA_VERSION,
            batch_id: &plan.batch_id,
            attempts: &a.attempts,
        },
    )?;
    write_json_atomic(&bundle.summary(), &a.summary)?;
    if plan.summary.write_csv {
        write_csv(&bundle.summary_csv(), &a.summary, &plan.summary.fields)?;
        if let Some(tasks) = a.summary.stats.as_ref().and_then(|s| s.tasks.as_ref()) {
            write_file(&bundle.tasks_csv(), tasks_csv(tasks))?;
        }
    }
    Ok(())
}

/// The usage a case's attempts reported, summed (`None`: none reported any).
fn usage_of(attempts: &[AttemptRecord]) -> Option<Usage> {
    sum_usage(attempts.iter().filter_map(|a| a.summary.usage.as_ref()))
}

/// `reported`, summed name by name (`None`: nothing was reported).
pub fn sum_usage<'a>(reported: impl Iterator<Item = &'a Usage>) -> Option<Usage> {
    reported.fold(None, |sum, u| {
        let mut sum = sum.unwrap_or_default();
        sum.add(u);
        Some(sum)
    })
}

/// What a case's recorded attempts spent: how a run that has no engine result to carry
/// (a terminated one) still counts what the batch spent against its budget.
pub fn case_usage(bundle: &Bundle, case_dir: &str) -> Result<Option<Usage>, BundleError> {
    Ok(usage_of(&read_attempts(bundle, case_dir)?))
}

fn read_attempts(bundle: &Bundle, case_dir: &str) -> Result<Vec<AttemptRecord>, BundleError> {
    let mut out = Vec::new();
    for n in 1.. {
        let dir = bundle.attempt(case_dir, n);
        // Attempts are numbered from 1 without gaps: the first one not there ends the list.
        // Anything else in the way (a file where the case's or the attempt's directory
        // belongs) is damage, which would otherwise hide attempts from the counts.
        let read_err = |source| BundleError::Read {
            path: dir.display().to_string(),
            source,
        };
        match std::fs::metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(read_err(e)),
            Ok(m) if !m.is_dir() => {
                return Err(read_err(std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "not a directory, where the attempt's files belong",
                )));
            }
            Ok(_) => {}
        }
        // Absent while the attempt runs: its record is written when it is cleaned up.
        if let Some(record) = AttemptJournal::read_strict(&dir)?.record {
            out.push(record);
        }
    }
    Ok(out)
}

fn enum_name<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}

/// Resolves a dotted path (`scores.accuracy`) in a JSON value; `null` when absent.
fn lookup(v: &serde_json::Value, path: &str) -> serde_json::Value {
    let mut cur = v;
    for part in path.split('.') {
        match cur.get(part) {
            Some(next) => cur = next,
            None => return serde_json::Value::Null,
        }
    }
    cur.clone()
}

fn write_csv(path: &Path, s: &BatchSummary, fields: &[String]) -> Result<(), BundleError> {
    let mut out = String::from(
        "case_id,state,attempts,actor_status,verdict,cleanup_confirmed,failure_stage,failure_class,failure_code,runtime",
    );
    for f in fields {
        out.push(',');
        out.push_str(&csv_cell(f));
    }
    out.push('\n');
    for r in &s.rows {
        let cells = [
            r.case_id.clone(),
            r.state.as_str().to_string(),
            r.attempts.to_string(),
            r.actor_status.clone().unwrap_or_default(),
            r.verdict.clone().unwrap_or_default(),
            r.cleanup_confirmed
                .map(|b| b.to_string())
                .unwrap_or_default(),
            r.failure_stage.clone().unwrap_or_default(),
            r.failure_class.clone().unwrap_or_default(),
            r.failure_code.clone().unwrap_or_default(),
            r.runtime.clone().unwrap_or_default(),
        ];
        let mut line: Vec<String> = cells.iter().map(|c| csv_cell(c)).collect();
        for f in fields {
            let v = r.fields.get(f).cloned().unwrap_or_default();
            let text = match v {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            line.push(csv_cell(&text));
        }
        out.push_str(&line.join(","));
        out.push('\n');
    }
    write_file(path, out)
}

/// `task_id,epochs,finished,passed,pass@1,…,pass@K`: empty where a task has fewer finished
/// runs than k.
fn tasks_csv(t: &crate::epochs::TaskStats) -> String {
    let most = t.pass_at_k.len();
    let mut out = String::from("task_id,epochs,finished,passed");
    for k in 1..=most {
        out.push_str(&format!(",pass@{k}"));
    }
    out.push('\n');
    for row in &t.rows {
        out.push_str(&format!(
            "{},{},{},{}",
            csv_cell(&row.task_id),
            row.epochs,
            row.finished,
            row.passed
        ));
        for k in 0..most {
            out.push(',');
            if let Some(x) = row.pass_at_k.get(k) {
                out.push_str(&format!("{x:.6}"));
            }
        }
        out.push('\n');
    }
    out
}

fn write_file(path: &Path, text: String) -> Result<(), BundleError> {
    std::fs::write(path, text).map_err(|source| BundleError::Write {
        path: path.display().to_string(),
        source,
    })
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_counted_from_the_results_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = Bundle::new(dir.path(), "b");
        let plan = crate::plan_file::tests::plan_of(5);
        let result = |i: u32, state: &str| {
            let path = bundle.case_result(&format!("case-{i}"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(
                &path,
                format!(r#"{{"case_id": "case-{i}", "state": "{state}"}}"#),
            )
            .unwrap();
            path
        };
        result(0, "succeeded");
        result(1, "failed");
        result(3, "succeeded");
        let counts = count_states(&bundle, &plan).unwrap();
        let expected = [
            (CaseRecordState::Queued, 2),
            (CaseRecordState::Succeeded, 2),
            (CaseRecordState::Failed, 1),
        ];
        assert_eq!(counts, BTreeMap::from(expected));
        // A damaged result is an error naming it, never a case counted as queued.
        let damaged = result(2, "succ");
        let err = count_states(&bundle, &plan).unwrap_err().to_string();
        assert!(err.contains(&damaged.display().to_string()), "{err}");
    }

    #[test]
    fn dotted_lookup_and_csv_quoting() {
        let v = serde_json::json!({"scores": {"acc": 0.5}});
        assert_eq!(lookup(&v, "scores.acc"), serde_json::json!(0.5));
        assert_eq!(lookup(&v, "scores.missing"), serde_json::Value::Null);
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
