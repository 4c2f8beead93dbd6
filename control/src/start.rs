//! Starting a new run of the batch's workflow: its input, its memo (who started what, from
//! where) and its first search attributes, where the namespace has them.

use std::time::Duration;

use casebatch_bundle::Bundle;
use casebatch_manifest::Plan;
use casebatch_proto::visibility::{memo, outcome, search_attr};
use casebatch_proto::{BatchInput, Carried, Counts, TASK_QUEUE};
use casebatch_runtime::local_process::hostname;
use casebatch_workflows::BatchWorkflow;
use temporalio_client::{Client, WorkflowIdConflictPolicy, WorkflowStartOptions, tonic};
use temporalio_common::MemoValues;
use temporalio_common::protos::temporal::api::enums::v1::IndexedValueType;
use temporalio_common::protos::temporal::api::operatorservice::v1::ListSearchAttributesRequest;
use temporalio_common::search_attributes::{SearchAttributeKey, SearchAttributes};

use crate::error::{ControlError, Result};
use crate::events::{DriveEvent, Observer};
use crate::input::batch_input;
use crate::options::DriveOptions;
use crate::workflow::Handle;

/// Starts a new run carrying `carried`. A run that appeared since the ownership check is
/// refused by the engine (the id conflict policy), never attached to silently.
pub(crate) async fn start(
    handle: &Handle,
    bundle: &Bundle,
    plan: &Plan,
    carried: Option<Carried>,
    opts: &DriveOptions,
    observer: &mut dyn Observer,
) -> Result<()> {
    let client = handle.client();
    let visible = search_attributes_registered(client).await;
    if !visible {
        observer.on(DriveEvent::Unsearchable);
    }
    let input = batch_input(bundle, plan, carried, opts, visible)?;
    let wid = handle.info().workflow_id.clone();
    let options = start_options(&wid, bundle, plan, &input);
    client
        .start_workflow(BatchWorkflow::run, input, options)
        .await
        .map_err(|e| ControlError::engine_call(format!("start workflow {wid}"), e))?;
    observer.on(DriveEvent::Started {
        workflow_id: &wid,
        cases: plan.cases.len(),
        concurrency: plan.settings.concurrency,
    });
    Ok(())
}

/// Start options: the memo and, where the namespace has them, the search attributes' first
/// values; the workflow keeps outcome and counts up to date.
fn start_options(
    wid: &str,
    bundle: &Bundle,
    plan: &Plan,
    input: &BatchInput,
) -> WorkflowStartOptions {
    let mut memo = MemoValues::new();
    memo.insert(memo::MANIFEST, plan.provenance.manifest_path.clone())
        .insert(memo::OWNER, user_at_host())
        .insert(memo::CASES, plan.cases.len())
        .insert(memo::FINGERPRINT, plan.fingerprint.clone())
        .insert(memo::BUNDLE_DIR, bundle.root().display().to_string());
    let attributes = input.search_attributes.then(|| {
        let counts = input
            .carried
            .as_ref()
            .map(|c| Counts::of(&c.slots))
            .unwrap_or_default();
        SearchAttributes::new([
            SearchAttributeKey::keyword(search_attr::BATCH_ID).value_set(plan.batch_id.clone()),
            SearchAttributeKey::keyword(search_attr::OUTCOME).value_set(outcome::RUNNING.into()),
            SearchAttributeKey::int(search_attr::SUCCEEDED).value_set(i64::from(counts.succeeded)),
            SearchAttributeKey::int(search_attr::FAILED).value_set(i64::from(counts.failed)),
        ])
    });
    // Never attach silently: a run that appeared since the ownership check is refused.
    WorkflowStartOptions::new(TASK_QUEUE, wid)
        .id_conflict_policy(WorkflowIdConflictPolicy::Fail)
        .memo(memo)
        .maybe_search_attributes(attributes)
        .build()
}

/// `user@host` of this process: `USER`, else `LOGNAME`, else the passwd name of its uid.
fn user_at_host() -> String {
    use std::os::unix::fs::MetadataExt;
    let from_passwd = || {
        let uid = std::fs::metadata("/proc/self").ok()?.uid().to_string();
        let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
        passwd.lines().find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)? == uid).then(|| name.to_string())
        })
    };
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .or_else(from_passwd)
        .unwrap_or_else(|| "unknown".into());
    format!("{user}@{}", hostname())
}

/// Whether the namespace has every `Casebatch*` search attribute registered with its type.
/// In doubt (no permission to ask, no answer) the batch runs without them: upserting an
/// attribute the namespace does not know fails the workflow task, and the batch with it.
async fn search_attributes_registered(client: &Client) -> bool {
    let request = ListSearchAttributesRequest {
        namespace: client.options().namespace.clone(),
    };
    let mut operator = client.connection().operator_service();
    let asked = operator.list_search_attributes(tonic::Request::new(request));
    let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(10), asked).await else {
        return false;
    };
    let custom = answer.into_inner().custom_attributes;
    search_attr::ALL.iter().all(|(name, kind)| {
        let wanted = match *kind {
            "Int" => IndexedValueType::Int,
            _ => IndexedValueType::Keyword,
        };
        custom.get(*name) == Some(&(wanted as i32))
    })
}
