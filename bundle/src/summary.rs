//! Assembling the batch-level files from the per-case records.
//!
//! Per-case files are the source of truth on disk (they stream in as each case finishes);
//! the batch files are a projection that `finalize` and `report` rebuild at any time.

use casebatch_proto::CaseState;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;

use casebatch_manifest::model::{CaseIdentity, Plan};
use casebatch_proto::Usage;
use serde::{Deserialize, Serialize};

use crate::records::CaseResult;
use crate::stats::{AttemptTally, BatchStats};
use crate::write::prepare_json_atomic;
use crate::{Bundle, BundleError, read_json_if_present, write_json_atomic};
use casebatch_attempt::{AttemptJournal, AttemptRecord, RECORD_SCHEMA_VERSION};

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
    /// Where the batch's results come from when some are not first runs of its cases:
    /// carried over from the batch it retries, or re-run after they had finished (absent when
    /// every result is a first run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<BatchLineage>,
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

/// Where a batch's results come from, when not all are first runs of its cases: what a
/// report of a retried or re-run batch says before its numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchLineage {
    /// The batch this one retries (`batch retry-failed`), as its `lineage.json` names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<String>,
    /// Cases whose result was carried over from `retry_of` as it was, not run here.
    #[serde(default)]
    pub carried: usize,
    /// Cases `retry-failed` chose to run again (failed, or never finished, in `retry_of`).
    #[serde(default)]
    pub rerun: usize,
    /// Of the carried cases, those whose trace was pulled again without running them.
    #[serde(default)]
    pub recollected: usize,
    /// Cases given a new attempt inside this batch after an earlier one had finished them
    /// (`batch rerun`, `resume --retry-failed`): their latest result replaced a finished one.
    #[serde(default)]
    pub rerun_in_place: usize,
}

impl BatchLineage {
    /// `None` when every result is a first run of its case.
    fn of(retry: Option<crate::Lineage>, rerun_in_place: usize) -> Option<Self> {
        if retry.is_none() && rerun_in_place == 0 {
            return None;
        }
        let retry = retry.as_ref();
        Some(Self {
            retry_of: retry.map(|l| l.retry_of.clone()),
            carried: retry.map_or(0, |l| l.carried.len()),
            rerun: retry.map_or(0, |l| l.rerun.len()),
            recollected: retry.map_or(0, |l| l.recollected.len()),
            rerun_in_place,
        })
    }
}

/// Whether a case's latest attempt ran after an earlier one had finished the case (closed it
/// with an outcome, no retry to follow, not cancelled): `batch rerun` or `resume
/// --retry-failed` gave it a new attempt. Attempts kept as evidence only never count.
pub fn reran_in_place<'a>(attempts: impl IntoIterator<Item = &'a AttemptRecord>) -> bool {
    let counted: Vec<&AttemptRecord> = attempts
        .into_iter()
        .filter(|a| !a.summary.is_evidence_only())
        .collect();
    let finished = |a: &&AttemptRecord| {
        let s = &a.summary;
        !a.will_retry
            && s.actor != Some(casebatch_proto::ActorStatus::Cancelled)
            && s.failure
                .as_ref()
                .is_none_or(|f| f.code != casebatch_proto::FailureCode::Cancelled)
    };
    counted
        .split_last()
        .is_some_and(|(_, earlier)| earlier.iter().any(finished))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SummaryRow {
    pub case_id: String,
    pub case_dir: String,
    pub state: CaseState,
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
    let mut scan = Scan::new(plan);
    let mut attempts = Vec::new();
    for case in &plan.cases {
        attempts.extend(scan.case(bundle, case)?);
    }
    let (results, summary) = scan.finish(bundle);
    Ok(Assembled {
        results,
        attempts,
        summary,
    })
}

/// Every case's records read once, in plan order, into what the batch files say. Each case's
/// attempts are handed back once counted: [`assemble`] keeps them, the batch files' write
/// streams them to disk.
struct Scan<'p, C> {
    plan: &'p Plan<C>,
    results: Vec<Option<CaseResult>>,
    rows: Vec<SummaryRow>,
    counts: BTreeMap<String, usize>,
    by_stage_class: BTreeMap<String, usize>,
    by_code: BTreeMap<String, usize>,
    by_runtime: BTreeMap<String, usize>,
    cleanup_unconfirmed: usize,
    collect_failed: usize,
    simulated: bool,
    attempts: AttemptTally,
    /// By case, in plan order: whether its latest result is a re-run (see [`reran_in_place`],
    /// or run again by `retry-failed`).
    reran: Vec<bool>,
    /// Cases re-run inside this batch.
    rerun_in_place: usize,
}

