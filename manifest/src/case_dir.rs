//! Case directory names: a filesystem-safe, collision-free form of each case id.
//!
//! Real ids contain spaces, slashes and other characters that are unsafe or ambiguous in
//! paths. The name keeps `[A-Za-z0-9._-]`, replaces everything else with `_`, drops leading
//! dots and is cut to [`MAX_CASE_DIR_LEN`]. Whenever that changed the id, or the name is
//! already taken, a short sha256 of the id is appended so that ids that sanitize alike
//! (`a b` and `a/b`) still get distinct directories; the hash grows if even that collides.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

/// Longest directory name produced.
pub const MAX_CASE_DIR_LEN: usize = 80;
/// Hex characters of the id's hash appended on the first try.
const SHORT_HASH: usize = 8;

/// A directory name for `case_id` that is not yet in `taken`, which it is then added to.
///
/// `taken` holds the lower-cased form of every name handed out, so names also stay distinct
/// on case-insensitive filesystems (macOS, Windows). Deterministic for the same sequence of
/// ids.
pub fn case_dir_name(case_id: &str, taken: &mut HashSet<String>) -> String {
    let sanitized = sanitize(case_id);
    if sanitized == case_id && !sanitized.is_empty() && taken.insert(sanitized.to_lowercase()) {
        return sanitized;
    }
    let hash = hex::encode(Sha256::digest(case_id.as_bytes()));
    let stem = if sanitized.is_empty() {
        "case"
    } else {
        sanitized.as_str()
    };
    let mut len = SHORT_HASH;
    loop {
        let name = with_suffix(stem, &hash[..len]);
        if taken.insert(name.to_lowercase()) {
            return name;
        }
        if len == hash.len() {
            break;
        }
        len = (len + SHORT_HASH).min(hash.len());
    }
    // Only reachable if someone else took names carrying this id's full hash.
    (2u64..)
        .map(|n| with_suffix(stem, &format!("{}-{n}", &hash[..SHORT_HASH])))
        .find(|name| taken.insert(name.to_lowercase()))
        .unwrap_or_default()
}

/// `stem-suffix`, with the stem shortened so the whole stays within the limit.
fn with_suffix(stem: &str, suffix: &str) -> String {
    let room = MAX_CASE_DIR_LEN.saturating_sub(suffix.len() + 1).max(1);
    let stem: String = stem.chars().take(room).collect();
    format!("{stem}-{suffix}")
}

/// Keep `[A-Za-z0-9._-]`, map the rest to `_`, strip leading dots, cap the length.
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| if is_safe(c) { c } else { '_' })
        .skip_while(|c| *c == '.')
        .take(MAX_CASE_DIR_LEN)
        .collect()
}

fn is_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Whether `name` could have come from [`case_dir_name`]: safe characters only, no leading
/// dot, not empty, not too long.
pub fn is_safe_case_dir(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_CASE_DIR_LEN
        && !name.starts_with('.')
        && name.chars().all(is_safe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn safe_ids_are_kept() {
        let mut taken = HashSet::new();
        assert_eq!(case_dir_name("Allrecipes--0", &mut taken), "Allrecipes--0");
    }

    #[test]
    fn unsafe_ids_get_a_hash() {
        let mut taken = HashSet::new();
        let a = case_dir_name("BBC News--1", &mut taken);
        let b = case_dir_name("BBC/News--1", &mut taken);
        assert!(a.starts_with("BBC_News--1-"), "{a}");
        assert_eq!(a.len(), "BBC_News--1-".len() + 8);
        assert_ne!(a, b);
        assert!(is_safe_case_dir(&a) && is_safe_case_dir(&b));
    }

    #[test]
    fn collisions_with_a_safe_id_are_resolved() {
        let mut taken = HashSet::new();
        let a = case_dir_name("a b", &mut taken);
        // An id equal to the previous *name* must not reuse it.
        let b = case_dir_name(&a, &mut taken);
        assert_ne!(a, b);
        // Same id twice (a duplicate, reported elsewhere) still gets two directories.
        let c = case_dir_name("x", &mut taken);
        let d = case_dir_name("x", &mut taken);
        assert_ne!(c, d);
        // Case-insensitive filesystems.
        let e = case_dir_name("X", &mut taken);
        assert_ne!(e.to_lowercase(), c.to_lowercase());
    }

    #[test]
    fn dots_empty_and_long_ids() {
        let mut taken = HashSet::new();
        for id in [
            "",
            ".",
            "..",
            "...hidden",
            "/",
            &"é".repeat(300),
            &"a".repeat(300),
        ] {
            let name = case_dir_name(id, &mut taken);
            assert!(is_safe_case_dir(&name), "{id:?} -> {name:?}");
        }
    }

    proptest! {
        #[test]
        fn distinct_ids_give_distinct_safe_names(ids in prop::collection::hash_set(".{0,100}", 1..60)) {
            let mut taken = HashSet::new();
            let mut seen = HashSet::new();
            for id in &ids {
                let name = case_dir_name(id, &mut taken);
                prop_assert!(is_safe_case_dir(&name), "{:?} -> {:?}", id, name);
                prop_assert!(seen.insert(name.to_lowercase()), "{:?} collided", id);
            }
        }

        #[test]
        fn near_identical_ids_stay_distinct(base in "[a-z ]{0,10}", n in 1usize..40) {
            // Ids that differ only in characters that all sanitize to `_`.
            let seps = [" ", "/", "\\", ":", "*", "?", "\n", "é"];
            let ids: HashSet<String> = (0..n).map(|i| format!("{base}{}{i}", seps[i % seps.len()])).collect();
            let mut taken = HashSet::new();
            let mut seen = HashSet::new();
            for id in &ids {
                let name = case_dir_name(id, &mut taken);
                prop_assert!(is_safe_case_dir(&name));
                prop_assert!(seen.insert(name));
            }
        }
    }
}
