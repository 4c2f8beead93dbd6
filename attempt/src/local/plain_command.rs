//! A harness string the shell would only split into words, run without the shell.
//!
//! A manifest's `harness:` runs as `sh -c '<string>'` (see `Command::shell`), under the
//! wrapper, itself a shell. For a string like `python3 run.py --n 3` the inner shell only
//! splits words, finds the program on PATH and execs it, which costs an exec of the shell per
//! attempt: about 0.9 ms of CPU (500 runs of `sleep 0` each way), a tenth of what a short
//! case costs in all. The wrapper runs such a command's words itself instead; its own shell
//! does the same PATH search, with the same exit statuses (126, 127) and the same kind of
//! message naming what was not found.
//!
//! Only strings where that is exactly what `sh -c` does qualify: words of characters that no
//! POSIX shell treats specially, split on blanks, and a first word that is neither an
//! assignment nor any shell's builtin or reserved word (a builtin has no program to exec,
//! or one that behaves differently, like `echo`). Anything else keeps `sh -c`.

/// The words of `argv` when it is `sh -c <plain command>`; `None` to run it as it is.
pub fn words(argv: &[String]) -> Option<Vec<String>> {
    let [sh, c, script] = argv else {
        return None;
    };
    if sh != "sh" || c != "-c" {
        return None;
    }
    let words: Vec<String> = script
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    let first = words.first()?;
    let plain = words.iter().all(|w| w.bytes().all(is_plain_byte))
        && !first.contains('=')
        && (first.contains('/') || !SHELL_WORDS.split_ascii_whitespace().any(|w| w == first));
    plain.then_some(words)
}

/// Bytes no POSIX shell expands, quotes, redirects or splits on (blanks are the separators).
fn is_plain_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_-./,:@+%=".contains(&b)
}

/// Reserved words, POSIX's special and regular builtins, then those dash, bash, ksh and
/// busybox ash add: the builtins and reserved words of the shells `sh` may be. A first word
/// among these is the shell's own, found before any program on PATH (a name with a `/`
/// never is). Utilities a shell may also build in, such as `sleep` or `cat`, are
/// not here: POSIX has a shell run its own only for a program found on PATH, and to behave as
/// that program does (`echo` and `printf`, whose builtins differ in practice, are here).
const SHELL_WORDS: &str = "
    ! case do done elif else esac fi for function if in select then time until while coproc
    . : break continue eval exec exit export readonly return set shift times trap unset
    alias bg cd command false fc fg getopts hash jobs kill newgrp pwd read true type ulimit
    umask unalias wait
    chdir echo local printf test bind builtin caller compgen complete compopt declare dirs
    disown enable help history let logout mapfile popd pushd readarray shopt source suspend
    typeset print whence autoload functions integer nameref
";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn a_program_and_its_arguments_are_run_without_the_shell() {
        for (script, expected) in [
            (
                "python3 run.py --n 3",
                &["python3", "run.py", "--n", "3"][..],
            ),
            ("./run.sh", &["./run.sh"]),
            ("sleep 1", &["sleep", "1"]),
            (
                " uv  run\tagent.py --model=gpt-4o-mini ",
                &["uv", "run", "agent.py", "--model=gpt-4o-mini"],
            ),
            ("/bin/echo a,b:c@d+e%f", &["/bin/echo", "a,b:c@d+e%f"]),
        ] {
            assert_eq!(words(&sh(script)).unwrap(), expected, "{script}");
        }
    }

    #[test]
    fn what_the_shell_would_do_more_with_keeps_the_shell() {
        for script in [
            // Builtins and reserved words, which have no program (or another one).
            "true",
            "exit 3",
            "echo hi",
            "cd /tmp",
            "export A=1",
            "if",
            "source env.sh",
            // An assignment, expansions, quotes, globs, redirections, lists, comments.
            "A=1 run",
            "run $HOME",
            "run \"a b\"",
            "run 'a'",
            "run *.json",
            "run a?",
            "run [ab]",
            "run ~/x",
            "run > out",
            "run < in",
            "run | tee",
            "run && more",
            "run; more",
            "run &",
            "run # note",
            "run `x`",
            "run \\a",
            "(run)",
            "run {a,b}",
            "run !x",
            "run\nmore",
            "rün",
            // Nothing to run.
            "",
            "  ",
        ] {
            assert_eq!(words(&sh(script)), None, "{script:?}");
        }
        // Not a shell command string at all: an argv is run as it is.
        assert_eq!(words(&["python3".into(), "run.py".into()]), None);
        assert_eq!(words(&["bash".into(), "-c".into(), "run".into()]), None);
    }

    /// For every string taken, the words are the ones the real shell splits it into.
    fn split_by_the_shell(script: &str) -> Vec<String> {
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("set -- {script}; printf '%s\\0' \"$@\""))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout
            .split(|b| *b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8(w.to_vec()).unwrap())
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn the_words_taken_are_the_shells_own(script in "[a-z./][a-zA-Z0-9_./,:@+%=-]{0,8}([ \t]{1,2}[a-zA-Z0-9_./,:@+%=-]{1,8}){0,4}") {
            if let Some(w) = words(&sh(&script)) {
                prop_assert_eq!(w, split_by_the_shell(&script));
            }
        }
    }
}
