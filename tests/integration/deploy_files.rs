//! What the repository's deploy scripts may name: no package mirror or registry host (issue
//! 32). The drill fetches through each tool's default mirror, or one named in a variable at
//! run time, so nothing in the repository pins where packages come from.

use std::path::{Path, PathBuf};

/// The deploy drill and the files it runs, relative to the workspace.
fn drill_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("scripts/deploy-drill.sh")];
    let dir = root.join("scripts/deploy-drill");
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        files.push(entry.unwrap().path());
    }
    files
}

/// The host of every `scheme://host` in `text` that is written out (not a variable, not
/// loopback, not a compose service's bare name), with its line.
fn named_hosts(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("://") {
            let host: String = line[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '$' | '{'))
                .collect();
            let written_out = host.contains('.')
                && !host.contains('$')
                && !host.starts_with("127.")
                && host.parse::<std::net::Ipv4Addr>().is_err();
            if written_out {
                found.push((n + 1, host));
            }
        }
    }
    found
}

#[test]
fn the_deploy_drill_names_no_mirror_host() {
    let mut named = Vec::new();
    for file in drill_files() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (line, host) in named_hosts(&text) {
            named.push(format!("{}:{line}: {host}", file.display()));
        }
    }
    assert!(
        named.is_empty(),
        "the drill names hosts; use the tool's default mirror or a variable:\n{}",
        named.join("\n")
    );
}

#[test]
fn a_mirror_url_is_found_and_a_variable_is_not() {
    let text = "debootstrap bookworm /r http://deb.example.org/debian\n\
                debootstrap bookworm /r ${MIRROR:+\"$MIRROR\"}\n\
                curl http://$ADDR/x http://127.0.0.1:8233 unix://$dir/podman.sock\n";
    assert_eq!(named_hosts(text), [(1, "deb.example.org".to_string())]);
}