impl<'p, C: CaseIdentity> Scan<'p, C> {
    fn new(plan: &'p Plan<C>) -> Self {
        Self {
            plan,
            results: Vec::with_capacity(plan.cases.len()),
            rows: Vec::with_capacity(plan.cases.len()),
            counts: BTreeMap::new(),
            by_stage_class: BTreeMap::new(),
            by_code: BTreeMap::new(),
            by_runtime: BTreeMap::new(),
            cleanup_unconfirmed: 0,
            collect_failed: 0,
            simulated: false,
            attempts: AttemptTally::default(),
            reran: Vec::with_capacity(plan.cases.len()),
            rerun_in_place: 0,
        }
    }

    /// Reads `case`'s result and attempts, counts them, and returns the attempts.
    fn case(&mut self, bundle: &Bundle, case: &C) -> Result<Vec<AttemptRecord>, BundleError> {
        // Absent: the case has not finished an attempt yet. Damaged: an error, never "queued".
        let result: Option<CaseResult> =
            read_json_if_present(&bundle.case_result(case.case_dir()))?;
        let case_attempts = read_attempts(bundle, case.case_dir())?;
        case_attempts.iter().for_each(|a| self.attempts.add(a));
        let usage = usage_of(&case_attempts);
        let in_place = reran_in_place(&case_attempts);
        self.rerun_in_place += usize::from(in_place);
        let retried = result
            .as_ref()
            .and_then(|r| r.origin.as_ref())
            .is_some_and(|o| !o.carried);
        self.reran.push(in_place || retried);

        let state = result.as_ref().map_or(CaseState::Queued, |r| r.state);
        *self.counts.entry(state.as_str().to_string()).or_default() += 1;
        let row = match &result {
            Some(r) => self.finished_row(r, usage),
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
        self.rows.push(row);
        self.results.push(result);
        Ok(case_attempts)
    }

    /// The summary row of a case with a result, counted into the batch's breakdowns.
    fn finished_row(&mut self, r: &CaseResult, usage: Option<Usage>) -> SummaryRow {
        self.simulated |= r.simulated;
        self.cleanup_unconfirmed += usize::from(!r.cleanup_confirmed);
        self.collect_failed += usize::from(r.collect_failure.is_some());
        if let (CaseState::Failed, Some(f)) = (r.state, &r.failure) {
            let key = format!("{}/{}", f.stage.as_str(), f.class.as_str());
            *self.by_stage_class.entry(key).or_default() += 1;
            *self.by_code.entry(f.code.to_string()).or_default() += 1;
        }
        if let Some(runtime) = &r.runtime {
            *self.by_runtime.entry(runtime.clone()).or_default() += 1;
        }
        // As JSON only for the fields the manifest asks for.
        let fields = &self.plan.summary.fields;
        let json =
            (!fields.is_empty()).then(|| serde_json::to_value(r).expect("records serialize"));
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
            fields: fields
                .iter()
                .filter_map(|p| Some((p.clone(), lookup(json.as_ref()?, p))))
                .collect(),
            usage,
        }
    }

    /// The results in plan order, and the summary they and the counted attempts make.
    fn finish(self, bundle: &Bundle) -> (Vec<Option<CaseResult>>, BatchSummary) {
        let plan = self.plan;
        let mut tasks = crate::epochs::TaskStats::of(&plan.cases, &self.results);
        if let Some(tasks) = tasks.as_mut() {
            tasks.add_usage(&plan.cases, &self.rows);
            tasks.add_reruns(&plan.cases, &self.results, &self.reran);
        }
        // Unreadable, it is left out like an absent one: the per-case records are the truth,
        // and the report still says what they do.
        let retry = read_json_if_present::<crate::Lineage>(&bundle.lineage())
            .ok()
            .flatten();
        let total_usage = sum_usage(self.rows.iter().filter_map(|r| r.usage.as_ref()));
        let a = &self.attempts;
        let summary = BatchSummary {
            schema_version: RECORD_SCHEMA_VERSION.into(),
            batch_id: plan.batch_id.clone(),
            total: plan.cases.len(),
            counts: self.counts,
            failures_by_stage_class: self.by_stage_class,
            failures_by_code: self.by_code,
            cases_by_runtime: self.by_runtime,
            cleanup_unconfirmed: self.cleanup_unconfirmed,
            collect_failed: self.collect_failed,
            adopted_attempts: a.adopted,
            attempts_total: a.total,
            speculative_losers: a.speculative_losers,
            stranded_attempts: a.stranded,
            jobs_paid_twice: a.jobs_paid_twice,
            temporal_actions: previous_actions(bundle),
            simulated: self.simulated,
            usage: total_usage,
            lineage: BatchLineage::of(retry, self.rerun_in_place),
            stats: Some(BatchStats::of_tally(&self.results, self.attempts).with_tasks(tasks)),
            rows: self.rows,
        };
        (self.results, summary)
    }
}

