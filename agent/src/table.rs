//! The job table: `D/jobs.sqlite` (WAL), one row per attempt the agent was given, keyed by
//! the attempt's marker `<batch_id>/<case_index>/<attempt>`, with its job (`JobSpec`, stored
//! as its protobuf encoding: the wire's own rules for adding fields keep old rows readable). It is what survives the agent:
//! a restarted agent awaits every row not `ended` again, and answers for ended ones from
//! their stored report and cleanup receipt.
//!
//! One connection behind a mutex, used only from blocking threads ([`Table::with`]). WAL with
//! `synchronous=NORMAL`: a commit survives the agent being killed (the case that matters: the
//! jobs outlive the agent, not a power cut, which ends them too).
//!
//! The schema is versioned (`PRAGMA user_version`) and changes only by appending a step to
//! `MIGRATIONS`: a data dir must survive the agent's upgrades with its rows. Opening brings
//! an older table up to [`LATEST`], each step in its own transaction with its version; a table
//! a newer agent wrote is refused ([`OpenError::Newer`]) before anything is written to it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use casebatch_attempt::{CleanupReceipt, EvaluationRecord};
use casebatch_proto::ActorReport;
use casebatch_proto::runtime_v1::JobSpec;
use prost::Message;
use rusqlite::{Connection, OptionalExtension, Row, params};

/// `MIGRATIONS[n]` takes the table from version `n` to `n + 1`. Append only: a step that has
/// shipped never changes, since data dirs already past it never run it again.
const MIGRATIONS: &[fn(&Connection) -> rusqlite::Result<()>] = &[to_v1, to_v2];

/// The schema version this agent writes, and the newest it can read.
pub const LATEST: u32 = MIGRATIONS.len() as u32;

/// Version 1 is the table as agents made it before the schema had a version (their files have
/// `user_version` 0): created when missing, kept when there.
pub(crate) const V1: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    job_key TEXT PRIMARY KEY NOT NULL,
    batch_id TEXT NOT NULL,
    bundle_dir TEXT NOT NULL,
    case_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    memory_boost_mb INTEGER,
    planned_case_json TEXT NOT NULL,
    local_bundle TEXT NOT NULL,
    attempt_dir TEXT NOT NULL,
    memory_mb INTEGER,
    state TEXT NOT NULL,
    pid INTEGER,
    start_ticks INTEGER,
    starts INTEGER NOT NULL DEFAULT 0,
    report TEXT,
    submitted_at_ms INTEGER NOT NULL,
    ended_at_ms INTEGER,
    cleaned_at_ms INTEGER,
    cleanup_receipt TEXT,
    evaluation TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_batch ON jobs(batch_id);
CREATE INDEX IF NOT EXISTS jobs_ended_at ON jobs(ended_at_ms, job_key);
";

/// An unversioned table: today's one, or none (a fresh data dir). Agents from before
/// evaluations made it without the `evaluation` column, which it gains here, so every
/// version-1 table has the same columns.
fn to_v1(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(V1)?;
    let has_evaluation = conn
        .prepare("SELECT 1 FROM pragma_table_info('jobs') WHERE name = 'evaluation'")?
        .exists([])?;
    if !has_evaluation {
        conn.execute_batch("ALTER TABLE jobs ADD COLUMN evaluation TEXT")?;
    }
    Ok(())
}

