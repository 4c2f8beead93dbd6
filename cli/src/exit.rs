//! The documented, stable exit codes, and the mapping of every error to one.

use std::fmt;

use casebatch_agent::AgentError;
use casebatch_control::{ControlError, Verdict};
use casebatch_worker::EngineError;

/// Exit codes: the only place they are defined. `--help` renders this table ([`help`]) and
/// the table in docs/exit-codes.md says the same (both checked by the tests below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    Incomplete = 1,
    Usage = 2,
    Engine = 3,
    Failures = 4,
    Output = 5,
    Terminated = 6,
}

impl Exit {
    /// Every code, in order.
    pub const ALL: [Exit; 7] = [
        Exit::Success,
        Exit::Incomplete,
        Exit::Usage,
        Exit::Engine,
        Exit::Failures,
        Exit::Output,
        Exit::Terminated,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    /// What the code tells a script, as `--help` and docs/exit-codes.md say it.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Success => {
                "every case succeeded (verified by its evaluator where one is configured)"
            }
            Exit::Incomplete => {
                "drained, paused or out of budget with queued work remaining (deliberately incomplete); for `casebatch health`: the probed process is not healthy"
            }
            Exit::Usage => {
                "usage or validation error, or a bundle file that is there but cannot be read (truncated JSON, a directory where a file belongs: the message names the file and why); nothing started or written"
            }
            Exit::Engine => "the engine could not be reached or started, or refused a call",
            Exit::Failures => {
                "the batch finished with failed, cancelled or mixed outcomes (all outputs written)"
            }
            Exit::Output => {
                "the output directory could not be written (the engine's state is intact: fix the disk, then resume)"
            }
            Exit::Terminated => {
                "the batch's workflow was terminated outside casebatch (finished cases kept; `batch resume` continues)"
            }
        }
    }
}

/// The `Exit codes:` section of `casebatch --help`, one entry per code of [`Exit::ALL`].
pub fn help() -> String {
    help_of("casebatch")
}

/// What `batch report`'s codes mean. A report reads a batch and judges nothing: it is run on
/// a batch known to have failed (to read why), on one still running, and in pipelines that
/// publish the page whatever the outcome, so failed cases are data in it, not an error of
/// it. The batch's outcome is the exit code of the commands that run it, and the report's
/// counts (`--json`) for a script that reads it later.
const REPORT_CODES: [(Exit, &str); 3] = [
    (
        Exit::Success,
        "the report was made (and the --html page written), whatever the batch's outcome: \
         failed, cancelled and unfinished cases are counted in the report, not in the exit code \
         (`batch run`, `resume`, `rerun` and `retry-failed` exit with the batch's outcome)",
    ),
    (
        Exit::Usage,
        "usage error, no such batch, or a bundle file that is there but cannot be read (the \
         message names the file and why)",
    ),
    (
        Exit::Output,
        "the rebuilt batch files or the --html page could not be written",
    ),
];

/// The exit codes `command` (its full name: `casebatch batch report`) can give, with what
/// each means for it: every code of the table, but for a command that only reads a batch.
pub fn codes_of(command: &str) -> Vec<(Exit, &'static str)> {
    match command {
        "casebatch batch report" => REPORT_CODES.to_vec(),
        _ => Exit::ALL.iter().map(|e| (*e, e.meaning())).collect(),
    }
}

/// The `Exit codes:` section of `command`'s `--help` ([`codes_of`]). Wrapped here with a
/// hanging indent, since clap wraps this text flush left.
pub fn help_of(command: &str) -> String {
    const WIDTH: usize = 80;
    let mut out = String::from("Exit codes:");
    for (e, meaning) in codes_of(command) {
        let mut line = format!("  {}  ", e.code());
        let mut words = meaning.split(' ');
        line.push_str(words.next().unwrap_or_default());
        for word in words {
            if line.len() + 1 + word.len() > WIDTH {
                out.push('\n');
                out.push_str(&line);
                line = format!("     {word}");
            } else {
                line.push(' ');
                line.push_str(word);
            }
        }
        out.push('\n');
        out.push_str(&line);
    }
    out
}

impl From<Verdict> for Exit {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::AllSucceeded => Exit::Success,
            Verdict::Incomplete => Exit::Incomplete,
            Verdict::Failures => Exit::Failures,
        }
    }
}

