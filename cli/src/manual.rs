//! What describes the command line to its readers: `--help` with every exit code on every
//! command, one man page per command (each with EXIT STATUS from [`Exit::ALL`], the table
//! `exit.rs` keeps), and shell completions that offer only what `--help` shows.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Command, CommandFactory};
use clap_mangen::Man;
use clap_mangen::roff::{Roff, roman};

use crate::cli::Cli;
use crate::exit;

/// The command line as parsed: [`Cli`] with the exit codes after the help of every command,
/// not only the top one (a script calls `casebatch batch run`, and reads its `--help`), each
/// listing the codes that command can give ([`exit::codes_of`]).
pub fn command() -> Command {
    fn with_exit_codes(cmd: Command, parent: &str) -> Command {
        let name = full_name(parent, &cmd);
        cmd.after_help(exit::help_of(&name))
            .mut_subcommands(|sub| with_exit_codes(sub, &name))
    }
    with_exit_codes(Cli::command(), "")
}

/// `casebatch batch report`: a command's name after its parent's.
fn full_name(parent: &str, cmd: &Command) -> String {
    if parent.is_empty() {
        cmd.get_name().to_string()
    } else {
        format!("{parent} {}", cmd.get_name())
    }
}

/// The command line as completions see it: without hidden commands and flags (internal ones,
/// such as `engine keep` and `--history-budget`), which clap's completion scripts would
/// otherwise offer, and with the argument groups that still name only visible flags.
pub fn completion_command() -> Command {
    fn visible(cmd: &Command) -> Command {
        let mut out = Command::new(cmd.get_name().to_string());
        if let Some(version) = cmd.get_version() {
            out = out.version(version.to_string());
        }
        if cmd.is_propagate_version_set() {
            out = out.propagate_version(true);
        }
        if let Some(about) = cmd.get_about() {
            out = out.about(about.clone());
        }
        out = out.visible_aliases(cmd.get_visible_aliases().map(str::to_string));
        let args: Vec<_> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .cloned()
            .collect();
        let kept = |group: &&ArgGroup| {
            group
                .get_args()
                .all(|id| args.iter().any(|a| a.get_id() == id))
        };
        let groups: Vec<ArgGroup> = cmd.get_groups().filter(kept).cloned().collect();
        out.args(args).groups(groups).subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(visible),
        )
    }
    visible(&Cli::command())
}

/// A shell's completion script for `casebatch`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    let mut cmd = completion_command();
    clap_complete::generate(shell, &mut cmd, "casebatch", out);
}

/// The man page of the top command (`casebatch man`).
pub fn man_page(out: &mut dyn Write) -> io::Result<()> {
    let mut cmd = command().disable_help_subcommand(true);
    cmd.build();
    let name = full_name("", &cmd);
    page(cmd, &name, out)
}

/// Every command's man page into `dir` (`casebatch.1`, `casebatch-batch.1`,
/// `casebatch-batch-run.1`, ...), so that each SUBCOMMANDS section names pages that exist.
/// Returns the files written, the top page first.
pub fn man_pages(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fn write_all(
        cmd: &Command,
        parent: &str,
        dir: &Path,
        written: &mut Vec<PathBuf>,
    ) -> io::Result<()> {
        let name = full_name(parent, cmd);
        let path = dir.join(Man::new(cmd.clone()).get_filename());
        let mut file = io::BufWriter::new(std::fs::File::create(&path)?);
        page(cmd.clone(), &name, &mut file)?;
        file.flush()?;
        written.push(path);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write_all(sub, &name, dir, written)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir)?;
    let mut cmd = command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    write_all(&cmd, "", dir, &mut written)?;
    Ok(written)
}