/// Cases by state as their results show them (queued: no attempt finished yet), from one
/// small read per case: what `status` shows when no worker answers, without the attempts'
/// records that [`assemble`] reads too.
pub fn count_states<C: CaseIdentity>(
    bundle: &Bundle,
    plan: &Plan<C>,
) -> Result<BTreeMap<CaseState, usize>, BundleError> {
    #[derive(Deserialize)]
    struct StateOnly {
        state: CaseState,
    }
    let mut counts = BTreeMap::new();
    for case in &plan.cases {
        let result: Option<StateOnly> = read_json_if_present(&bundle.case_result(case.case_dir()))?;
        let state = result.map_or(CaseState::Queued, |r| r.state);
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
    write_streamed(bundle, plan, None)
}

/// [`write_batch_files`] at the batch's end, with the Temporal actions its workflow counted.
pub fn write_final_batch_files<C: CaseIdentity>(
    bundle: &Bundle,
    plan: &Plan<C>,
    actions: casebatch_proto::TemporalActions,
) -> Result<BatchSummary, BundleError> {
    write_streamed(bundle, plan, Some(actions))
}

/// The batch files from one read of every case, with the attempt records serialized as they
/// are read: a 100,000-case batch's attempts are about 160 MB of JSON, which the write never
/// holds. Files appear in the same order as [`write_assembled`]'s: results, attempts, summary.
fn write_streamed<C: CaseIdentity>(
    bundle: &Bundle,
    plan: &Plan<C>,
    actions: Option<casebatch_proto::TemporalActions>,
) -> Result<BatchSummary, BundleError> {
    let mut scan = Scan::new(plan);
    let streamed = ScannedAttempts {
        bundle,
        scan: RefCell::new(&mut scan),
        failed: RefCell::new(None),
    };
    let attempts = prepare_json_atomic(&bundle.attempts(), &attempts_file(plan, &streamed))?;
    if let Some(e) = streamed.failed.into_inner() {
        // The temp file goes with `attempts`.
        return Err(e);
    }
    let (results, mut summary) = scan.finish(bundle);
    if actions.is_some() {
        summary.temporal_actions = actions;
    }
    write_results(bundle, plan, &results)?;
    attempts.persist()?;
    write_summary(bundle, plan, &summary)?;
    Ok(summary)
}

/// `batch_attempts.json`'s list, read case by case while it is serialized. A case whose
/// records cannot be read ends the list, and its error is kept in `failed` for the caller.
struct ScannedAttempts<'s, 'p, C> {
    bundle: &'s Bundle,
    scan: RefCell<&'s mut Scan<'p, C>>,
    failed: RefCell<Option<BundleError>>,
}

impl<C: CaseIdentity> Serialize for ScannedAttempts<'_, '_, C> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut scan = self.scan.borrow_mut();
        let cases = &scan.plan.cases;
        let each = cases
            .iter()
            .map_while(|case| match scan.case(self.bundle, case) {
                Ok(attempts) => Some(attempts),
                Err(e) => {
                    *self.failed.borrow_mut() = Some(e);
                    None
                }
            });
        serializer.collect_seq(each.flatten())
    }
}

/// `batch_attempts.json`: the batch's attempt records, in case order.
#[derive(Serialize)]
struct AttemptsFile<'a, A: ?Sized> {
    schema_version: &'a str,
    batch_id: &'a str,
    attempts: &'a A,
}

fn attempts_file<'a, C, A: ?Sized>(plan: &'a Plan<C>, attempts: &'a A) -> AttemptsFile<'a, A> {
    AttemptsFile {
        schema_version: RECORD_SCHEMA_VERSION,
        batch_id: &plan.batch_id,
        attempts,
    }
}

/// [`write_batch_files`] for records already read.
pub fn write_assembled<C>(
    bundle: &Bundle,
    plan: &Plan<C>,
    a: &Assembled,
) -> Result<(), BundleError> {
    write_results(bundle, plan, &a.results)?;
    write_json_atomic(&bundle.attempts(), &attempts_file(plan, &a.attempts[..]))?;
    write_summary(bundle, plan, &a.summary)
}

