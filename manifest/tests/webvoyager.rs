//! The real WebVoyager dataset (643 records, ids with spaces) plans as a JSONL manifest.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;

use casebatch_manifest::{LoadOptions, ManifestFormat, RuntimeKind, is_safe_case_dir, load_plan};

fn dataset() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/datasets/webvoyager/WebVoyager_data.jsonl")
}

fn with_harness() -> LoadOptions {
    let mut opts = LoadOptions::default();
    opts.overrides.harness = Some(casebatch_manifest::CommandSpec::Shell(
        "python3 agent.py".into(),
    ));
    opts
}

#[test]
fn webvoyager_plans_to_643_distinct_safe_case_dirs() {
    let plan = load_plan(&dataset(), &with_harness()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.provenance.format, ManifestFormat::Jsonl);
    assert_eq!(plan.batch_id, "WebVoyager_data");
    assert_eq!(plan.cases.len(), 643);

    let dirs: HashSet<&str> = plan.cases.iter().map(|c| c.case_dir.as_str()).collect();
    assert_eq!(dirs.len(), 643, "case_dir values collide");
    let lower: HashSet<String> = dirs.iter().map(|d| d.to_lowercase()).collect();
    assert_eq!(
        lower.len(),
        643,
        "case_dir values collide on a case-insensitive filesystem"
    );
    for case in &plan.cases {
        assert!(
            is_safe_case_dir(&case.case_dir),
            "{:?} -> {:?}",
            case.case_id,
            case.case_dir
        );
    }

    let ids: HashSet<&str> = plan.cases.iter().map(|c| c.case_id.as_str()).collect();
    assert_eq!(ids.len(), 643);
    assert!(ids.contains("Allrecipes--0"));
    let spaced = plan
        .cases
        .iter()
        .find(|c| c.case_id == "BBC News--0")
        .expect("ids with spaces are kept as they are");
    assert!(
        spaced.case_dir.starts_with("BBC_News--0-"),
        "{}",
        spaced.case_dir
    );

    let first = &plan.cases[0];
    assert_eq!(
        first.case_dir, "Allrecipes--0",
        "safe ids are used unchanged"
    );
    assert_eq!(first.runtime, RuntimeKind::LocalProcess);
    assert_eq!(first.input["url"], "https://www.allrecipes.com/");
    assert_eq!(first.input["web_name"], "Allrecipes");
    assert!(
        first.input["query"]
            .as_str()
            .unwrap()
            .starts_with("Provide a recipe")
    );
    assert_eq!(first.source.line, Some(1));
    assert_eq!(plan.cases.iter().map(|c| c.index).max(), Some(642));
}

#[test]
fn webvoyager_fingerprint_is_stable() {
    let a = load_plan(&dataset(), &with_harness()).unwrap();
    let b = load_plan(&dataset(), &with_harness()).unwrap();
    assert_eq!(a.fingerprint, b.fingerprint);
    assert_eq!(a, b);
}

#[test]
fn webvoyager_without_a_harness_is_one_problem_not_643() {
    let err = load_plan(&dataset(), &LoadOptions::default()).unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    assert_eq!(err.problems[0].field, "defaults.harness");
}