/// One page: clap_mangen's sections in its order, with EXIT STATUS (the codes the command
/// `name` can give, in man-pages(7)'s place: after OPTIONS and SUBCOMMANDS) instead of the
/// help's exit-code text.
fn page(cmd: Command, name: &str, out: &mut dyn Write) -> io::Result<()> {
    let has_args = cmd.get_arguments().any(|a| !a.is_hide_set());
    let has_subcommands = cmd.get_subcommands().any(|s| !s.is_hide_set());
    let has_version = cmd.get_version().is_some();
    // Every page's footer names the program, not the subcommand (`run 0.1.0`).
    let man = Man::new(cmd).source(format!("casebatch {}", env!("CARGO_PKG_VERSION")));
    let mut sections: Vec<Vec<u8>> = Vec::new();
    let mut section = |render: &dyn Fn(&mut Vec<u8>) -> io::Result<()>| -> io::Result<()> {
        let mut buf = Vec::new();
        render(&mut buf)?;
        sections.push(buf);
        Ok(())
    };
    section(&|w| man.render_title(w))?;
    section(&|w| man.render_name_section(w))?;
    section(&|w| man.render_synopsis_section(w))?;
    section(&|w| man.render_description_section(w))?;
    if has_args {
        section(&|w| man.render_options_section(w))?;
    }
    if has_subcommands {
        section(&|w| man.render_subcommands_section(w))?;
    }
    section(&|w| exit_status(name).to_writer(w))?;
    if has_version {
        section(&|w| man.render_version_section(w))?;
    }
    // Each part opens with roff's apostrophe preamble: the page needs it once.
    let preamble = Roff::new().render();
    for (i, part) in sections.iter().enumerate() {
        let body = match part.strip_prefix(preamble.as_bytes()) {
            Some(body) if i > 0 => body,
            _ => part,
        };
        out.write_all(body)?;
    }
    Ok(())
}

/// The EXIT STATUS section: every code the command `name` can give, with its meaning.
fn exit_status(name: &str) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (e, meaning) in exit::codes_of(name) {
        roff.control("TP", []);
        roff.text([roman(e.code().to_string())]);
        roff.text([roman(meaning)]);
    }
    roff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::Exit;

    /// Every command, the top one included, by its full name.
    fn all(cmd: &Command, prefix: &str, out: &mut Vec<(String, Command)>) {
        let name = format!("{prefix}{}", cmd.get_name());
        out.push((name.clone(), cmd.clone()));
        for sub in cmd.get_subcommands() {
            all(sub, &format!("{name} "), out);
        }
    }

    #[test]
    fn every_commands_help_lists_the_exit_codes_it_can_give() {
        let mut commands = Vec::new();
        all(&command(), "", &mut commands);
        assert!(commands.len() > 30, "{}", commands.len());
        for (name, mut cmd) in commands {
            let help = cmd.render_long_help().to_string();
            let listed = exit::tests_support::help_entries(&help);
            let expected: Vec<(u8, String)> = exit::codes_of(&name)
                .into_iter()
                .map(|(e, meaning)| (e.code(), meaning.to_string()))
                .collect();
            assert_eq!(listed, expected, "{name} --help:\n{help}");
            if name != "casebatch batch report" {
                assert_eq!(
                    listed.iter().map(|(code, _)| *code).collect::<Vec<_>>(),
                    Exit::ALL.map(Exit::code),
                    "{name} --help:\n{help}"
                );
            }
        }
    }

    /// `batch report` exits 0 on a batch with failed cases (it reads a batch, it does not
    /// judge it): its help says so, and lists no batch-outcome code.
    #[test]
    fn the_report_s_help_lists_a_reader_s_codes() {
        let mut cmd = command();
        let report = cmd
            .find_subcommand_mut("batch")
            .and_then(|b| b.find_subcommand_mut("report"))
            .expect("batch report")
            .clone();
        let help = report.clone().render_long_help().to_string();
        let listed = exit::tests_support::help_entries(&help);
        let codes: Vec<u8> = listed.iter().map(|(code, _)| *code).collect();
        assert_eq!(codes, [0, 2, 5], "{help}");
        assert!(
            listed[0].1.contains("whatever the batch's outcome"),
            "{help}"
        );
        let mut page = Vec::new();
        super::page(report, "casebatch batch report", &mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(!page.contains(".TP\n4\n"), "{page}");
        assert!(page.contains(".TP\n5\n"), "{page}");
    }

    #[test]
    fn completions_offer_no_hidden_command_or_flag() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            completions(shell, &mut script);
            let script = String::from_utf8(script).unwrap();
            for hidden in ["history-budget", "state-dir", "idle-secs"] {
                assert!(!script.contains(hidden), "{shell}: offers {hidden}");
            }
            // Their visible neighbours are still there.
            for visible in [
                "no-speculation",
                "metrics-bind",
                "retry-failed",
                "log-format",
            ] {
                assert!(script.contains(visible), "{shell}: lacks {visible}");
            }
        }
    }

    #[test]
    fn the_top_page_has_every_exit_status() {
        let mut page = Vec::new();
        man_page(&mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains(".SH \"EXIT STATUS\""), "{page}");
        for e in Exit::ALL {
            assert!(page.contains(&format!(".TP\n{}\n", e.code())), "{page}");
        }
        assert_eq!(
            page.matches(".ie \\n(.g").count(),
            1,
            "one preamble: {page}"
        );
        assert!(!page.contains("EXTRA"), "{page}");
    }
}
