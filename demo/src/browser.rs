//! The system's Chromium, found and started headless. Nothing is downloaded: a browser is
//! used only when one is installed (Debian: `apt-get install chromium`).

use std::path::{Path, PathBuf};

/// Names a browser binary explicitly (a path, or a name on `PATH`).
pub const BROWSER_ENV: &str = "CASEBATCH_BROWSER";

/// Looked up on `PATH` in this order when [`BROWSER_ENV`] is not set.
const CANDIDATES: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];

/// The browser to use: `CASEBATCH_BROWSER` when set, else the first candidate on `PATH`.
pub fn find() -> Option<PathBuf> {
    match std::env::var_os(BROWSER_ENV) {
        Some(named) if !named.is_empty() => on_path(Path::new(&named)),
        _ => CANDIDATES.iter().find_map(|c| on_path(Path::new(c))),
    }
}

fn on_path(name: &Path) -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.components().count() > 1 {
        return executable(name).then(|| name.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
}

/// Flags for a headless start with its own profile in `user_data_dir`. The background
/// services are off: they would reach for the network, which a batch host may not have, and
/// they are nothing the task asked for. The sandbox is off because it needs user namespaces
/// that containers (and root) often lack; the pages opened are the caller's own.
pub fn headless_args(user_data_dir: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--hide-scrollbars",
        "--mute-audio",
    ]
    .into_iter()
    .map(String::from)
    .chain([format!("--user-data-dir={}", user_data_dir.display())])
    .collect()
}
