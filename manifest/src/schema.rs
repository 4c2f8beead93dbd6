//! JSON Schemas of the manifest formats, generated from the model so they cannot drift.
//!
//! The schemas document shapes and simple bounds for editors and `config schema`; the loader
//! does its own, stricter checks (lines, fixes, runspec paths) and does not use them.

use schemars::{JsonSchema, generate::SchemaSettings};
use serde_json::Value;

use crate::model::{BatchManifest, BatchV1Manifest, RunSpec};

const SCHEMA_BASE: &str = "https://casebatch.dev/schemas";

/// Schema of the YAML/JSON tasks manifest ([`BatchManifest`]).
pub fn batch_schema() -> Value {
    schema_of::<BatchManifest>("batch.json", "casebatch batch manifest")
}

/// Schema of a `schema_version: batch_v1` manifest ([`BatchV1Manifest`]).
pub fn batch_v1_schema() -> Value {
    schema_of::<BatchV1Manifest>("batch_v1.json", "casebatch batch_v1 manifest")
}

/// Schema of one runspec referenced by a batch_v1 case ([`RunSpec`]).
pub fn runspec_schema() -> Value {
    schema_of::<RunSpec>("runspec.json", "casebatch single-run spec")
}

fn schema_of<T: JsonSchema>(file: &str, title: &str) -> Value {
    let generator = SchemaSettings::draft2020_12().into_generator();
    let schema = generator.into_root_schema_for::<T>();
    let mut value = schema.to_value();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("$id".into(), Value::from(format!("{SCHEMA_BASE}/{file}")));
        obj.insert("title".into(), Value::from(title));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        BatchV1, BatchV1Case, Defaults, FakeScript, Resources, Sandbox, SummarySpec, Task,
    };
    use crate::walk::{
        DEFAULTS_FIELDS, FAKE_FIELDS, RESOURCES_FIELDS, RUNSPEC_FIELDS, SANDBOX_FIELDS,
        SUMMARY_FIELDS, TASK_FIELDS,
    };

    #[test]
    fn schema_is_stable_and_identified() {
        let a = batch_schema();
        assert_eq!(a, batch_schema());
        assert_eq!(a["$id"], "https://casebatch.dev/schemas/batch.json");
        assert_eq!(a["title"], "casebatch batch manifest");
        assert!(a["properties"]["tasks"].is_object());
        assert_eq!(a["additionalProperties"], false);
    }

    #[test]
    fn schema_quotes_the_limits() {
        use crate::limits::*;
        let s = batch_schema();
        let defs = &s["$defs"];
        let cases = [
            (
                &defs["Defaults"]["properties"]["timeout_seconds"],
                MAX_TIMEOUT_SECONDS,
            ),
            (
                &defs["Task"]["properties"]["timeout_seconds"],
                MAX_TIMEOUT_SECONDS,
            ),
            (
                &defs["Sandbox"]["properties"]["lifetime"],
                MAX_SANDBOX_LIFETIME_SECONDS,
            ),
            (&defs["Resources"]["properties"]["memory_mb"], MAX_MEMORY_MB),
            (
                &defs["FakeScript"]["properties"]["duration_ms"],
                MAX_FAKE_DURATION_MS,
            ),
            (
                &defs["FakeScript"]["properties"]["infra_failures_first"],
                u64::from(MAX_FAKE_INFRA_FAILURES),
            ),
        ];
        for (field, max) in cases {
            assert_eq!(field["maximum"], max, "{field:#}");
            let description = field["description"].as_str().unwrap_or_default();
            assert!(description.contains(&max.to_string()), "{field:#}");
        }
        let cpu = &defs["Resources"]["properties"]["cpu"];
        assert_eq!(cpu["maximum"], MAX_CPU);
        assert!(defs["Defaults"]["properties"]["env"].is_object());
        assert!(defs["Task"]["properties"]["pass_env"].is_object());
    }

    #[test]
    fn schema_lists_the_sandbox_providers() {
        let s = batch_schema();
        let provider = &s["$defs"]["Sandbox"]["properties"]["provider"];
        assert_eq!(
            provider["enum"],
            serde_json::json!(crate::limits::SANDBOX_PROVIDERS),
            "{provider:#}"
        );
        assert!(
            provider["description"]
                .as_str()
                .unwrap()
                .contains("`local`")
        );
    }

    #[test]
    fn schema_covers_the_runtimes_table() {
        let s = batch_schema();
        let table = &s["properties"]["runtimes"];
        assert_eq!(
            table["propertyNames"]["maxLength"],
            crate::limits::MAX_RUNTIME_NAME_LEN
        );
        assert!(
            table["description"]
                .as_str()
                .unwrap()
                .contains("--runtimes FILE")
        );
        let spec = &s["$defs"]["RuntimeSpec"];
        assert_eq!(spec["additionalProperties"], false);
        assert_eq!(spec["required"], serde_json::json!(["kind"]));
        for field in ["endpoint", "token_env", "token_file", "tls_ca"] {
            assert!(
                spec["properties"][field]["description"].is_string(),
                "{field}"
            );
        }
        let runtime = &s["$defs"]["Task"]["properties"]["runtime"];
        assert!(
            runtime["description"]
                .as_str()
                .unwrap()
                .contains("runtimes:")
        );
        assert!(batch_v1_schema()["properties"]["runtimes"].is_object());
    }

    fn schema_fields<T: JsonSchema>() -> Vec<String> {
        let schema = schemars::schema_for!(T);
        let mut keys: Vec<String> = schema
            .as_value()
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    fn sorted(fields: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    /// The readers (`walk`, `runtimes`, and the shapes) check keys against hand-written field
    /// lists; the schema comes from the model, so it is the one place that can hold all of them.
    #[test]
    fn field_lists_match_the_model() {
        assert_eq!(sorted(DEFAULTS_FIELDS), schema_fields::<Defaults>());
        assert_eq!(sorted(SANDBOX_FIELDS), schema_fields::<Sandbox>());
        assert_eq!(sorted(RESOURCES_FIELDS), schema_fields::<Resources>());
        assert_eq!(sorted(FAKE_FIELDS), schema_fields::<FakeScript>());
        assert_eq!(sorted(SUMMARY_FIELDS), schema_fields::<SummarySpec>());
        assert_eq!(sorted(TASK_FIELDS), schema_fields::<Task>());
        assert_eq!(sorted(RUNSPEC_FIELDS), schema_fields::<RunSpec>());
        assert_eq!(
            sorted(crate::runtimes::ENTRY_FIELDS),
            schema_fields::<crate::model::RuntimeSpec>()
        );
        assert_eq!(
            sorted(crate::yaml::MANIFEST_FIELDS),
            schema_fields::<BatchManifest>()
        );
        assert_eq!(
            sorted(crate::batch_v1::TOP_FIELDS),
            schema_fields::<BatchV1Manifest>()
        );
        assert_eq!(
            sorted(crate::batch_v1::BATCH_FIELDS),
            schema_fields::<BatchV1>()
        );
        assert_eq!(
            sorted(crate::batch_v1::CASE_FIELDS),
            schema_fields::<BatchV1Case>()
        );
    }
}
