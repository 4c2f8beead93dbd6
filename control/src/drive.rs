//! Starting a batch's workflow (or re-attaching to the running one) and following it to its
//! end, through engine outages, with an in-process worker unless told otherwise.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use casebatch_bundle::{Bundle, CaseRecordState, CaseResult, Lineage, read_json_if_present};
use casebatch_manifest::Plan;
use casebatch_proto::visibility::{memo, outcome, search_attr};
use casebatch_proto::{
    BatchInput, BatchOutcome, BatchStatus, Carried, CaseSlot, CaseState, Counts, Speculation,
    TASK_QUEUE, workflow_id,
};
use casebatch_runtime::local_process::hostname;
use casebatch_worker::{Engine, host_until};
use casebatch_workflows::BatchWorkflow;
use futures::StreamExt;
use temporalio_client::{
    Client, WorkflowDescribeOptions, WorkflowExecutionStatus, WorkflowFetchHistoryOptions,
    WorkflowGetResultOptions, WorkflowHandle, WorkflowIdConflictPolicy, WorkflowQueryOptions,
    WorkflowStartOptions,
    errors::{WorkflowGetResultError, WorkflowInteractionError},
    tonic,
};
use temporalio_common::MemoValues;
use temporalio_common::protos::temporal::api::enums::v1::{
    IndexedValueType, TaskQueueKind, TaskQueueType,
};
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;
use temporalio_common::protos::temporal::api::operatorservice::v1::ListSearchAttributesRequest;
use temporalio_common::protos::temporal::api::taskqueue::v1::TaskQueue;
use temporalio_common::protos::temporal::api::workflowservice::v1::DescribeTaskQueueRequest;
use temporalio_common::search_attributes::{SearchAttributeKey, SearchAttributes};

use crate::error::{ControlError, Result};
use crate::prepare::RETRY_BACKOFF_MS;
use crate::requeue::Requeue;
use crate::space::SpaceWatch;
use crate::{run_history, scheduling};

/// How long a runner waits for an unreachable engine before giving up.
const ENGINE_OUTAGE: Duration = Duration::from_secs(600);
/// How often a running batch's status is asked for.
const STATUS_EVERY: Duration = Duration::from_millis(500);

pub(crate) type Handle = WorkflowHandle<Client, BatchWorkflow>;