/// Version 2 stores each job as contract v2 sent it: `job_spec`, the protobuf encoding of its
/// `JobSpec`, in place of `planned_case_json`, the manifest's planned case that contract v1
/// sent. Every row's planned case is read into its job (the frozen v1 reader,
/// `casebatch_proto::planned_case_v1`), so jobs running or ended across the upgrade are still
/// awaited, harvested, evaluated and cleaned up; a row whose planned case cannot be read (it
/// could not run before either) keeps no job, and calls that need it say so.
fn to_v2(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("ALTER TABLE jobs ADD COLUMN job_spec BLOB")?;
    let rows: Vec<(String, String)> = conn
        .prepare("SELECT job_key, planned_case_json FROM jobs")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut set = conn.prepare("UPDATE jobs SET job_spec = ?2 WHERE job_key = ?1")?;
    for (key, planned) in rows {
        match casebatch_proto::planned_case_v1::job_spec(planned.as_bytes()) {
            Ok(job) => {
                set.execute(params![key, job.encode_to_vec()])?;
            }
            Err(why) => tracing::warn!(job = %key, "job table upgrade: no job for the row: {why}"),
        }
    }
    conn.execute_batch("ALTER TABLE jobs DROP COLUMN planned_case_json")
}

/// Why the job table could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// Written by an agent that knows a later schema: this one would misread its rows, and
    /// writing them could lose what the newer columns hold.
    #[error("schema version {found}, but this agent knows versions up to {latest}")]
    Newer { found: i64, latest: u32 },
}

/// The table's version, or [`OpenError::Newer`] for one this agent does not know.
fn version(conn: &Connection) -> Result<u32, OpenError> {
    let found: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    u32::try_from(found)
        .ok()
        .filter(|v| *v <= LATEST)
        .ok_or(OpenError::Newer {
            found,
            latest: LATEST,
        })
}

/// Runs the steps from version `from` to [`LATEST`], each in one transaction with the version
/// it reaches: a crash between steps leaves a table at a version, never between two.
fn migrate(conn: &mut Connection, from: u32) -> rusqlite::Result<()> {
    for (version, step) in (from + 1..).zip(&MIGRATIONS[from as usize..]) {
        let tx = conn.transaction()?;
        step(&tx)?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
    }
    Ok(())
}

/// Where a job stands in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowState {
    /// Admitted; its process may not be known yet.
    Starting,
    /// Its process is known (pid and start time, when the runtime could name it).
    Running,
    /// The actor's report is stored.
    Ended,
}

impl RowState {
    pub fn as_str(self) -> &'static str {
        match self {
            RowState::Starting => "starting",
            RowState::Running => "running",
            RowState::Ended => "ended",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "starting" => Some(RowState::Starting),
            "running" => Some(RowState::Running),
            "ended" => Some(RowState::Ended),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub job_key: String,
    pub batch_id: String,
    /// The submitting batch's bundle directory, as submitted (on the worker's side).
    pub bundle_dir: String,
    pub case_index: u32,
    pub attempt: u32,
    pub memory_boost_mb: Option<u64>,
    /// The job as submitted; `None` only for a row carried over from contract v1 whose
    /// planned case could not be read.
    pub job: Option<JobSpec>,
    /// The agent's own directory for the batch, standing in for the bundle.
    pub local_bundle: String,
    pub attempt_dir: String,
    /// Declared memory, held against the budget while the job is not ended.
    pub memory_mb: Option<u64>,
    pub state: RowState,
    pub pid: Option<u32>,
    pub start_ticks: Option<u64>,
    pub starts: u32,
    pub report: Option<ActorReport>,
    pub submitted_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    pub cleaned_at_ms: Option<u64>,
    pub cleanup_receipt: Option<CleanupReceipt>,
    /// The evaluator's record, once Evaluate ran it: what a repeated Evaluate returns.
    pub evaluation: Option<EvaluationRecord>,
}

fn from_json<T: serde::de::DeserializeOwned>(
    idx: usize,
    text: Option<String>,
) -> rusqlite::Result<Option<T>> {
    text.map(|t| {
        serde_json::from_str(&t).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
        })
    })
    .transpose()
}

fn to_json<T: serde::Serialize>(value: &T) -> rusqlite::Result<String> {
    serde_json::to_string(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(|n| n as u64)
}

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(|n| n as i64)
}

