//! What identifies an attempt's containers on the engine: a name derived from the attempt
//! (so every stage, on any worker, finds the same container again) and labels that say whose
//! it is (so `sandbox gc` and supersede find them without trusting names alone).

use std::collections::HashMap;

use casebatch_attempt::Attempt;
use sha2::{Digest, Sha256};

/// Label keys, under one prefix so that a filter `label=io.casebatch.marker` finds only ours.
pub mod label {
    pub const BATCH_ID: &str = "io.casebatch.batch-id";
    pub const CASE_ID: &str = "io.casebatch.case-id";
    pub const ATTEMPT: &str = "io.casebatch.attempt";
    pub const MARKER: &str = "io.casebatch.marker";
    /// The bundle directory the attempt belongs to: ownership is proved by the bundle.
    pub const BUNDLE: &str = "io.casebatch.bundle";
    /// The attempt's directory: `sandbox gc` reads there whether the attempt is closed.
    pub const ATTEMPT_DIR: &str = "io.casebatch.attempt-dir";
    pub const ROLE: &str = "io.casebatch.role";
    pub const OWNER: &str = "io.casebatch.owner";
}

/// Which of an attempt's containers: the harness's, or the evaluator's beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Actor,
    Evaluator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Actor => "actor",
            Role::Evaluator => "evaluator",
        }
    }
}

/// `cb-<batch>-<case dir>-a<attempt>-<8 hex>`: readable in `docker ps`, and unique per
/// bundle, since two bundles may hold batches of the same id (the hash covers the bundle
/// directory and the marker). The evaluator's container adds `-eval`.
pub fn container_name(attempt: &Attempt, role: Role) -> String {
    let mut hash = Sha256::new();
    hash.update(attempt.key.bundle_dir.as_bytes());
    hash.update([0]);
    hash.update(attempt.marker().as_bytes());
    let digest = hash.finalize();
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let name = format!(
        "cb-{}-{}-a{}-{short}",
        component(&attempt.key.batch_id, 40),
        component(&attempt.job.case_dir, 60),
        attempt.key.attempt
    );
    match role {
        Role::Actor => name,
        Role::Evaluator => format!("{name}-eval"),
    }
}

/// `s` in the characters a container name allows (`[a-zA-Z0-9_.-]`), at most `max` of them.
fn component(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(max)
        .collect()
}

/// Who this process runs as: `$USER`, else the uid.
pub fn owner() -> String {
    std::env::var("USER").unwrap_or_else(|_| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").map_or_else(|_| "unknown".into(), |m| m.uid().to_string())
    })
}

/// The labels of one of the attempt's containers.
pub fn labels(attempt: &Attempt, role: Role) -> HashMap<String, String> {
    HashMap::from([
        (label::BATCH_ID.into(), attempt.key.batch_id.clone()),
        (label::CASE_ID.into(), attempt.job.case_id.clone()),
        (label::ATTEMPT.into(), attempt.key.attempt.to_string()),
        (label::MARKER.into(), attempt.marker()),
        (label::BUNDLE.into(), attempt.key.bundle_dir.clone()),
        (label::ATTEMPT_DIR.into(), attempt.dir.display().to_string()),
        (label::ROLE.into(), role.as_str().into()),
        (label::OWNER.into(), owner()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use casebatch_proto::AttemptKey;
    use casebatch_proto::runtime_v1::JobSpec;

    fn attempt(bundle: &str, batch: &str, case_dir: &str, n: u32) -> Attempt {
        let key = AttemptKey {
            batch_id: batch.into(),
            bundle_dir: bundle.into(),
            case_index: 3,
            attempt: n,
            memory_boost_mb: None,
            runtime: None,
        };
        let job = JobSpec {
            case_id: "task/7".into(),
            case_dir: case_dir.into(),
            ..JobSpec::default()
        };
        Attempt::new(key, job)
    }

    #[test]
    fn a_name_is_the_attempts_own_and_valid_for_the_engine() {
        let a = attempt("/b/one", "web voyager", "0003-task_7", 2);
        let name = container_name(&a, Role::Actor);
        assert!(name.starts_with("cb-web-voyager-0003-task_7-a2-"), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        );
        assert_eq!(name, container_name(&a, Role::Actor), "stable");
        assert_eq!(container_name(&a, Role::Evaluator), format!("{name}-eval"));
        // Another attempt, or the same batch id in another bundle, is another container.
        assert_ne!(
            name,
            container_name(
                &attempt("/b/one", "web voyager", "0003-task_7", 3),
                Role::Actor
            )
        );
        assert_ne!(
            name,
            container_name(
                &attempt("/b/two", "web voyager", "0003-task_7", 2),
                Role::Actor
            )
        );
    }

    #[test]
    fn labels_carry_the_attempts_identity() {
        let a = attempt("/b/one", "wv", "0003-x", 1);
        let l = labels(&a, Role::Evaluator);
        assert_eq!(l[label::MARKER], "wv/3/1");
        assert_eq!(l[label::CASE_ID], "task/7");
        assert_eq!(l[label::BUNDLE], "/b/one");
        assert_eq!(l[label::ROLE], "evaluator");
    }
}