/// What a runner sees while it follows a batch; the CLI draws it.
#[derive(Debug)]
pub enum DriveEvent<'a> {
    /// The batch being followed; always the first event.
    Batch(&'a Plan),
    /// The batch was running already: this runner follows it.
    Reattached,
    /// The batch was running already: that run is superseded, and this one replaces it once
    /// it has ended.
    Superseding,
    /// This many finished cases get a new attempt.
    Requeued(usize),
    /// A new run of the batch's workflow started.
    Started {
        workflow_id: &'a str,
        cases: usize,
        concurrency: u32,
    },
    Status(&'a BatchStatus),
    /// The namespace lacks the `Casebatch*` search attributes: the batch runs without them.
    Unsearchable,
    /// No worker polls the batch's task queue: nothing will run until one does.
    NoWorker {
        task_queue: &'a str,
    },
    EngineUnreachable(&'a str),
    EngineBack,
}

/// Receives [`DriveEvent`]s.
pub trait Observer {
    fn on(&mut self, event: DriveEvent<'_>);
}

/// An observer that ignores everything.
impl Observer for () {
    fn on(&mut self, _: DriveEvent<'_>) {}
}

/// How to follow a batch.
#[derive(Debug, Clone, Default)]
pub struct DriveOptions {
    /// Host a worker in this process (the default); `false` leaves the work to replicas.
    pub without_worker: bool,
    /// Events per run before continue-as-new (tests use small values).
    pub history_budget: Option<u32>,
    /// Finished cases that get a new attempt.
    pub requeue: Requeue,
    /// A run of the batch that is still going is superseded (its jobs killed, its
    /// unfinished cases queued) and this run replaces it, instead of following it.
    pub supersede: bool,
    /// No tail speculation in this run (it is on for cases dealt from a `runtime:` list).
    pub no_speculation: bool,
    /// The run-history index (`None`: `CASEBATCH_HISTORY_DB`, else under the output root).
    pub history_db: Option<PathBuf>,
    /// Serve the in-process worker's metrics, `/healthz` and `/readyz` here.
    pub metrics: Option<casebatch_worker::Listen>,
}

/// How a run of `execute` ended.
#[derive(Debug)]
pub enum Finished {
    /// The workflow ran to this outcome.
    Ran(Box<BatchOutcome>),
    /// Every case was already terminal: nothing was started.
    AlreadyComplete,
}

/// Follows the batch to its end, hosting a worker unless told otherwise, then stops an
/// embedded engine this process started. A file system it writes to running out of space
/// ends the run (see `space.rs`), also before it starts.
pub(crate) async fn execute(
    mut engine: Engine,
    bundle: &Bundle,
    plan: &Plan,
    opts: DriveOptions,
    observer: &mut dyn Observer,
) -> Result<Finished> {
    let engine_dir = engine
        .embedded
        .as_ref()
        .and_then(|s| s.log.parent().map(Path::to_path_buf));
    let space = SpaceWatch::new(bundle.root(), &plan.batch_id, engine_dir);
    space.check()?;
    let client = engine.client.clone();
    let without_worker = opts.without_worker;
    let metrics = opts.metrics.clone();
    // Watched beside the drive, not between its calls: a call to a dead engine can take many
    // seconds of retries, and a full disk is what keeps an embedded engine dead.
    let followed = async {
        tokio::select! {
            driven = drive(&client, bundle, plan, opts, observer) => driven,
            full = space.watch() => Err(full),
        }
    };
    let finished = if without_worker {
        followed.await
    } else {
        host_until(client.clone(), metrics.as_ref(), followed)
            .await
            .map_err(|e| ControlError::engine_call("host the worker", e))?
    };
    if let Some(server) = engine.embedded.as_mut() {
        server.stop();
    }
    finished
}

/// Starts the workflow (or re-attaches to the running one) and waits for its outcome.
async fn drive(
    client: &Client,
    bundle: &Bundle,
    plan: &Plan,
    opts: DriveOptions,
    observer: &mut dyn Observer,
) -> Result<Finished> {
    observer.on(DriveEvent::Batch(plan));
    let wid = workflow_id(&plan.batch_id);
    let handle: Handle = client.get_workflow_handle(wid.clone());
    let mut presence = presence(&handle, bundle, plan).await?;
    if presence == Presence::Running && opts.supersede {
        observer.on(DriveEvent::Superseding);
        crate::operate::supersede_and_wait(&handle, &plan.batch_id).await?;
        presence = Presence::Closed;
    }
    if presence == Presence::Running {
        if opts.requeue != Requeue::None {
            return Err(ControlError::StillRunning {
                batch_id: plan.batch_id.clone(),
                action: "rerun cases of",
            });
        }
        observer.on(DriveEvent::Reattached);
    } else {
        let mut carried = match presence {
            Presence::Closed => carried_from_result(&handle).await,
            _ => None,
        };
        if carried.is_none() {
            carried = carried_from_bundle(bundle, plan)?;
        }
        if let Some(c) = carried.as_mut() {
            let n = opts.requeue.apply(plan, &mut c.slots);
            if n > 0 {
                observer.on(DriveEvent::Requeued(n));
            }
            if c.slots.iter().all(|s| s.state.is_terminal()) {
                return Ok(Finished::AlreadyComplete);
            }
        }
        let visible = search_attributes_registered(client).await;
        if !visible {
            observer.on(DriveEvent::Unsearchable);
        }
        let mut input = batch_input(bundle, plan, carried, opts.history_budget, visible)?;
        if input.routes.is_some() && !opts.no_speculation {
            input.speculation = Some(Speculation {
                seed_ms: run_history::speculation_seed_ms(plan, bundle, opts.history_db.as_deref()),
            });
        }
        let start = start_options(&wid, bundle, plan, &input);
        client
            .start_workflow(BatchWorkflow::run, input, start)
            .await
            .map_err(|e| ControlError::engine_call(format!("start workflow {wid}"), e))?;
        observer.on(DriveEvent::Started {
            workflow_id: &wid,
            cases: plan.cases.len(),
            concurrency: plan.settings.concurrency,
        });
    }
    follow(&handle, observer)
        .await
        .map(|o| Finished::Ran(Box::new(o)))
}

/// Waits for the workflow's result, reporting status as it goes. The engine may restart under
/// us (the embedded server is supervised): transient RPC errors mean "wait and ask again", for
/// up to [`ENGINE_OUTAGE`] (unless the disk fills meanwhile: see `execute`).
async fn follow(handle: &Handle, observer: &mut dyn Observer) -> Result<BatchOutcome> {
    let mut result = Box::pin(handle.get_result(WorkflowGetResultOptions::default()));
    let mut outage_since: Option<Instant> = None;
    let mut warned_no_worker = false;
    let mut tick = tokio::time::interval(STATUS_EVERY);
    loop {
        tokio::select! {
            r = &mut result => match r {
                Ok(outcome) => return Ok(outcome),
                Err(e @ (WorkflowGetResultError::Rpc(_) | WorkflowGetResultError::Other(_)))
                    if outage_since.is_none_or(|t| t.elapsed() < ENGINE_OUTAGE) =>
                {
                    if outage_since.is_none() {
                        observer.on(DriveEvent::EngineUnreachable(&e.to_string()));
                        outage_since = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    result = Box::pin(handle.get_result(WorkflowGetResultOptions::default()));
                }
                Err(WorkflowGetResultError::Terminated { .. }) => {
                    return Err(ControlError::Terminated { workflow_id: handle.info().workflow_id.clone() });
                }
                Err(e) => {
                    let wid = handle.info().workflow_id.clone();
                    return Err(ControlError::engine_call(format!("complete batch workflow {wid}"), e));
                }
            },
            _ = tick.tick() => {
                match tokio::time::timeout(Duration::from_secs(2), query_status(handle)).await {
                    Ok(Ok(s)) => {
                        if outage_since.take().is_some() {
                            observer.on(DriveEvent::EngineBack);
                        }
                        observer.on(DriveEvent::Status(&s));
                    }
                    // Unanswered queries: maybe no worker polls the batch's queue at all.
                    _ if !warned_no_worker && no_poller(handle).await => {
                        warned_no_worker = true;
                        observer.on(DriveEvent::NoWorker { task_queue: TASK_QUEUE });
                    }
                    _ => {}
                }
            }
        }
    }
}

/// True when the engine says no worker polls the batch's workflow task queue (a run with
/// `--no-worker` and no replicas would otherwise wait in silence). Unknown counts as false.
async fn no_poller(handle: &Handle) -> bool {
    let request = DescribeTaskQueueRequest {
        namespace: handle.info().namespace.clone(),
        task_queue: Some(TaskQueue {
            name: TASK_QUEUE.into(),
            kind: TaskQueueKind::Normal as i32,
            ..Default::default()
        }),
        task_queue_type: TaskQueueType::Workflow as i32,
        ..Default::default()
    };
    let described = handle
        .client()
        .connection()
        .workflow_service()
        .describe_task_queue(tonic::Request::new(request))
        .await;
    described.is_ok_and(|r| r.into_inner().pollers.is_empty())
}

fn batch_input(
    bundle: &Bundle,
    plan: &Plan,
    carried: Option<Carried>,
    history_budget: Option<u32>,
    search_attributes: bool,
) -> Result<BatchInput> {
    let (envelopes, case_loads) = scheduling::envelopes(plan);
    let routes = scheduling::routes(plan);
    Ok(BatchInput {
        batch_id: plan.batch_id.clone(),
        bundle_dir: bundle.root().display().to_string(),
        fingerprint: plan.fingerprint.clone(),
        case_count: plan.cases.len() as u32,
        concurrency: plan.settings.concurrency,
        max_retries: plan.settings.max_retries,
        retry_backoff_ms: RETRY_BACKOFF_MS,
        max_timeout_seconds: plan
            .cases
            .iter()
            .map(|c| c.timeout_seconds)
            .max()
            .unwrap_or(600),
        carried,
        history_budget,
        oom_auto_boost: plan.settings.oom_auto_boost,
        memory_boosts: memory_boosts(bundle, plan)?,
        search_attributes,
        envelopes,
        case_loads,
        speculation: None,
        // A routed case's runtime is picked at dispatch: nothing to provision it on before.
        prepare_ahead: if routes.is_some() {
            0
        } else {
            plan.settings.prepare_ahead
        },
        routes,
    })
}

/// Start options: the memo (who started what, from where) and, where the namespace has them,
/// the search attributes' first values; the workflow keeps outcome and counts up to date.
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
pub(crate) fn user_at_host() -> String {
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

/// Whether the batch's workflow exists, and whether it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    Absent,
    Running,
    Closed,
}

/// Finds the batch's workflow and proves it is this batch: many users share a namespace, and
/// the same batch id in another output root (or with another task list) is someone else's
/// batch. Nothing is attached to, signalled or carried over unless this holds.
pub(crate) async fn presence(handle: &Handle, bundle: &Bundle, plan: &Plan) -> Result<Presence> {
    let wid = &handle.info().workflow_id;
    let presence = match handle.describe(WorkflowDescribeOptions::default()).await {
        Ok(d) if d.status() == WorkflowExecutionStatus::Running => Presence::Running,
        Ok(_) => Presence::Closed,
        Err(WorkflowInteractionError::NotFound(_)) => return Ok(Presence::Absent),
        Err(e) => {
            return Err(ControlError::engine_call(
                format!("look up workflow {wid}"),
                e,
            ));
        }
    };
    let ours = Owner {
        fingerprint: plan.fingerprint.clone(),
        bundle_dir: bundle.root().display().to_string(),
    };
    match owner(handle).await? {
        Some(theirs) if theirs == ours => Ok(presence),
        theirs => Err(ControlError::NotOurBatch {
            workflow_id: wid.clone(),
            theirs: theirs.map_or_else(
                || "a workflow casebatch did not start".into(),
                |o| o.to_string(),
            ),
            ours: ours.to_string(),
        }),
    }
}

/// [`presence`] of the batch's workflow, looked up by its id.
pub(crate) async fn claim(client: &Client, bundle: &Bundle, plan: &Plan) -> Result<Presence> {
    let handle: Handle = client.get_workflow_handle(workflow_id(&plan.batch_id));
    presence(&handle, bundle, plan).await
}

/// Who a batch workflow runs for: the plan and the bundle its current run was started with.
#[derive(Debug, PartialEq, Eq)]
struct Owner {
    fingerprint: String,
    bundle_dir: String,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = &self.fingerprint[..self.fingerprint.len().min(12)];
        write!(f, "bundle {} (plan {short})", self.bundle_dir)
    }
}

/// The owner recorded in the current run's input (its first history event); `None` when the
/// workflow is not a casebatch batch.
async fn owner(handle: &Handle) -> Result<Option<Owner>> {
    let mut events = handle.fetch_history(WorkflowFetchHistoryOptions::default());
    let first = match events.next().await {
        Some(Ok(event)) => event,
        Some(Err(e)) => return Err(ControlError::engine_call("read the batch's history", e)),
        None => return Ok(None),
    };
    let Some(Attributes::WorkflowExecutionStartedEventAttributes(started)) = first.attributes
    else {
        return Ok(None);
    };
    let input = started
        .input
        .and_then(|i| i.payloads.into_iter().next())
        .and_then(|p| serde_json::from_slice::<BatchInput>(&p.data).ok());
    Ok(input.map(|i| Owner {
        fingerprint: i.fingerprint,
        bundle_dir: i.bundle_dir,
    }))
}

pub(crate) async fn query_status(handle: &Handle) -> Result<BatchStatus> {
    handle
        .query(BatchWorkflow::status, (), WorkflowQueryOptions::default())
        .await
        .map_err(|e| ControlError::engine_call("query the batch's status", e))
}

/// Per-case memory granted by `retry-failed` (from lineage.json), by case index. Only a batch
/// made by `retry-failed` has a lineage; a damaged one is an error, not "no boosts", which
/// would run an OOM-killed case again at the size it died at.
fn memory_boosts(bundle: &Bundle, plan: &Plan) -> Result<std::collections::BTreeMap<u32, u64>> {
    let Some(lineage) = read_json_if_present::<Lineage>(&bundle.lineage())? else {
        return Ok(Default::default());
    };
    Ok(plan
        .cases
        .iter()
        .filter_map(|c| {
            let mb = lineage.memory_boost_mb.get(&c.case_id)?;
            Some((c.index, *mb))
        })
        .collect())
}

/// State to start a new run from: the last run's result. A run that was terminated or
/// failed left none; then the bundle's per-case records say where the batch stands.
async fn carried_from_result(handle: &Handle) -> Option<Carried> {
    let prev = handle
        .get_result(WorkflowGetResultOptions::default())
        .await
        .ok()?;
    Some(Carried {
        slots: prev.slots,
        counters: prev.status.counters,
        timeline: prev.status.timeline,
        paused: false,
        segment: prev.status.segment,
        // A resume runs at the plan's limit (or its own --concurrency), not a live-set one.
        concurrency: None,
        // Carried on: the runner that ends the next run records any still missing.
        unrecorded: prev.status.unrecorded,
    })
}

/// Where the batch stands by its per-case records, when the engine has no result to carry
/// (a first run, a terminated run, a workflow the engine no longer remembers). A case with no
/// record is queued; one whose record cannot be read is an error: taking it for queued
/// would run a finished case again.
fn carried_from_bundle(bundle: &Bundle, plan: &Plan) -> Result<Option<Carried>> {
    let mut any = false;
    let mut slots = Vec::with_capacity(plan.cases.len());
    for c in &plan.cases {
        let Some(r) = read_json_if_present::<CaseResult>(&bundle.case_result(&c.case_dir))? else {
            slots.push(CaseSlot::default());
            continue;
        };
        any = true;
        let state = match r.state {
            CaseRecordState::Succeeded => CaseState::Succeeded,
            CaseRecordState::Failed => CaseState::Failed,
            CaseRecordState::Cancelled => CaseState::Cancelled,
            _ => CaseState::Queued,
        };
        slots.push(CaseSlot {
            state,
            attempts: r.attempts,
        });
    }
    Ok(any.then(|| Carried {
        slots,
        ..Carried::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_in(dir: &std::path::Path) -> Plan {
        let manifest = dir.join("m.yaml");
        std::fs::write(
            &manifest,
            "batch_id: t\ndefaults:\n  runtime: fake\ntasks:\n  - task_id: a\n  - task_id: b\n",
        )
        .unwrap();
        casebatch_manifest::load_plan(&manifest, &Default::default()).unwrap()
    }

    #[test]
    fn a_missing_record_is_queued_and_a_damaged_one_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan_in(dir.path());
        let bundle = Bundle::at(dir.path().join("t"));
        assert!(carried_from_bundle(&bundle, &plan).unwrap().is_none());
        let path = bundle.case_result(&plan.cases[1].case_dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"{\"schema_version\": \"casebatch_v1\", \"sta").unwrap();
        let err = carried_from_bundle(&bundle, &plan).unwrap_err();
        assert!(matches!(err, ControlError::BundleUnreadable(_)), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn a_damaged_lineage_is_an_error_not_no_boosts() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan_in(dir.path());
        let bundle = Bundle::at(dir.path().join("t"));
        assert!(memory_boosts(&bundle, &plan).unwrap().is_empty());
        std::fs::create_dir_all(bundle.root()).unwrap();
        std::fs::write(bundle.lineage(), b"{\"memory_boost_mb\": {\"a\": 12").unwrap();
        let err = memory_boosts(&bundle, &plan).unwrap_err();
        assert!(err.to_string().contains("lineage.json"), "{err}");
    }
}
