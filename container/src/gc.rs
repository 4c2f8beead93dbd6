//! `casebatch sandbox gc`: the containers casebatch left on this host's engine that nothing
//! will clean up any more. A dry run by default (a maintenance operation lists first).
//!
//! A container is garbage when its bundle directory is gone, or its attempt is closed (its
//! journal has a cleanup receipt: cleanup ran and could not remove it). Anything else may still be
//! waited on or adopted, and is kept. Only containers labelled with this user as their owner
//! are ever removed: on a shared host, another user's are listed and left alone.

use std::collections::HashMap;
use std::path::Path;

use bollard::query_parameters::ListContainersOptions;
use casebatch_attempt::AttemptJournal;
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
    if AttemptJournal::read(dir).is_ok_and(|j| j.cleanup.is_some()) {
        return "attempt_closed";
    }
    "in_use"
}

/// A container the engine listed: its name (without the leading `/`), id, state and labels.
struct Listed {
    name: String,
    id: String,
    state: String,
    labels: HashMap<String, String>,
}

/// The containers on this host's engine that carry every one of `labels` (a bare key: any
/// value), `running` only or all. The engine filters; each is checked again here, since what
/// follows (a removal, a kill) cannot be undone.
async fn list(
    labels: &[(&str, Option<&str>)],
    running: bool,
) -> Result<(bollard::Docker, Vec<Listed>), String> {
    let docker = engine::connect().await.map_err(|e| {
        format!(
            "the container engine at {} did not answer: {e}",
            engine::address()
        )
    })?;
    let mut filters = HashMap::from([(
        "label".to_string(),
        labels
            .iter()
            .map(|(k, v)| v.map_or_else(|| k.to_string(), |v| format!("{k}={v}")))
            .collect::<Vec<_>>(),
    )]);
    if running {
        filters.insert("status".into(), vec!["running".into()]);
    }
    let options = ListContainersOptions {
        all: !running,
        filters: Some(filters),
        ..ListContainersOptions::default()
    };
    let listed = docker
        .list_containers(Some(options))
        .await
        .map_err(|e| format!("listing containers failed: {e}"))?;
    let matches = |theirs: &HashMap<String, String>| {
        labels.iter().all(|(k, v)| match (theirs.get(*k), v) {
            (Some(have), Some(want)) => have == want,
            (Some(_), None) => true,
            (None, _) => false,
        })
    };
    let found = listed
        .into_iter()
        .filter_map(|c| {
            let labels = c.labels.unwrap_or_default();
            matches(&labels).then(|| Listed {
                name: c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .unwrap_or_default()
                    .trim_start_matches('/')
                    .to_string(),
                id: c.id.unwrap_or_default(),
                state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                labels,
            })
        })
        .collect();
    Ok((docker, found))
}

/// Lists casebatch's containers on the engine (of one batch, with `batch_id`), removing the
/// garbage when `apply`.
pub async fn gc(apply: bool, batch_id: Option<&str>) -> Result<Vec<Found>, String> {
    let mut labels = vec![(label::MARKER, None)];
    if let Some(id) = batch_id {
        labels.push((label::BATCH_ID, Some(id)));
    }
    let (docker, listed) = list(&labels, false).await?;
    let me = owner();
    let mut found = Vec::new();
    for c in listed {
        let get = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
        let mut entry = Found {
            marker: get(label::MARKER),
            bundle: get(label::BUNDLE),
            verdict: verdict(&c.labels, &me),
            removed: false,
            id: c.id,
            state: c.state,
            name: c.name,
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

/// Kills every running container of one batch on this host's engine (supersede: a stale
/// batch's work stops at once, before its cases' cleanups remove the containers). Only
/// containers provably the batch's are touched: its id, its bundle and this user, all three
/// labels. Returns the names killed.
pub async fn kill_batch(batch_id: &str, bundle_dir: &str) -> Result<Vec<String>, String> {
    let me = owner();
    let labels = [
        (label::BATCH_ID, Some(batch_id)),
        (label::BUNDLE, Some(bundle_dir)),
        (label::OWNER, Some(me.as_str())),
    ];
    let (docker, listed) = list(&labels, true).await?;
    let mut killed = Vec::new();
    for c in listed {
        crate::wait::kill(&docker, &c.name).await;
        killed.push(c.name);
    }
    killed.sort();
    Ok(killed)
}
