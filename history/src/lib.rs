//! casebatch-history owns the run-history index: a SQLite file (by default
//! `<output-dir>/.casebatch-history.sqlite`) with one row per finished attempt of every
//! finished batch bundle under an output directory: which harness ran, on which runtime, for
//! how long, and how it ended.
//!
//! It is an index, never the source of truth: [`HistoryIndex::refresh`] (re)reads the
//! bundles' `batch_attempts.json` and `batch_plan.json`, and a file of another schema
//! version, or no database at all, is simply emptied and rebuilt. It serves per-harness,
//! per-runtime medians ([`HistoryIndex::medians`]), relative weights for splitting a batch
//! over a list of runtimes ([`HistoryIndex::weights`]), and a median attempt duration to seed
//! tail speculation ([`HistoryIndex::harness_median_ms`]).
//!
//! Knows nothing of Temporal: outcomes are derived here from the attempt records, with the
//! same rule as the workflow's.

mod schema;
mod weights;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use casebatch_bundle::{AttemptRecord, Bundle};
use casebatch_manifest::model::{CommandSpec, Plan};
use casebatch_proto::{ActorStatus, AttemptSummary, Verdict};
use rusqlite::{Connection, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use schema::COUNTED;

/// The index file of one output directory, kept next to the bundles it indexes (hidden, so it
/// is never taken for a bundle: batch ids cannot start with '.').
const DEFAULT_FILE: &str = ".casebatch-history.sqlite";

/// The run-history index, open on its SQLite file.
pub struct HistoryIndex {
    conn: Connection,
    path: PathBuf,
}

/// What went wrong with the index or the output directory; each names the path and what to
/// do. A bundle that cannot be read is not an error: [`Refreshed::skipped`] lists it.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(
        "cannot create the directory {path} for the history index: {source}; check that it is writable"
    )]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot use the history index {path}: {source}; it is only an index of the bundles: delete it and it is rebuilt"
    )]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "cannot list the output directory {path}: {source}; check the path and its permissions"
    )]
    OutputDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a refresh did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Refreshed {
    /// Bundles (re)indexed: new, or their `batch_attempts.json` changed.
    pub indexed: u32,
    /// Bundles already indexed as they are.
    pub unchanged: u32,
    /// Directories left out, as `"path: why"`: not bundles, or files that cannot be read.
    pub skipped: Vec<String>,
    /// Bundles dropped from the index: gone, unfinished again, or no longer readable.
    pub forgotten: u32,
    /// Attempt rows written.
    pub attempts: u64,
}

/// The durations of one harness on one runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MedianRow {
    /// [`harness_identity`] of the harness command.
    pub harness: String,
    /// The most recent `HARNESS_VERSION` among the counted attempts (by when their bundle's
    /// `batch_attempts.json` was written), or `None` when none set one.
    pub harness_version: Option<String>,
    pub runtime: String,
    /// Attempts counted: they ran to the end, lost no speculation race, and have a duration.
    pub attempts: u64,
    pub median_ms: u64,
    /// Of the counted attempts, those that succeeded.
    pub succeeded: u64,
}

/// How to split a batch's cases over a list of runtimes: relative speeds, 100 = average.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Weights {
    /// Each runtime once, in the order first given, with its weight (1..=10 000).
    pub by_runtime: Vec<(String, u32)>,
    /// Batches whose history the weights come from.
    pub batches_used: u32,
    /// False when no batch ran on two of the runtimes: every weight is then 100.
    pub from_history: bool,
}

/// Names a harness by its command, so that history follows the command and not the case
/// that ran it: the first 16 hex digits of the SHA-256 of the command's JSON, or `"none"`.
pub fn harness_identity(cmd: Option<&CommandSpec>) -> String {
    match cmd {
        None => "none".into(),
        Some(cmd) => {
            let json = serde_json::to_string(cmd).expect("a command serializes");
            let mut hex = hex::encode(Sha256::digest(json.as_bytes()));
            hex.truncate(16);
            hex
        }
    }
}

