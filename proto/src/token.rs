//! Where a bearer token is read from, for both ends of the agent's wire: the agent
//! (`--token-env VAR` / `--token-file PATH`) and the worker (a runtimes-table entry's
//! `token_env` / `token_file`). One type, one set of checks: a variable must be set, UTF-8
//! and hold a token; a file must be readable and hold one; the token is what is left once the
//! whitespace around it (a file's trailing newline) is trimmed, and it must be printable ASCII
//! without spaces, since it travels in an HTTP header. Errors say where the token was looked
//! for, never what it is.

use std::path::PathBuf;

/// Where a bearer token is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// An environment variable of the reading process: its name.
    Env(String),
    /// A file: its path.
    File(PathBuf),
}

/// Why no token could be read, worded without the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenError(String);

impl TokenSource {
    /// `$NAME` or `file PATH`: where the token comes from, for messages.
    pub fn describe(&self) -> String {
        match self {
            TokenSource::Env(name) => format!("${name}"),
            TokenSource::File(path) => format!("file {}", path.display()),
        }
    }

    /// The setting that names this source, as `flags` spells its two keys: `("--token-env",
    /// "--token-file")` for the agent's command line, `("token_env", "token_file")` for a
    /// runtimes-table entry.
    pub fn setting(&self, flags: (&str, &str)) -> String {
        match self {
            TokenSource::Env(name) => format!("{} {name}", flags.0),
            TokenSource::File(path) => format!("{} {}", flags.1, path.display()),
        }
    }

    /// Reads the token now (a rotated file or Secret is picked up by the next read). `Err`
    /// starts with [`TokenSource::setting`] in `flags`' spelling and says what is wrong.
    pub fn read(&self, flags: (&str, &str)) -> Result<String, TokenError> {
        let at = self.setting(flags);
        let raw = match self {
            TokenSource::Env(name) => {
                if name.is_empty() || name.contains('=') || name.contains('\0') {
                    return Err(TokenError(format!(
                        "{} takes the name of an environment variable, not {name:?}",
                        flags.0
                    )));
                }
                std::env::var(name).map_err(|_| {
                    TokenError(format!(
                        "{at}: the variable is not set (or not UTF-8) in this process's \
                         environment; export the token there"
                    ))
                })?
            }
            TokenSource::File(path) => std::fs::read_to_string(path)
                .map_err(|e| TokenError(format!("{at}: failed to read the token: {e}")))?,
        };
        // A file usually ends with a newline; the token is what is around it.
        let token = raw.trim();
        if token.is_empty() {
            return Err(TokenError(format!("{at}: the token is empty")));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError(format!(
                "{at}: the token must be printable ASCII without spaces (it travels in an \
                 HTTP header)"
            )));
        }
        Ok(token.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: (&str, &str) = ("--token-env", "--token-file");
    const TABLE: (&str, &str) = ("token_env", "token_file");

    #[test]
    fn a_file_token_is_trimmed_of_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  s3cret-value\n").unwrap();
        let source = TokenSource::File(file.clone());
        assert_eq!(source.read(FLAGS).unwrap(), "s3cret-value");
        assert_eq!(source.describe(), format!("file {}", file.display()));
        assert_eq!(
            source.setting(TABLE),
            format!("token_file {}", file.display())
        );
    }

    #[test]
    fn errors_name_the_setting_and_never_the_token() {
        let dir = tempfile::tempdir().unwrap();
        // A name no test sets: the variable is read from the real environment.
        let unset = TokenSource::Env("CASEBATCH_TEST_TOKEN_NEVER_SET_4711".into());
        let m = unset.read(TABLE).unwrap_err().to_string();
        assert!(
            m.starts_with("token_env CASEBATCH_TEST_TOKEN_NEVER_SET_4711:")
                && m.contains("not set"),
            "{m}"
        );
        let m = unset.read(FLAGS).unwrap_err().to_string();
        assert!(m.starts_with("--token-env CASEBATCH_TEST"), "{m}");

        let m = TokenSource::Env("A=b".into())
            .read(FLAGS)
            .unwrap_err()
            .to_string();
        assert!(m.contains("the name of an environment variable"), "{m}");

        let missing = TokenSource::File(dir.path().join("absent"));
        let m = missing.read(TABLE).unwrap_err().to_string();
        assert!(m.contains("token_file") && m.contains("absent"), "{m}");

        let blank = dir.path().join("blank");
        std::fs::write(&blank, " \n").unwrap();
        let m = TokenSource::File(blank.clone())
            .read(FLAGS)
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("the token is empty") && m.contains(&blank.display().to_string()),
            "{m}"
        );

        let two_lines = dir.path().join("two-lines");
        std::fs::write(&two_lines, "line1\nline2-secret\n").unwrap();
        let m = TokenSource::File(two_lines)
            .read(TABLE)
            .unwrap_err()
            .to_string();
        assert!(m.contains("printable ASCII without spaces"), "{m}");
        assert!(!m.contains("secret"), "the token leaked into {m}");
    }
}
