//! The index file: its tables, its schema version, and opening it so that two processes can
//! refresh it at once.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

/// `PRAGMA user_version` of the tables below. Bump it on any change: a file with another
/// version is emptied and rebuilt from the bundles, never migrated (it is only an index).
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const CREATE: &str = "
    CREATE TABLE attempts (
        batch_id TEXT NOT NULL,
        case_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        harness TEXT NOT NULL,
        harness_version TEXT,
        runtime TEXT NOT NULL,
        duration_ms INTEGER,
        outcome TEXT NOT NULL,
        ran_to_end INTEGER NOT NULL,
        speculative_loser INTEGER NOT NULL,
        PRIMARY KEY (batch_id, case_id, attempt)
    );
    CREATE INDEX attempts_by_harness ON attempts (harness, runtime);
    CREATE TABLE bundles (
        batch_id TEXT PRIMARY KEY,
        path TEXT NOT NULL,
        attempts_mtime_ns INTEGER NOT NULL,
        attempts_size INTEGER NOT NULL
    );
";

const DROP: &str = "
    DROP INDEX IF EXISTS attempts_by_harness;
    DROP TABLE IF EXISTS attempts;
    DROP TABLE IF EXISTS bundles;
";

/// The attempts that say how long a harness takes on a runtime: they ran to the end (not
/// killed, cancelled or lost), did not lose a speculation race (killed on purpose), and
/// carry their timing (records older than the timings have none).
pub(crate) const COUNTED: &str =
    "ran_to_end = 1 AND speculative_loser = 0 AND duration_ms IS NOT NULL";

/// Opens (creating) the index at `path` with WAL and a busy timeout, and makes sure its
/// tables are those of [`SCHEMA_VERSION`]. A file that is not a SQLite database at all is
/// deleted and made again: nothing in it is lost that the bundles do not hold.
pub(crate) fn open(path: &Path) -> rusqlite::Result<Connection> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match open_repairing(path) {
            // SQLite skips the busy handler where waiting could deadlock: two connections that
            // both read a fresh file and both want to switch it to WAL. One of them gets BUSY
            // at once, and opening again, once the other is done, succeeds.
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

fn open_repairing(path: &Path) -> rusqlite::Result<Connection> {
    match open_once(path) {
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::NotADatabase) => {
            for suffix in ["", "-wal", "-shm"] {
                let mut file = path.as_os_str().to_owned();
                file.push(suffix);
                // Best effort: if it cannot be removed, the second open reports why.
                let _ = std::fs::remove_file(file);
            }
            open_once(path)
        }
        other => other,
    }
}

fn open_once(path: &Path) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // Losing the last transactions to a power cut only means re-indexing them.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Immediate: two processes opening a fresh file must not both create the tables.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version != SCHEMA_VERSION {
        tx.execute_batch(DROP)?;
        tx.execute_batch(CREATE)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(conn)
}

/// Empties the index (its schema stays).
pub(crate) fn clear(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch("DELETE FROM attempts; DELETE FROM bundles;")?;
    tx.commit()
}