impl HistoryIndex {
    /// `<output_dir>/.casebatch-history.sqlite`: one index per output directory, next to the
    /// bundles it is made from.
    pub fn default_path(output_dir: &Path) -> PathBuf {
        output_dir.join(DEFAULT_FILE)
    }

    /// Opens the index at `path`, creating it (and its directory) when missing. A file of
    /// another schema version is emptied, to be rebuilt by the next refresh.
    pub fn open(path: &Path) -> Result<Self, HistoryError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| HistoryError::CreateDir {
                path: parent.display().to_string(),
                source,
            })?;
        }
        let conn = schema::open(path).map_err(|source| HistoryError::Sqlite {
            path: path.display().to_string(),
            source,
        })?;
        Ok(Self {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Indexes every finished bundle directly under `output_dir` that is new or whose
    /// `batch_attempts.json` changed (mtime ns or size), and forgets bundles under
    /// `output_dir` that are gone. Cheap when nothing changed: one stat per bundle.
    pub fn refresh(&mut self, output_dir: &Path) -> Result<Refreshed, HistoryError> {
        let output_dir = resolve(output_dir);
        let entries = match std::fs::read_dir(&output_dir) {
            Ok(entries) => entries
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| output_dir_error(&output_dir, source))?,
            // Nothing ran there yet: nothing to index, and whatever was is gone.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(output_dir_error(&output_dir, source)),
        };
        let known = self.known_bundles().map_err(|e| self.sql(e))?;

        let mut done = Refreshed::default();
        let mut seen = HashSet::new();
        let mut names: Vec<_> = entries.iter().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            // The index itself, the dev server's state, editors' files: never bundles.
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let dir = output_dir.join(&name);
            if !dir.is_dir() {
                continue;
            }
            let batch_id = name.to_string_lossy().into_owned();
            let bundle = Bundle::at(&dir);
            let attempts_file = bundle.attempts();
            let stamp = match std::fs::metadata(&attempts_file) {
                Ok(meta) => Stamp::of(&meta),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Still running (or never finished): nothing to index yet, silently.
                    if !bundle.plan().exists() {
                        let why = "not a batch bundle (no batch_plan.json)";
                        done.skipped.push(format!("{}: {why}", dir.display()));
                    }
                    continue;
                }
                Err(e) => {
                    done.skipped
                        .push(format!("{}: {e}", attempts_file.display()));
                    continue;
                }
            };
            let path = dir.display().to_string();
            if known.get(&batch_id) == Some(&(path.clone(), stamp)) {
                seen.insert(batch_id);
                done.unchanged += 1;
                continue;
            }
            // Read after the stat: a file rewritten meanwhile has a newer stamp than the one
            // stored, so the next refresh reads it again.
            let rows = match read_bundle(&bundle) {
                Ok(rows) => rows,
                Err(why) => {
                    done.skipped.push(why);
                    continue;
                }
            };
            self.index_bundle(&batch_id, &path, stamp, &rows)
                .map_err(|e| self.sql(e))?;
            seen.insert(batch_id);
            done.indexed += 1;
            done.attempts += rows.len() as u64;
        }

        for (batch_id, (path, _)) in &known {
            if !seen.contains(batch_id) && Path::new(path).parent() == Some(output_dir.as_path()) {
                self.forget(batch_id).map_err(|e| self.sql(e))?;
                done.forgotten += 1;
            }
        }
        Ok(done)
    }

    /// Forgets everything, then refreshes: for when the index is suspected stale (a bundle
    /// restored with its old mtime and size), or after a change of the outcome rules.
    pub fn rebuild(&mut self, output_dir: &Path) -> Result<Refreshed, HistoryError> {
        schema::clear(&mut self.conn).map_err(|e| self.sql(e))?;
        self.refresh(output_dir)
    }

    /// Per (harness, runtime): attempts counted, their median duration, and how many
    /// succeeded, counting only attempts that ran to the end (actor finished), are not
    /// speculative losers, and have a duration: the others say nothing of how long the
    /// harness takes. Sorted by harness, then runtime.
    pub fn medians(&self) -> Result<Vec<MedianRow>, HistoryError> {
        self.medians_inner().map_err(|e| self.sql(e))
    }

    /// Relative per-runtime weights for splitting cases over `runtimes`, learned from batches
    /// that ran (counted attempts, as in [`Self::medians`]) on at least two of them. Each
    /// such batch's per-runtime medians are divided by their mean, so that the workload and
    /// harness version of the batch cancel out and only the runtimes' relative speeds remain;
    /// a runtime's weight is `round(100 / mean relative duration)`, clamped to 1..=10 000. A
    /// runtime without such history weighs the (rounded) average of the others; without any
    /// history every runtime weighs 100. Names given twice are weighed once.
    pub fn weights(&self, runtimes: &[String]) -> Result<Weights, HistoryError> {
        self.weights_inner(runtimes).map_err(|e| self.sql(e))
    }

    /// The median duration of this harness's counted attempts (any runtime, the same filter
    /// as [`Self::medians`]), to seed tail speculation before a batch has its own; `None`
    /// without any.
    pub fn harness_median_ms(&self, harness: &str) -> Result<Option<u64>, HistoryError> {
        self.harness_median_inner(harness).map_err(|e| self.sql(e))
    }

    fn sql(&self, source: rusqlite::Error) -> HistoryError {
        HistoryError::Sqlite {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Indexed bundles: batch id → (path, stamp of `batch_attempts.json`).
    fn known_bundles(&self) -> rusqlite::Result<HashMap<String, (String, Stamp)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT batch_id, path, attempts_mtime_ns, attempts_size FROM bundles")?;
        stmt.query_map([], |r| {
            let stamp = Stamp {
                mtime_ns: r.get(2)?,
                size: r.get(3)?,
            };
            Ok((r.get(0)?, (r.get(1)?, stamp)))
        })?
        .collect()
    }

    /// Replaces a bundle's rows, all in one transaction: readers see it before or after.
    fn index_bundle(
        &mut self,
        batch_id: &str,
        path: &str,
        stamp: Stamp,
        rows: &[Row],
    ) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM attempts WHERE batch_id = ?1", [batch_id])?;
        {
            // OR REPLACE: a record listed twice is one attempt, the later listing wins.
            let mut insert = tx.prepare(
                "INSERT OR REPLACE INTO attempts (batch_id, case_id, attempt, harness,
                     harness_version, runtime, duration_ms, outcome, ran_to_end,
                     speculative_loser)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?;
            for row in rows {
                insert.execute(params![
                    batch_id,
                    row.case_id,
                    row.attempt,
                    row.harness,
                    row.harness_version,
                    row.runtime,
                    row.duration_ms,
                    row.outcome,
                    row.ran_to_end,
                    row.speculative_loser,
                ])?;
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO bundles (batch_id, path, attempts_mtime_ns, attempts_size)
             VALUES (?1, ?2, ?3, ?4)",
            params![batch_id, path, stamp.mtime_ns, stamp.size],
        )?;
        tx.commit()
    }

    fn forget(&mut self, batch_id: &str) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM attempts WHERE batch_id = ?1", [batch_id])?;
        tx.execute("DELETE FROM bundles WHERE batch_id = ?1", [batch_id])?;
        tx.commit()
    }

    fn medians_inner(&self) -> rusqlite::Result<Vec<MedianRow>> {
        // Most recent last, so the last version seen per group wins.
        let mut versions: HashMap<(String, String), String> = HashMap::new();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT a.harness, a.runtime, a.harness_version
             FROM attempts a JOIN bundles b ON a.batch_id = b.batch_id
             WHERE {COUNTED} AND a.harness_version IS NOT NULL
             ORDER BY b.attempts_mtime_ns, a.batch_id, a.case_id, a.attempt"
        ))?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            versions.insert((r.get(0)?, r.get(1)?), r.get(2)?);
        }

        let mut groups: BTreeMap<(String, String), (Vec<u64>, u64)> = BTreeMap::new();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT harness, runtime, duration_ms, outcome = 'succeeded' FROM attempts
             WHERE {COUNTED} ORDER BY harness, runtime, duration_ms"
        ))?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let g = groups.entry((r.get(0)?, r.get(1)?)).or_default();
            g.0.push(duration(r.get(2)?));
            g.1 += u64::from(r.get::<_, bool>(3)?);
        }
        Ok(groups
            .into_iter()
            .map(|((harness, runtime), (durations, succeeded))| MedianRow {
                harness_version: versions.remove(&(harness.clone(), runtime.clone())),
                median_ms: weights::median_u64(&durations).unwrap_or(0),
                attempts: durations.len() as u64,
                harness,
                runtime,
                succeeded,
            })
            .collect())
    }

    fn weights_inner(&self, runtimes: &[String]) -> rusqlite::Result<Weights> {
        let wanted: HashSet<&str> = runtimes.iter().map(String::as_str).collect();
        let mut batches = weights::Durations::new();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT batch_id, runtime, duration_ms FROM attempts WHERE {COUNTED}"
        ))?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let runtime: String = r.get(1)?;
            if wanted.contains(runtime.as_str()) {
                let by_runtime = batches.entry(r.get(0)?).or_default();
                by_runtime
                    .entry(runtime)
                    .or_default()
                    .push(duration(r.get(2)?));
            }
        }
        Ok(weights::weights(runtimes, &batches))
    }

    fn harness_median_inner(&self, harness: &str) -> rusqlite::Result<Option<u64>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT duration_ms FROM attempts WHERE harness = ?1 AND {COUNTED}
             ORDER BY duration_ms"
        ))?;
        let durations = stmt
            .query_map([harness], |r| Ok(duration(r.get(0)?)))?
            .collect::<rusqlite::Result<Vec<u64>>>()?;
        Ok(weights::median_u64(&durations))
    }
}

