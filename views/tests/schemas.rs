//! One snapshot per `config schema --kind`: a change to any `--json` shape shows in review.

use casebatch_views::ViewKind;

#[test]
fn every_kind_has_a_reviewed_schema() {
    for kind in ViewKind::ALL {
        let schema = serde_json::to_string_pretty(&kind.schema()).expect("serializes");
        insta::assert_snapshot!(kind.name(), schema);
    }
}

#[test]
fn every_view_schema_documents_its_fields() {
    for kind in ViewKind::ALL.into_iter().filter(|k| *k != ViewKind::Batch) {
        let schema = kind.schema();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema",
            "{}",
            kind.name()
        );
        assert!(schema["title"].is_string(), "{} has no title", kind.name());
    }
}
