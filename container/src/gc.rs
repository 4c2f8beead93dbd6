//! `casebatch sandbox gc`: the containers casebatch left on this host's engine that nothing
//! will clean up any more. A dry run by default (a maintenance operation lists first).
//!
//! A container is garbage when its bundle directory is gone, or its attempt is closed (its
//! `cleanup.json` exists: cleanup ran and could not remove it). Anything else may still be
//! waited on or adopted, and is kept. Only containers labelled with this user as their owner
//! are ever removed: on a shared host, another user's are listed and left alone.

use std::collections::HashMap;
use std::path::Path;

use bollard::query_parameters::ListContainersOptions;
use casebatch_runtime::attempt_files;
use serde::Serialize;

use crate::engine;
use crate::names::{label, owner};

/// One container labelled by casebatch, and what gc makes of it.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub name: String,
    pub id: String,
    pub marker: String,
    pub bundle: String,
    pub state: String,
    /// `bundle_gone`, `attempt_closed`, `in_use` or `not_yours`.
    pub verdict: &'static str,
    /// True when this run removed it (`--apply`, and garbage).
    pub removed: bool,
}

impl Found {
    pub fn is_garbage(&self) -> bool {
        matches!(self.verdict, "bundle_gone" | "attempt_closed")
    }
}

fn verdict(labels: &HashMap<String, String>, me: &str) -> &'static str {
    let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or_default();
    if get(label::OWNER) != me {
        return "not_yours";
    }
    if !Path::new(get(label::BUNDLE)).is_dir() {
        return "bundle_gone";
    }
    let dir = Path::new(get(label::ATTEMPT_DIR));
    if dir.join(attempt_files::CLEANUP).exists() {
        return "attempt_closed";
    }
    "in_use"
}

/// Lists casebatch's containers on the engine, removing the garbage when `apply`.
pub async fn gc(apply: bool) -> Result<Vec<Found>, String> {
    let docker = engine::connect().await.map_err(|e| {
        format!(
            "the container engine at {} did not answer: {e}",
            engine::address()
        )
    })?;
    let options = ListContainersOptions {
        all: true,
        filters: Some(HashMap::from([(
            "label".to_string(),
            vec![label::MARKER.to_string()],
        )])),
        ..ListContainersOptions::default()
    };
    let listed = docker
        .list_containers(Some(options))
        .await
        .map_err(|e| format!("listing containers failed: {e}"))?;
    let me = owner();
    let mut found = Vec::new();
    for c in listed {
        let labels = c.labels.unwrap_or_default();
        let name = c
            .names
            .and_then(|n| n.into_iter().next())
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string();
        let mut entry = Found {
            id: c.id.unwrap_or_default(),
            marker: labels.get(label::MARKER).cloned().unwrap_or_default(),
            bundle: labels.get(label::BUNDLE).cloned().unwrap_or_default(),
            state: c.state.map(|s| s.to_string()).unwrap_or_default(),
            verdict: verdict(&labels, &me),
            removed: false,
            name,
        };
        if apply && entry.is_garbage() {
            entry.removed = crate::remove(&docker, &entry.id)
                .await
                .map_err(|e| format!("removing {} failed: {e}", entry.name))?
                .is_some_and(|f| f.removed);
        }
        found.push(entry);
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}
