//! A case's harness input (`CASEBATCH_INPUT`): a few named JSON values, kept as a sorted list.
//!
//! A `BTreeMap` allocates a node for eleven entries even when it holds one: 632 bytes per case,
//! 63 MB of a 100,000-case plan whose inputs are a task id. The list holds what is there, and
//! reads, writes and fingerprints exactly as the map did (a JSON object, keys in order).

use std::collections::BTreeMap;
use std::ops::Index;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Named input values, sorted by name, each name once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inputs(Box<[(String, Value)]>);

impl Inputs {
    pub fn get(&self, name: &str) -> Option<&Value> {
        let at = self
            .0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()?;
        Some(&self.0[at].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// As a JSON object (what the harness reads).
    pub fn into_object(self) -> serde_json::Map<String, Value> {
        self.0.into_vec().into_iter().collect()
    }
}

impl From<BTreeMap<String, Value>> for Inputs {
    fn from(map: BTreeMap<String, Value>) -> Self {
        // A map iterates in key order with no repeats: already what the list must be.
        Inputs(map.into_iter().collect())
    }
}

/// A missing name panics, as a map's index does.
impl Index<&str> for Inputs {
    type Output = Value;

    fn index(&self, name: &str) -> &Value {
        self.get(name)
            .unwrap_or_else(|| panic!("no input named `{name}`"))
    }
}

impl Serialize for Inputs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de> Deserialize<'de> for Inputs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::deserialize(d).map(Inputs::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inputs_read_and_write_as_the_json_object_they_replace() {
        let written = r#"{"url":"u","max_steps":3,"nested":{"b":[1],"a":null},"query":"q"}"#;
        let inputs: Inputs = serde_json::from_str(written).unwrap();
        let map: BTreeMap<String, Value> = serde_json::from_str(written).unwrap();
        // Keys in order, as the map wrote them: the plan file and the fingerprint stay the same.
        assert_eq!(
            serde_json::to_string(&inputs).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        assert_eq!(inputs.len(), 4);
        assert_eq!(inputs["max_steps"], 3);
        assert_eq!(inputs.get("nested"), Some(&json!({"a": null, "b": [1]})));
        assert_eq!(inputs.get("absent"), None);
        assert_eq!(
            inputs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            ["max_steps", "nested", "query", "url"]
        );
        assert_eq!(
            Value::Object(inputs.into_object()),
            serde_json::to_value(&map).unwrap()
        );
    }
}