impl JobRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        let state: String = row.get("state")?;
        Ok(Self {
            job_key: row.get("job_key")?,
            batch_id: row.get("batch_id")?,
            bundle_dir: row.get("bundle_dir")?,
            case_index: row.get("case_index")?,
            attempt: row.get("attempt")?,
            memory_boost_mb: opt_u64(row.get("memory_boost_mb")?),
            job: row
                .get::<_, Option<Vec<u8>>>("job_spec")?
                .map(|bytes| {
                    JobSpec::decode(bytes.as_slice()).map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(
                            20,
                            rusqlite::types::Type::Blob,
                            Box::new(e),
                        )
                    })
                })
                .transpose()?,
            local_bundle: row.get("local_bundle")?,
            attempt_dir: row.get("attempt_dir")?,
            memory_mb: opt_u64(row.get("memory_mb")?),
            state: RowState::parse(&state).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    10,
                    rusqlite::types::Type::Text,
                    format!("unknown job state {state:?}").into(),
                )
            })?,
            pid: row.get("pid")?,
            start_ticks: opt_u64(row.get("start_ticks")?),
            starts: row.get("starts")?,
            report: from_json(14, row.get("report")?)?,
            submitted_at_ms: row.get::<_, i64>("submitted_at_ms")? as u64,
            ended_at_ms: opt_u64(row.get("ended_at_ms")?),
            cleaned_at_ms: opt_u64(row.get("cleaned_at_ms")?),
            cleanup_receipt: from_json(18, row.get("cleanup_receipt")?)?,
            evaluation: from_json(19, row.get("evaluation")?)?,
        })
    }
}

/// Jobs not yet ended, and the memory they declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    pub jobs: u32,
    pub memory_mb: u64,
}

#[derive(Clone)]
pub struct Table {
    conn: Arc<Mutex<Connection>>,
}

