//! Starting a new run of the batch's workflow: its input, its memo (who started what, from
//! where) and its first search attributes, where the namespace has them.

use std::collections::BTreeMap;
use std::time::Duration;

use casebatch_bundle::{Bundle, Event, append_jsonl};
use casebatch_manifest::Plan;
use casebatch_proto::visibility::{memo, outcome, search_attr};
use casebatch_proto::{BatchInput, Carried, Counts, TASK_QUEUE};
use casebatch_views::StartRequest;
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
use serde_json::json;

/// The batch workflow's type name as the SDK registers it (the struct's name).
pub(crate) const WORKFLOW_TYPE: &str = "BatchWorkflow";

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
    // For `batch list`'s start and duration; the run goes on without it if it cannot be
    // written (a full disk is the run's to report, at its first record).
    let _ = append_jsonl(
        &bundle.events(),
        &Event::of_batch(Event::RUN_STARTED, format!("workflow {wid}")),
    );
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
    for (key, value) in memo_fields(bundle, plan) {
        memo.insert(key, value);
    }
    let attributes = input.search_attributes.then(|| {
        let counts = first_counts(input);
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

/// The memo of a run: who started what, from where.
fn memo_fields(bundle: &Bundle, plan: &Plan) -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([
        (memo::MANIFEST.into(), json!(plan.provenance.manifest_path)),
        (memo::OWNER.into(), json!(crate::user::user_at_host())),
        (memo::CASES.into(), json!(plan.cases.len())),
        (memo::FINGERPRINT.into(), json!(plan.fingerprint)),
        (
            memo::BUNDLE_DIR.into(),
            json!(bundle.root().display().to_string()),
        ),
    ])
}

/// The counts a new run starts from: those it carries.
fn first_counts(input: &BatchInput) -> Counts {
    input
        .carried
        .as_ref()
        .map(|c| Counts::of(&c.slots))
        .unwrap_or_default()
}

/// The next run of the batch as a start request any Temporal SDK can send (`batch prepare`):
/// the same input, memo and search attributes as [`start`] would use.
pub(crate) async fn request(
    handle: &Handle,
    bundle: &Bundle,
    plan: &Plan,
    carried: Option<Carried>,
    opts: &DriveOptions,
) -> Result<StartRequest> {
    let client = handle.client();
    let visible = search_attributes_registered(client).await;
    let input = batch_input(bundle, plan, carried, opts, visible)?;
    let search_attributes = if visible {
        let counts = first_counts(&input);
        BTreeMap::from([
            (search_attr::BATCH_ID.into(), json!(plan.batch_id)),
            (search_attr::OUTCOME.into(), json!(outcome::RUNNING)),
            (search_attr::SUCCEEDED.into(), json!(counts.succeeded)),
            (search_attr::FAILED.into(), json!(counts.failed)),
        ])
    } else {
        BTreeMap::new()
    };
    Ok(StartRequest {
        namespace: client.options().namespace.clone(),
        workflow_id: handle.info().workflow_id.clone(),
        workflow_type: WORKFLOW_TYPE.into(),
        task_queue: TASK_QUEUE.into(),
        id_conflict_policy: "fail".into(),
        memo: memo_fields(bundle, plan),
        search_attributes,
        input,
    })
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