/// When and how big `batch_attempts.json` was when indexed: what tells a rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    mtime_ns: i64,
    size: i64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        Self {
            mtime_ns,
            size: i64::try_from(meta.len()).unwrap_or(i64::MAX),
        }
    }
}

/// One attempt as indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    case_id: String,
    attempt: i64,
    harness: String,
    harness_version: Option<String>,
    runtime: String,
    duration_ms: Option<i64>,
    outcome: String,
    ran_to_end: bool,
    speculative_loser: bool,
}

/// `batch_attempts.json`, as `casebatch_bundle::write_batch_files` writes it.
#[derive(Deserialize)]
struct AttemptsFile {
    attempts: Vec<AttemptRecord>,
}

/// The rows of a finished bundle, or why it cannot be indexed (as `"path: why"`).
fn read_bundle(bundle: &Bundle) -> Result<Vec<Row>, String> {
    let attempts: AttemptsFile = read_json(&bundle.attempts())?;
    let plan: Plan = read_json(&bundle.plan())?;
    // A case missing from the plan ran an unknown harness: indexed as "none".
    let cases: HashMap<&str, (String, Option<&String>)> = plan
        .cases
        .iter()
        .map(|c| {
            let harness = harness_identity(c.harness.as_ref());
            (c.case_id.as_str(), (harness, c.env.get("HARNESS_VERSION")))
        })
        .collect();
    Ok(attempts
        .attempts
        .into_iter()
        .map(|rec| {
            let (harness, version) = cases
                .get(rec.case_id.as_str())
                .cloned()
                .unwrap_or_else(|| (harness_identity(None), None));
            let s = &rec.summary;
            Row {
                attempt: i64::from(s.attempt),
                harness,
                harness_version: version.cloned(),
                runtime: rec.runtime_name.clone().unwrap_or(rec.runtime.clone()),
                duration_ms: s
                    .duration_ms()
                    .map(|d| i64::try_from(d).unwrap_or(i64::MAX)),
                outcome: outcome(s),
                ran_to_end: s.actor == Some(ActorStatus::Finished),
                speculative_loser: s.speculative_loser,
                case_id: rec.case_id,
            }
        })
        .collect())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "{}: not valid JSON of the expected shape: {e}",
            path.display()
        )
    })
}