/// `batch_results.json`: every case's latest result, serialized from where the records are (a
/// `json!` value would copy 100,000 of them into a JSON tree first).
fn write_results<C>(
    bundle: &Bundle,
    plan: &Plan<C>,
    results: &[Option<CaseResult>],
) -> Result<(), BundleError> {
    #[derive(Serialize)]
    struct ResultsFile<'a> {
        schema_version: &'a str,
        batch_id: &'a str,
        results: Vec<&'a CaseResult>,
    }
    write_json_atomic(
        &bundle.results(),
        &ResultsFile {
            schema_version: RECORD_SCHEMA_VERSION,
            batch_id: &plan.batch_id,
            results: results.iter().flatten().collect(),
        },
    )
}

/// `batch_summary.json`, and its CSVs when the manifest asks for them.
fn write_summary<C>(
    bundle: &Bundle,
    plan: &Plan<C>,
    summary: &BatchSummary,
) -> Result<(), BundleError> {
    write_json_atomic(&bundle.summary(), summary)?;
    if plan.summary.write_csv {
        write_csv(&bundle.summary_csv(), summary, &plan.summary.fields)?;
        if let Some(tasks) = summary.stats.as_ref().and_then(|s| s.tasks.as_ref()) {
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
        if let Some(record) = &AttemptJournal::read_strict(&dir)?.record {
            out.push(record.clone());
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
            (CaseState::Queued, 2),
            (CaseState::Succeeded, 2),
            (CaseState::Failed, 1),
        ];
        assert_eq!(counts, BTreeMap::from(expected));
        // A damaged result is an error naming it, never a case counted as queued.
        let damaged = result(2, "succ");
        let err = count_states(&bundle, &plan).unwrap_err().to_string();
        assert!(err.contains(&damaged.display().to_string()), "{err}");
    }

    /// A case's result and its attempts' records, as a finished case leaves them.
    fn finished_case(bundle: &Bundle, i: u32, attempts: u32) {
        let case_dir = format!("case-{i}");
        for n in 1..=attempts {
            let last = n == attempts;
            let record: AttemptRecord = serde_json::from_value(serde_json::json!({
                "schema_version": "casebatch_v1", "case_id": case_dir,
                "summary": {"attempt": n, "actor": "finished", "exit_code": 0,
                            "evaluation_configured": false, "verdict": null,
                            "failure": null, "cleanup_confirmed": true, "adopted": i == 1,
                            "started_at_ms": 1_000, "ended_at_ms": 1_000 + 10 * u64::from(i)},
                "cleanup_confirmed": true, "will_retry": !last, "runtime": "fake",
            }))
            .unwrap();
            let dir = bundle.attempt(&case_dir, n);
            std::fs::create_dir_all(&dir).unwrap();
            casebatch_attempt::journal::append(&dir, &[crate::Entry::Record(record)]).unwrap();
        }
        let result = serde_json::json!({
            "schema_version": "casebatch_v1", "case_id": case_dir, "case_dir": case_dir,
            "state": "succeeded", "attempts": attempts, "actor_status": "finished",
            "exit_code": 0, "evaluation_configured": false, "verdict": null,
            "cleanup_confirmed": true, "failure": null, "collect_failure": null,
            "adopted": false, "simulated": true,
        });
        write_json_atomic(&bundle.case_result(&case_dir), &result).unwrap();
    }

    #[test]
    fn the_streamed_batch_files_say_what_the_assembled_ones_do() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = Bundle::new(dir.path(), "b");
        let plan = crate::plan_file::tests::plan_of(4);
        // Case 3 is still queued.
        (0..3).for_each(|i| finished_case(&bundle, i, i + 1));
        let assembled = assemble(&bundle, &plan).unwrap();
        assert_eq!(assembled.attempts.len(), 6);
        assert_eq!(assembled.summary.adopted_attempts, 2);

        let written = write_batch_files(&bundle, &plan).unwrap();
        assert_eq!(written, assembled.summary);
        let on_disk = |path: &Path| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
        };
        let attempts = on_disk(&bundle.attempts());
        assert_eq!(
            attempts["attempts"],
            serde_json::to_value(&assembled.attempts).unwrap()
        );
        assert_eq!(attempts["batch_id"], "b");
        assert_eq!(
            on_disk(&bundle.summary()),
            serde_json::to_value(&assembled.summary).unwrap()
        );
        assert_eq!(
            on_disk(&bundle.results())["results"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
    }

    /// A damaged record stops the write with an error naming it, before any batch file is
    /// replaced, and the streamed file's temp file goes too.
    #[test]
    fn a_damaged_attempt_record_stops_the_streamed_write() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = Bundle::new(dir.path(), "b");
        let plan = crate::plan_file::tests::plan_of(3);
        (0..3).for_each(|i| finished_case(&bundle, i, 1));
        let before = write_batch_files(&bundle, &plan).unwrap();
        let journal = casebatch_attempt::journal::path(&bundle.attempt("case-1", 1));
        std::fs::write(&journal, "not a journal entry\n").unwrap();

        let err = write_batch_files(&bundle, &plan).unwrap_err().to_string();
        assert!(err.contains(&journal.display().to_string()), "{err}");
        let kept: BatchSummary =
            serde_json::from_slice(&std::fs::read(bundle.summary()).unwrap()).unwrap();
        assert_eq!(kept, before, "the summary written before stays");
        let attempts: serde_json::Value =
            serde_json::from_slice(&std::fs::read(bundle.attempts()).unwrap()).unwrap();
        assert_eq!(attempts["attempts"].as_array().unwrap().len(), 3);
        let temp: Vec<_> = std::fs::read_dir(bundle.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(temp.is_empty(), "{temp:?}");
    }

    /// Attempts of one case: (will_retry, actor, failure code, speculative loser).
    fn attempts_of(spec: &[(bool, &str, Option<&str>, bool)]) -> Vec<AttemptRecord> {
        spec.iter()
            .enumerate()
            .map(|(i, (will_retry, actor, code, loser))| {
                let failure = code.map(|c| {
                    serde_json::json!({"stage": "await", "class": "infra", "code": c,
                                       "message": "", "retryable": false})
                });
                serde_json::from_value(serde_json::json!({
                    "schema_version": "casebatch_v1", "case_id": "c",
                    "summary": {"attempt": i + 1, "actor": actor, "exit_code": 0,
                                "evaluation_configured": false, "verdict": null,
                                "failure": failure, "cleanup_confirmed": true,
                                "speculative_loser": loser},
                    "cleanup_confirmed": true, "will_retry": will_retry, "runtime": "fake",
                }))
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn a_case_reran_in_place_once_an_earlier_attempt_had_finished_it() {
        // Finished (failed), then `rerun --failed` gave it another attempt.
        let rerun = attempts_of(&[
            (false, "failed", None, false),
            (false, "finished", None, false),
        ]);
        assert!(reran_in_place(&rerun));
        // A retry inside the batch's own policy is one run, not a re-run.
        let retried = attempts_of(&[
            (true, "failed", Some("TIMEOUT"), false),
            (false, "finished", None, false),
        ]);
        assert!(!reran_in_place(&retried));
        // Killed by a supersede or a cancel, then run again: it had not finished.
        let killed = attempts_of(&[
            (false, "cancelled", None, false),
            (false, "finished", None, false),
        ]);
        assert!(!reran_in_place(&killed));
        let never_started = attempts_of(&[
            (false, "failed", Some("CANCELLED"), false),
            (false, "finished", None, false),
        ]);
        assert!(!reran_in_place(&never_started));
        // A speculation's loser is evidence, not an outcome.
        let raced = attempts_of(&[
            (false, "cancelled", None, true),
            (false, "finished", None, false),
        ]);
        assert!(!reran_in_place(&raced));
        assert!(!reran_in_place(&attempts_of(&[(
            false, "finished", None, false
        )])));
        assert!(!reran_in_place(&[] as &[AttemptRecord]));
    }

    #[test]
    fn a_retry_batch_s_summary_names_its_source_and_what_it_carried() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = Bundle::new(dir.path(), "b");
        let plan = crate::plan_file::tests::plan_of(3);
        (0..3).for_each(|i| finished_case(&bundle, i, 1));
        assert_eq!(assemble(&bundle, &plan).unwrap().summary.lineage, None);
        let lineage = serde_json::json!({
            "schema_version": "casebatch_v1", "retry_of": "a", "class_filter": [],
            "rerun": ["case-1", "case-2"], "carried": ["case-0"], "memory_boost_mb": {},
            "recollected": [],
        });
        write_json_atomic(&bundle.lineage(), &lineage).unwrap();
        let summary = assemble(&bundle, &plan).unwrap().summary;
        let expected = BatchLineage {
            retry_of: Some("a".into()),
            carried: 1,
            rerun: 2,
            recollected: 0,
            rerun_in_place: 0,
        };
        assert_eq!(summary.lineage, Some(expected));
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
