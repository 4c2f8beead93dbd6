//! The program a harness or evaluator command starts, when it is written as a path: resolved
//! against the directory of the file that names it, and checked before anything runs.
//!
//! A command's program is a path when it contains a `/`: `argv[0]` of a list, or the first
//! word of a `sh -c` string when that word is plain (no quotes, variables, globs, `~` or
//! assignment), such as `./run.sh --fast`. Anything else (`python3 eval.py`, `printf ... >
//! "$CASEBATCH_RESULT"`, `"$HOME/x"`) is left to the shell, as written. A relative path is
//! made absolute against the directory of the manifest (or defaults file, or runspec) that
//! wrote it, or the current directory for a `--harness`/`--evaluator` flag: an attempt runs in
//! a fresh directory of its own, where a relative path names nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::model::CommandSpec;

/// A command whose program is a path: the path as written, and the path it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Program {
    pub(crate) written: String,
    pub(crate) path: PathBuf,
}

/// The program of `command` when it is written as a path, resolved against `base`.
pub(crate) fn program(command: &CommandSpec, base: &Path) -> Option<Program> {
    let written = match command {
        CommandSpec::Argv(argv) => argv.first()?.clone(),
        CommandSpec::Shell(script) => first_word(script)?.1.to_string(),
    };
    if !written.contains('/') {
        return None;
    }
    let path = absolute(base, &written);
    Some(Program { written, path })
}

/// `command` with a relative program made absolute against `base` (unchanged otherwise).
pub(crate) fn resolve(command: &CommandSpec, base: &Path) -> CommandSpec {
    let Some(program) = program(command, base) else {
        return command.clone();
    };
    if program.written.starts_with('/') {
        return command.clone();
    }
    let absolute = program.path.display().to_string();
    match command {
        CommandSpec::Argv(argv) => {
            let mut argv = argv.clone();
            argv[0] = absolute;
            CommandSpec::Argv(argv)
        }
        CommandSpec::Shell(script) => {
            let Some((at, word)) = first_word(script) else {
                return command.clone();
            };
            let mut out = String::with_capacity(script.len() + absolute.len());
            out.push_str(&script[..at]);
            out.push_str(&shell_quote(&absolute));
            out.push_str(&script[at + word.len()..]);
            CommandSpec::Shell(out)
        }
    }
}

/// What is wrong with a program path, as (message, fix); `None` when it can be executed.
pub(crate) fn check(program: &Program) -> Option<(String, String)> {
    let shown = if program.written.starts_with('/') {
        program.written.clone()
    } else {
        format!("{} ({})", program.written, program.path.display())
    };
    let path = program.path.display();
    match std::fs::metadata(&program.path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some((
            format!("program {shown} does not exist"),
            format!(
                "create {path}, or correct the path (a relative path is resolved against the \
                 directory of the file that names it)"
            ),
        )),
        Err(e) => Some((
            format!("program {shown} cannot be read: {e}"),
            format!("make {path} and its directories readable by the user that runs casebatch"),
        )),
        Ok(m) if m.is_dir() => Some((
            format!("program {shown} is a directory"),
            "name the program file itself".to_string(),
        )),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Some((
            format!(
                "program {shown} is not executable (mode {:o})",
                m.permissions().mode() & 0o777
            ),
            format!("make it executable: chmod +x {path}"),
        )),
        Ok(_) => None,
    }
}

/// The first word of a shell script and where it starts, when it is a plain word: only
/// characters the shell takes literally, and not a variable assignment.
fn first_word(script: &str) -> Option<(usize, &str)> {
    let start = script.len() - script.trim_start().len();
    let rest = &script[start..];
    let end = rest
        .find(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | '|' | '<' | '>' | '(' | ')'))
        .unwrap_or(rest.len());
    let word = &rest[..end];
    let plain = !word.is_empty() && word.chars().all(is_literal);
    plain.then_some((start, word))
}

/// A character the shell takes literally in any position of a word (`=` is left out: a word
/// with it may be an assignment, `~` expands at the start).
fn is_literal(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+' | ',' | ':' | '@' | '%')
}

fn absolute(base: &Path, written: &str) -> PathBuf {
    let joined = base.join(written);
    std::path::absolute(&joined).unwrap_or(joined)
}

/// `s` as one shell word: as is when every character is literal, else single-quoted.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(is_literal) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(s: &str) -> CommandSpec {
        CommandSpec::Shell(s.into())
    }

    #[test]
    fn only_a_plain_first_word_with_a_slash_is_a_program_path() {
        let base = Path::new("/m");
        let path = |c: &CommandSpec| program(c, base).map(|p| p.path);
        assert_eq!(path(&shell("./run.sh --x")), Some("/m/run.sh".into()));
        assert_eq!(path(&shell("  bin/x;true")), Some("/m/bin/x".into()));
        assert_eq!(path(&shell("/opt/h arg")), Some("/opt/h".into()));
        let argv = CommandSpec::Argv(vec!["../h".into(), "a b".into()]);
        assert_eq!(path(&argv), Some("/m/../h".into()));
        for left_to_the_shell in [
            "printf '{}' > \"$CASEBATCH_RESULT\"",
            "python3 ./eval.py",
            "\"$SANDBOX/run.sh\"",
            "$HOME/run.sh",
            "~/run.sh",
            "FOO=a/b ./run.sh",
            "'./quoted.sh'",
            "./*.sh",
            "",
        ] {
            assert_eq!(path(&shell(left_to_the_shell)), None, "{left_to_the_shell}");
        }
        assert_eq!(path(&CommandSpec::Argv(vec!["python3".into()])), None);
    }

    #[test]
    fn a_relative_program_is_rewritten_absolute_and_the_rest_kept() {
        let base = Path::new("/m d");
        assert_eq!(
            resolve(&shell("  ./run.sh --x > out"), base),
            shell("  '/m d/run.sh' --x > out")
        );
        assert_eq!(
            resolve(&shell("./run.sh"), Path::new("/m")),
            shell("/m/run.sh")
        );
        assert_eq!(
            resolve(
                &CommandSpec::Argv(vec!["bin/x".into(), "./y".into()]),
                Path::new("/m")
            ),
            CommandSpec::Argv(vec!["/m/bin/x".into(), "./y".into()])
        );
        for unchanged in ["/abs/run.sh a", "echo ./x", "\"$X/y\""] {
            assert_eq!(resolve(&shell(unchanged), base), shell(unchanged));
        }
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn missing_directory_and_unexecutable_programs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| program(&shell(&format!("./{name}")), dir.path()).unwrap();
        let missing = check(&at("nope.sh")).unwrap();
        assert!(missing.0.contains("does not exist"), "{missing:?}");
        assert!(missing.0.contains("./nope.sh ("), "{missing:?}");

        std::fs::create_dir(dir.path().join("d")).unwrap();
        assert!(check(&at("d")).unwrap().0.contains("is a directory"));

        let file = dir.path().join("run.sh");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (message, fix) = check(&at("run.sh")).unwrap();
        assert!(message.contains("not executable (mode 644)"), "{message}");
        assert!(fix.contains("chmod +x"), "{fix}");

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(check(&at("run.sh")), None);
    }
}