/// How an attempt ended, as a short string: `cancelled`, `succeeded`, or `failed:<class>`
/// (`failed` when no failure says why). The workflow's rule (`attempt_state` and
/// `is_verified_success` in casebatch-workflows), repeated here so the index does not link
/// the Temporal SDK.
fn outcome(s: &AttemptSummary) -> String {
    if s.actor == Some(ActorStatus::Cancelled) {
        return "cancelled".into();
    }
    let verified = !s.evaluation_configured || s.verdict == Some(Verdict::Pass);
    if s.failure.is_none()
        && s.collect_failure.is_none()
        && s.actor == Some(ActorStatus::Finished)
        && verified
    {
        return "succeeded".into();
    }
    // The deciding failure; else the trace pull's, which alone also fails the attempt.
    match s.failure.as_ref().or(s.collect_failure.as_ref()) {
        Some(f) => format!("failed:{}", f.class.as_str()),
        None => "failed".into(),
    }
}

/// A stored duration back as milliseconds (never negative: written from a `u64`).
fn duration(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0)
}

/// The output directory as one spelling (absolute, symlinks resolved when it exists), so that
/// the bundles found under it match the paths stored by earlier refreshes.
fn resolve(output_dir: &Path) -> PathBuf {
    std::fs::canonicalize(output_dir)
        .or_else(|_| std::path::absolute(output_dir))
        .unwrap_or_else(|_| output_dir.to_path_buf())
}