/// An error that knows its exit code. Messages read "failed to ..." and say what to do.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    /// A flag the CLI itself could not read.
    pub fn usage(message: impl fmt::Display) -> Self {
        Self {
            exit: Exit::Usage,
            message: message.to_string(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// One exit code per kind of failure, decided by variant, never by message.
fn exit_of(e: &ControlError) -> Exit {
    match e {
        ControlError::Manifest(_)
        | ControlError::BadArgument { .. }
        | ControlError::NoBundle { .. }
        | ControlError::UnknownCase { .. }
        | ControlError::PlanConflict { .. }
        | ControlError::BatchExists { .. }
        | ControlError::NotRunning { .. }
        | ControlError::Refused { .. }
        | ControlError::StillRunning { .. }
        | ControlError::NotOurBatch { .. }
        | ControlError::EngineMismatch { .. }
        | ControlError::BundleUnreadable(_)
        | ControlError::History { .. } => Exit::Usage,
        ControlError::Terminated { .. } => Exit::Terminated,
        // A plaintext connection to a remote address is a usage error, not an outage.
        ControlError::Engine(EngineError::Insecure { .. }) => Exit::Usage,
        ControlError::Engine(_) | ControlError::EngineCall { .. } => Exit::Engine,
        ControlError::Write(_) | ControlError::OutOfSpace { .. } => Exit::Output,
    }
}

impl From<ControlError> for CliError {
    fn from(e: ControlError) -> Self {
        Self {
            exit: exit_of(&e),
            message: e.to_string(),
        }
    }
}

/// `casebatch agent`'s failures to start or serve.
fn agent_exit_of(e: &AgentError) -> Exit {
    match e {
        // Flags, or a data dir held by another agent or written by a newer one: nothing started.
        AgentError::Config(_)
        | AgentError::InUse { .. }
        | AgentError::TableTooNew { .. }
        | AgentError::Bind { .. } => Exit::Usage,
        // The data dir is the agent's output directory.
        AgentError::DataDir { .. } | AgentError::Table { .. } => Exit::Output,
        // The service itself failed while serving (the agent's engine, as it were).
        AgentError::Serve(_) => Exit::Engine,
    }
}

impl From<AgentError> for CliError {
    fn from(e: AgentError) -> Self {
        Self {
            exit: agent_exit_of(&e),
            message: e.to_string(),
        }
    }
}

pub type CliResult<T = Exit> = Result<T, CliError>;

/// Reading exit-code lists back, for the tests of this table and of the help that shows it.
#[cfg(test)]
pub(crate) mod tests_support {
    /// The `Exit codes:` entries of a help text or of the table in docs/exit-codes.md: (code,
    /// meaning) with whitespace collapsed (clap wraps long lines to the terminal).
    pub(crate) fn entries(lines: impl Iterator<Item = String>) -> Vec<(u8, String)> {
        let mut entries: Vec<(u8, String)> = Vec::new();
        for line in lines {
            let line = line.trim();
            let (head, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            match head.parse::<u8>() {
                Ok(code) => entries.push((code, rest.to_string())),
                Err(_) => match entries.last_mut() {
                    Some((_, meaning)) => meaning.push_str(&format!(" {line}")),
                    None => panic!("not an exit code entry: {line:?}"),
                },
            }
        }
        entries
            .into_iter()
            .map(|(code, m)| (code, m.split_whitespace().collect::<Vec<_>>().join(" ")))
            .collect()
    }

    /// The table of exit codes as (code, meaning), in order.
    pub(crate) fn table() -> Vec<(u8, String)> {
        super::Exit::ALL
            .iter()
            .map(|e| (e.code(), e.meaning().to_string()))
            .collect()
    }

    /// The entries of a help text's `Exit codes:` section (none when it has no such section).
    pub(crate) fn help_entries(help: &str) -> Vec<(u8, String)> {
        let Some((_, section)) = help.split_once("Exit codes:") else {
            return Vec::new();
        };
        entries(
            section
                .lines()
                .map(str::to_string)
                .filter(|l| !l.trim().is_empty()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::{entries, table};
    use super::*;

    #[test]
    fn a_write_failure_is_not_a_usage_error() {
        let write = ControlError::Write(casebatch_bundle::BundleError::Write {
            path: "/x/batch_plan.json".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        });
        assert_eq!(CliError::from(write).exit, Exit::Output);
        let unreadable = ControlError::BundleUnreadable(casebatch_bundle::BundleError::Read {
            path: "/x/batch_plan.json".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        assert_eq!(CliError::from(unreadable).exit, Exit::Usage);
        let full = ControlError::OutOfSpace {
            action: "continue batch x".into(),
            path: "/x".into(),
            space: "0 B free of 3.0 MiB".into(),
            then: "`casebatch batch resume`".into(),
        };
        assert_eq!(CliError::from(full).exit, Exit::Output);
    }

    #[test]
    fn engine_failures_exit_3_but_an_insecure_address_is_usage() {
        let call = ControlError::EngineCall {
            action: "start workflow".into(),
            message: "unavailable".into(),
        };
        assert_eq!(CliError::from(call).exit, Exit::Engine);
        let insecure = ControlError::Engine(EngineError::Insecure {
            address: "10.0.0.1:7233".into(),
        });
        assert_eq!(CliError::from(insecure).exit, Exit::Usage);
    }

    /// The exit code table of docs/exit-codes.md says what the table says (in its own row
    /// order).
    #[test]
    fn the_exit_code_page_s_table_is_the_table_s() {
        let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/exit-codes.md");
        let text = std::fs::read_to_string(readme).unwrap();
        let rows = text
            .split_once("| exit | meaning |\n|---|---|\n")
            .unwrap_or_else(|| panic!("{readme}: no exit code table"))
            .1
            .lines()
            .take_while(|l| l.starts_with('|'))
            .map(|row| row.trim_matches('|').replacen('|', " ", 1));
        let mut listed = entries(rows);
        listed.sort();
        assert_eq!(listed, table(), "{readme}");
    }

    #[test]
    fn agent_errors_exit_by_kind() {
        let in_use = AgentError::InUse {
            data_dir: "/d".into(),
            pid: None,
        };
        assert_eq!(CliError::from(in_use).exit, Exit::Usage);
        let newer = AgentError::TableTooNew {
            path: "/d/jobs.sqlite".into(),
            found: 2,
            latest: 1,
        };
        assert_eq!(CliError::from(newer).exit, Exit::Usage);
        let unwritable = AgentError::DataDir {
            path: "/d".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        };
        assert_eq!(CliError::from(unwritable).exit, Exit::Output);
    }
}