impl Table {
    /// Opens (or creates) the table at `path` and migrates it to [`LATEST`].
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Read before the first write: a newer agent's file is left as it is.
        let from = version(&conn)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        migrate(&mut conn, from)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` with the connection on a blocking thread: the async threads never wait on
    /// the database. Whatever `f` does happens under the one table lock.
    pub async fn with<T, F>(&self, f: F) -> rusqlite::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&conn)
        })
        .await
        .unwrap_or_else(|e| Err(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))
    }
}

pub fn get(conn: &Connection, key: &str) -> rusqlite::Result<Option<JobRow>> {
    conn.prepare_cached("SELECT * FROM jobs WHERE job_key = ?1")?
        .query_row([key], JobRow::read)
        .optional()
}

pub fn insert(conn: &Connection, r: &JobRow) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO jobs (job_key, batch_id, bundle_dir, case_index, attempt, memory_boost_mb,
            job_spec, local_bundle, attempt_dir, memory_mb, state, pid, start_ticks,
            starts, report, submitted_at_ms, ended_at_ms, cleaned_at_ms, cleanup_receipt,
            evaluation)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,
            ?20)",
    )?
    .execute(params![
        r.job_key,
        r.batch_id,
        r.bundle_dir,
        r.case_index,
        r.attempt,
        opt_i64(r.memory_boost_mb),
        r.job.as_ref().map(Message::encode_to_vec),
        r.local_bundle,
        r.attempt_dir,
        opt_i64(r.memory_mb),
        r.state.as_str(),
        r.pid,
        opt_i64(r.start_ticks),
        r.starts,
        r.report.as_ref().map(to_json).transpose()?,
        r.submitted_at_ms as i64,
        opt_i64(r.ended_at_ms),
        opt_i64(r.cleaned_at_ms),
        r.cleanup_receipt.as_ref().map(to_json).transpose()?,
        r.evaluation.as_ref().map(to_json).transpose()?,
    ])?;
    Ok(())
}

/// The rows not ended (every [`RowState`] but `Ended`), as a condition the `jobs_state` index
/// answers. `state != 'ended'` reads every row the agent ever ran: 120 ms a call at 300,000
/// ended rows, against 0.2 ms, and admission asks under the table lock.
macro_rules! not_ended {
    () => {
        "state IN ('starting', 'running')"
    };
}

const IN_FLIGHT: &str = concat!(
    "SELECT COUNT(*), COALESCE(SUM(memory_mb), 0) FROM jobs WHERE ",
    not_ended!()
);
const UNFINISHED: &str = concat!(
    "SELECT * FROM jobs WHERE ",
    not_ended!(),
    " ORDER BY submitted_at_ms"
);

pub fn in_flight(conn: &Connection) -> rusqlite::Result<InFlight> {
    conn.prepare_cached(IN_FLIGHT)?.query_row([], |row| {
        Ok(InFlight {
            jobs: row.get::<_, i64>(0)? as u32,
            memory_mb: row.get::<_, i64>(1)? as u64,
        })
    })
}

/// How many rows are in each state (states without a row are left out).
pub fn count_by_state(conn: &Connection) -> rusqlite::Result<Vec<(String, u64)>> {
    conn.prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state")?
        .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as u64)))?
        .collect()
}

/// Every row not ended, oldest first.
pub fn unfinished(conn: &Connection) -> rusqlite::Result<Vec<JobRow>> {
    conn.prepare_cached(UNFINISHED)?
        .query_map([], JobRow::read)?
        .collect()
}

/// `+state`: answered by `jobs_ended_at` in key order, a page in 2 ms at 300,000 ended rows;
/// through `jobs_state` SQLite read and sorted every ended row, 240 ms a page.
const ENDED_BEFORE: &str = "SELECT * FROM jobs WHERE +state = 'ended' AND ended_at_ms < ?1
     AND (ended_at_ms, job_key) > (?2, ?3)
     ORDER BY ended_at_ms, job_key LIMIT ?4";

/// Ended rows whose job ended before `cutoff_ms`, in (end time, key) order from just after
/// `after`, at most `limit`: a page at a time, so rows that stay are read once per pass.
pub fn ended_before(
    conn: &Connection,
    cutoff_ms: u64,
    after: (u64, &str),
    limit: u32,
) -> rusqlite::Result<Vec<JobRow>> {
    conn.prepare_cached(ENDED_BEFORE)?
        .query_map(
            params![cutoff_ms as i64, after.0 as i64, after.1, limit],
            JobRow::read,
        )?
        .collect()
}

/// Deletes an ended row. True when it was there.
pub fn delete_ended(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
    let n = conn
        .prepare_cached("DELETE FROM jobs WHERE job_key = ?1 AND state = 'ended'")?
        .execute([key])?;
    Ok(n > 0)
}

/// True when some row still uses the agent's directory `local_bundle` of `batch_id`.
pub fn bundle_in_use(
    conn: &Connection,
    batch_id: &str,
    local_bundle: &str,
) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM jobs WHERE batch_id = ?1 AND local_bundle = ?2 LIMIT 1")?
        .exists([batch_id, local_bundle])
}

/// The process is known: `running`, with its identity and how many starts it took.
pub fn set_running(
    conn: &Connection,
    key: &str,
    pid: Option<u32>,
    start_ticks: Option<u64>,
    starts: u32,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE jobs SET state = 'running', pid = ?2, start_ticks = ?3, starts = ?4
         WHERE job_key = ?1 AND state != 'ended'",
    )?
    .execute(params![key, pid, opt_i64(start_ticks), starts])?;
    Ok(())
}

pub fn set_ended(
    conn: &Connection,
    key: &str,
    report: &ActorReport,
    starts: u32,
    ended_at_ms: u64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE jobs SET state = 'ended', report = ?2, starts = ?3, ended_at_ms = ?4
         WHERE job_key = ?1",
    )?
    .execute(params![key, to_json(report)?, starts, ended_at_ms as i64])?;
    Ok(())
}

pub fn set_cleaned(
    conn: &Connection,
    key: &str,
    receipt: &CleanupReceipt,
    cleaned_at_ms: u64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE jobs SET cleanup_receipt = ?2, cleaned_at_ms = ?3 WHERE job_key = ?1",
    )?
    .execute(params![key, to_json(receipt)?, cleaned_at_ms as i64])?;
    Ok(())
}

/// Records the job's evaluation, unless one is recorded already (the first one stands).
pub fn set_evaluation(
    conn: &Connection,
    key: &str,
    evaluation: &EvaluationRecord,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE jobs SET evaluation = ?2 WHERE job_key = ?1 AND evaluation IS NULL",
    )?
    .execute(params![key, to_json(evaluation)?])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::types::Value;

    use super::*;

    /// The job table exactly as agents created it before the schema had a version (copied
    /// from that code, not from [`V1`]): what data dirs on disk hold today.
    const UNVERSIONED: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    job_key TEXT PRIMARY KEY NOT NULL,
    batch_id TEXT NOT NULL,
    bundle_dir TEXT NOT NULL,
    case_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    memory_boost_mb INTEGER,
    planned_case_json TEXT NOT NULL,
    local_bundle TEXT NOT NULL,
    attempt_dir TEXT NOT NULL,
    memory_mb INTEGER,
    state TEXT NOT NULL,
    pid INTEGER,
    start_ticks INTEGER,
    starts INTEGER NOT NULL DEFAULT 0,
    report TEXT,
    submitted_at_ms INTEGER NOT NULL,
    ended_at_ms INTEGER,
    cleaned_at_ms INTEGER,
    cleanup_receipt TEXT,
    evaluation TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_batch ON jobs(batch_id);
CREATE INDEX IF NOT EXISTS jobs_ended_at ON jobs(ended_at_ms, job_key);
";

    /// Rows as that code wrote them, each with the planned case a contract v1 worker sent: two
    /// finished jobs (one evaluated to a pass and cleaned up, one whose evaluator failed and
    /// whose planned case is unreadable), one running, one starting.
    const UNVERSIONED_ROWS: &str = r#"
INSERT INTO jobs VALUES ('b/0/1', 'b', '/w/b', 0, 1, NULL, '{"index":0,"case_id":"c0","case_dir":"c0","runtime":"agent","runtime_name":"box","harness":"echo hi","evaluator":["/bin/check","--strict"],"sandbox":null,"resources":{"cpu":null,"memory_mb":256},"timeout_seconds":60,"fake":null,"env":{"MODE":"fast"},"input":{"query":"q"},"source":{"line":3,"runspec":null}}', '/d/batches/b-1', '/d/batches/b-1/cases/c0/attempts/1', 256, 'ended', 4100, 9001, 1,
    '{"status":"finished","exit_code":0,"failure":null,"adopted":false,"memory_limit_mb":256}',
    1000, 2000, 2100,
    '{"schema_version":"casebatch_v1","marker":"b/0/1","cleanup_confirmed":true,"killed":[],"remaining":[],"scans":1,"message":"nothing left","method":"cgroup_v2","checks":["cgroup_empty","marker_scan"]}',
    '{"schema_version":"casebatch_v1","configured":true,"verdict":"pass","scores":{"accuracy":0.75},"failure":null,"exit_code":0}');
INSERT INTO jobs VALUES ('b/1/2', 'b', '/w/b', 1, 2, 128, '{"index":1}', '/d/batches/b-1', '/d/batches/b-1/cases/c1/attempts/2', NULL, 'ended', 4200, 9002, 2,
    '{"status":"failed","exit_code":3,"failure":{"stage":"await","class":"harness","code":"HARNESS_EXIT_NONZERO","message":"exit 3","retryable":false},"adopted":true,"memory_limit_mb":null}',
    1100, 2200, NULL, NULL,
    '{"schema_version":"casebatch_v1","configured":true,"verdict":null,"scores":{},"failure":{"stage":"evaluate","class":"harness","code":"EVALUATOR_FAILED","message":"evaluator exited 1","retryable":false},"exit_code":1}');
INSERT INTO jobs VALUES ('b/2/1', 'b', '/w/b', 2, 1, NULL, '{"index":2,"case_id":"c2","case_dir":"c2","runtime":"agent","runtime_name":"box","harness":["/bin/sleep","300"],"evaluator":null,"sandbox":null,"resources":{"cpu":null,"memory_mb":512},"timeout_seconds":60,"fake":null,"env":{"MODE":"fast"},"input":{"query":"q"},"source":{"line":3,"runspec":null}}', '/d/batches/b-1', '/d/batches/b-1/cases/c2/attempts/1', 512, 'running', 4300, 9003, 1,
    NULL, 1200, NULL, NULL, NULL, NULL);
INSERT INTO jobs (job_key, batch_id, bundle_dir, case_index, attempt, planned_case_json, local_bundle, attempt_dir, state, submitted_at_ms)
    VALUES ('b/3/1', 'b', '/w/b', 3, 1, '{"index":3,"case_id":"c3","case_dir":"c3","runtime":"agent","runtime_name":"box","harness":"echo hi","evaluator":["/bin/check","--strict"],"sandbox":null,"resources":{"cpu":null,"memory_mb":null},"timeout_seconds":60,"fake":null,"pass_env":["API_KEY"],"input":{"query":"q"},"source":{"line":3,"runspec":null}}', '/d/batches/b-1', '/d/batches/b-1/cases/c3/attempts/1', 'starting', 1300);
"#;

    /// Every column of the unversioned table but `planned_case_json` (which version 2
    /// replaces by `job_spec`), as stored.
    fn dump(conn: &Connection) -> Vec<Vec<Value>> {
        let mut stmt = conn
            .prepare(
                "SELECT job_key, batch_id, bundle_dir, case_index, attempt, memory_boost_mb,
                    local_bundle, attempt_dir, memory_mb, state, pid,
                    start_ticks, starts, report, submitted_at_ms, ended_at_ms, cleaned_at_ms,
                    cleanup_receipt, evaluation
                 FROM jobs ORDER BY job_key",
            )
            .unwrap();
        let columns = stmt.column_count();
        stmt.query_map([], |row| (0..columns).map(|i| row.get(i)).collect())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// The job each row of [`UNVERSIONED_ROWS`] is read as once upgraded.
    fn check_jobs(conn: &Connection) {
        let job = |key: &str| get(conn, key).unwrap().unwrap().job;
        let passed = job("b/0/1").expect("a readable planned case becomes its job");
        assert_eq!((passed.case_index, passed.case_dir.as_str()), (0, "c0"));
        assert_eq!(
            passed.harness.as_ref().unwrap().argv,
            ["sh", "-c", "echo hi"]
        );
        assert_eq!(
            passed.evaluator.as_ref().unwrap().argv,
            ["/bin/check", "--strict"]
        );
        assert_eq!(passed.env["MODE"], "fast");
        assert_eq!(passed.memory_mb(), Some(256));
        assert_eq!(passed.input().unwrap()["query"], "q");
        assert_eq!(
            job("b/1/2"),
            None,
            "an unreadable planned case keeps no job"
        );
        let running = job("b/2/1").unwrap();
        assert_eq!(running.harness.unwrap().argv, ["/bin/sleep", "300"]);
        assert!(running.evaluator.is_none());
        let starting = job("b/3/1").unwrap();
        assert_eq!(starting.pass_env, ["API_KEY"]);
        // What the agent runs from a row: the job in the agent's own directory.
        let row = get(conn, "b/2/1").unwrap().unwrap();
        let attempt = row.env().unwrap();
        assert_eq!(attempt.dir, Path::new("/d/batches/b-1/cases/c2/attempts/1"));
        assert_eq!(attempt.memory_mb(), Some(512));
        let unreadable = get(conn, "b/1/2").unwrap().unwrap().env().unwrap_err();
        assert!(unreadable.contains("b/1/2"), "{unreadable}");
    }

    fn user_version(path: &Path) -> i64 {
        Connection::open(path)
            .unwrap()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap()
    }

    fn column_names(conn: &Connection) -> Vec<String> {
        conn.prepare("SELECT name FROM pragma_table_info('jobs') ORDER BY cid")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// A data dir written before the schema had a version (`user_version` 0) is upgraded in
    /// place: every row and column kept, each row readable, the version the latest.
    #[test]
    fn an_unversioned_data_dir_is_upgraded_in_place_with_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.sqlite");
        let before = {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            conn.execute_batch(UNVERSIONED).unwrap();
            conn.execute_batch(UNVERSIONED_ROWS).unwrap();
            dump(&conn)
        };
        assert_eq!(before.len(), 4);
        assert_eq!(user_version(&path), 0);

        let table = Table::open(&path).unwrap();
        {
            let conn = table.conn.lock().unwrap();
            assert_eq!(dump(&conn), before, "every row and column survives");
            check_jobs(&conn);
            let passed = get(&conn, "b/0/1").unwrap().unwrap();
            assert_eq!(passed.state, RowState::Ended);
            assert_eq!(passed.report.unwrap().exit_code, Some(0));
            assert!(passed.cleanup_receipt.unwrap().cleanup_confirmed);
            let evaluation = passed.evaluation.unwrap();
            assert_eq!(evaluation.verdict, Some(casebatch_proto::Verdict::Pass));
            assert_eq!(evaluation.scores["accuracy"], serde_json::json!(0.75));
            let failed = get(&conn, "b/1/2").unwrap().unwrap();
            assert_eq!(failed.memory_boost_mb, Some(128));
            assert!(failed.report.unwrap().adopted);
            assert_eq!(
                failed.evaluation.unwrap().failure.unwrap().code,
                casebatch_proto::FailureCode::EvaluatorFailed
            );
            let unfinished: Vec<_> = unfinished(&conn)
                .unwrap()
                .into_iter()
                .map(|r| (r.job_key, r.state, r.pid))
                .collect();
            assert_eq!(
                unfinished,
                [
                    ("b/2/1".to_string(), RowState::Running, Some(4300)),
                    ("b/3/1".to_string(), RowState::Starting, None)
                ]
            );
            assert_eq!(
                in_flight(&conn).unwrap(),
                InFlight {
                    jobs: 2,
                    memory_mb: 512
                }
            );
        }
        drop(table);
        assert_eq!(user_version(&path), i64::from(LATEST));

        // Opening it again (the next restart) runs no step twice.
        let table = Table::open(&path).unwrap();
        assert_eq!(dump(&table.conn.lock().unwrap()), before);
        drop(table);
        assert_eq!(user_version(&path), i64::from(LATEST));
    }

    /// A data dir from before evaluations gains the column, and its rows read as unevaluated.
    #[test]
    fn a_table_made_before_evaluations_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.sqlite");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&UNVERSIONED.replace(",\n    evaluation TEXT", ""))
                .unwrap();
            conn.execute(
                "INSERT INTO jobs (job_key, batch_id, bundle_dir, case_index, attempt,
                    planned_case_json, local_bundle, attempt_dir, state, submitted_at_ms)
                 VALUES ('b/0/1', 'b', '/w', 0, 1, '{}', '/l', '/l/a', 'ended', 1)",
                [],
            )
            .unwrap();
        }
        let table = Table::open(&path).unwrap();
        let conn = table.conn.lock().unwrap();
        assert_eq!(get(&conn, "b/0/1").unwrap().unwrap().evaluation, None);
        let record = EvaluationRecord::not_configured();
        set_evaluation(&conn, "b/0/1", &record).unwrap();
        assert_eq!(
            get(&conn, "b/0/1").unwrap().unwrap().evaluation,
            Some(record)
        );
        assert_eq!(user_version(&path), i64::from(LATEST));
    }

    /// A data dir at version 1 (planned cases as JSON, what agents before contract v2 wrote)
    /// is upgraded to store each job: rows kept, jobs read from their planned cases, and a
    /// job written after the upgrade reads back whole.
    #[test]
    fn a_version_1_data_dir_gets_its_jobs_from_their_planned_cases() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.sqlite");
        let before = {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(V1).unwrap();
            conn.execute_batch(UNVERSIONED_ROWS).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            dump(&conn)
        };
        let table = Table::open(&path).unwrap();
        {
            let conn = table.conn.lock().unwrap();
            assert_eq!(dump(&conn), before);
            check_jobs(&conn);
            let mut row = get(&conn, "b/0/1").unwrap().unwrap();
            row.job_key = "b/9/1".into();
            row.case_index = 9;
            insert(&conn, &row).unwrap();
            assert_eq!(get(&conn, "b/9/1").unwrap().unwrap(), row);
        }
        drop(table);
        assert_eq!(user_version(&path), i64::from(LATEST));
    }

    /// A fresh data dir gets the latest schema, with today's columns, and works.
    #[test]
    fn a_fresh_table_gets_the_latest_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.sqlite");
        let table = Table::open(&path).unwrap();
        {
            let conn = table.conn.lock().unwrap();
            let reference = Connection::open_in_memory().unwrap();
            reference.execute_batch(UNVERSIONED).unwrap();
            let mut expected = column_names(&reference);
            expected.retain(|c| c != "planned_case_json");
            expected.push("job_spec".into());
            assert_eq!(column_names(&conn), expected);
            assert_eq!(get(&conn, "b/0/1").unwrap(), None);
            assert_eq!(in_flight(&conn).unwrap(), InFlight::default());
        }
        drop(table);
        assert_eq!(user_version(&path), i64::from(LATEST));
    }

    /// A table a newer agent wrote is refused, and left exactly as it was.
    #[test]
    fn a_table_from_a_newer_agent_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.sqlite");
        let newer = i64::from(LATEST) + 1;
        let before = {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(UNVERSIONED).unwrap();
            conn.execute_batch(UNVERSIONED_ROWS).unwrap();
            conn.pragma_update(None, "user_version", newer).unwrap();
            std::fs::read(&path).unwrap()
        };
        match Table::open(&path) {
            Err(OpenError::Newer { found, latest }) => {
                assert_eq!((found, latest), (newer, LATEST));
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("a newer table was opened"),
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the file is untouched"
        );
    }

    #[test]
    fn not_ended_names_every_state_but_ended() {
        for state in [RowState::Starting, RowState::Running] {
            assert!(not_ended!().contains(&format!("'{}'", state.as_str())));
        }
        assert!(!not_ended!().contains(RowState::Ended.as_str()));
    }

    /// Admission asks for the jobs in flight under the table lock, and retention pages
    /// through old ended jobs under it: neither may read every row the agent ever ran.
    #[test]
    fn questions_asked_under_the_table_lock_use_an_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, 0).unwrap();
        for (sql, index) in [
            (IN_FLIGHT, "jobs_state"),
            (UNFINISHED, "jobs_state"),
            (ENDED_BEFORE, "jobs_ended_at"),
        ] {
            let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let nulls = std::iter::repeat_n(rusqlite::types::Null, explain.parameter_count());
            let plan: Vec<String> = explain
                .query_map(rusqlite::params_from_iter(nulls), |row| row.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                plan.iter()
                    .any(|step| step.contains(&format!("USING INDEX {index}"))),
                "{sql}: {plan:?}"
            );
        }
    }
}