fn output_dir_error(path: &Path, source: std::io::Error) -> HistoryError {
    HistoryError::OutputDir {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use casebatch_proto::{Failure, FailureCode, Stage};

    use super::*;

    fn summary() -> AttemptSummary {
        serde_json::from_value(serde_json::json!({
            "attempt": 1, "actor": "finished", "exit_code": 0, "evaluation_configured": false,
            "verdict": null, "failure": null,
        }))
        .unwrap()
    }

    #[test]
    fn outcomes() {
        let ok = summary();
        assert_eq!(outcome(&ok), "succeeded");

        let mut s = ok.clone();
        s.actor = Some(ActorStatus::Cancelled);
        s.failure = Some(Failure::agent("x"));
        assert_eq!(outcome(&s), "cancelled");

        let mut s = ok.clone();
        s.evaluation_configured = true;
        assert_eq!(outcome(&s), "failed", "an evaluation without a verdict");
        s.verdict = Some(Verdict::Pass);
        assert_eq!(outcome(&s), "succeeded");
        s.verdict = Some(Verdict::Fail);
        s.failure = Some(Failure::agent("said fail"));
        assert_eq!(outcome(&s), "failed:agent");

        let mut s = ok.clone();
        s.collect_failure = Some(Failure::infra(Stage::Collect, FailureCode::Timeout, "x"));
        assert_eq!(outcome(&s), "failed:infra");

        let mut s = ok.clone();
        s.actor = Some(ActorStatus::Failed);
        assert_eq!(outcome(&s), "failed");
        s.failure = Some(Failure::harness(
            Stage::Await,
            FailureCode::HarnessExitNonzero,
            "exit 1",
        ));
        assert_eq!(outcome(&s), "failed:harness");

        let mut s = ok;
        s.actor = None;
        assert_eq!(outcome(&s), "failed");
    }

    #[test]
    fn harness_identities() {
        assert_eq!(harness_identity(None), "none");
        let shell = CommandSpec::Shell("run.sh".into());
        let id = harness_identity(Some(&shell));
        assert_eq!(id.len(), 16);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            id,
            harness_identity(Some(&CommandSpec::Shell("run.sh".into())))
        );
        let argv = CommandSpec::Argv(vec!["run.sh".into()]);
        assert_ne!(id, harness_identity(Some(&argv)));
    }
}
