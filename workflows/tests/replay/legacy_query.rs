//! The replay wedge of `tests/nondeterministic/chaos-82985451.json`, staged against the
//! (patched, `third_party/README.md`) core SDK.
//!
//! The server dispatches a legacy query while no workflow task is pending, but a restarted
//! worker polls it a moment later, with the history as of its poll: here it already ends in
//! one case's result and the workflow task that result scheduled. Unpatched, core applied
//! those events to answer the query, so the workflow issued that case's next command ahead of
//! its history; the real task then delivered two more results, and the worker sent the first
//! case's command before theirs, where replay of the same events (all three results in one
//! activation) issues them in the workflow's own order: TMPRL1100 on every later replay, as in
//! the chaos run (cleanups 2, 1, 8 sent; replay issues 1, 2, 8).
//!
//! The race is the server's and cannot be staged on a live one at will, so the two tasks are
//! served by core's own test client; core, its history handling and its caching are the real
//! ones. The "workflow" is the batch's rule in miniature: start three activities, then for the
//! results of one activation, issue each case's next activity in case order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use temporalio_common::protos::coresdk::workflow_activation::{
    WorkflowActivation, workflow_activation_job::Variant as Job,
};
use temporalio_common::protos::coresdk::workflow_commands::ActivityCancellationType;
use temporalio_common::protos::coresdk::workflow_completion::WorkflowActivationCompletion;
use temporalio_common::protos::temporal::api::command::v1::command::Attributes;
use temporalio_common::protos::temporal::api::enums::v1::EventType;
use temporalio_common::protos::temporal::api::query::v1::WorkflowQuery;
use temporalio_sdk_core::replay::TestHistoryBuilder;
use temporalio_sdk_core::test_help::{
    FakeWfResponses, MockPollCfg, ResponseType, build_mock_pollers, hist_to_poll_resp, mock_worker,
    query_ok, schedule_activity_cmd,
};
use temporalio_sdk_core::{PollError, Worker};

const WORKFLOW_ID: &str = "legacy-query-tail";
/// Cases 1..=3 start activities with these sequence numbers; a case's next activity is
/// `NEXT + case`.
const CASES: [u32; 3] = [1, 2, 3];
const NEXT: u32 = 10;

#[tokio::test]
async fn a_legacy_query_polled_after_new_results_does_not_run_the_workflow_ahead_of_history() {
    let (history, query_sees_up_to) = three_cases_then_results_around_a_query();
    let mut legacy_query = hist_to_poll_resp(&history, WORKFLOW_ID, ResponseType::AllHistory);
    let events = legacy_query.resp.history.as_mut().expect("history");
    events.events.retain(|e| e.event_id <= query_sees_up_to);
    legacy_query.resp.started_event_id = 0;
    legacy_query.resp.query = Some(WorkflowQuery {
        query_type: "status".into(),
        ..Default::default()
    });
    let mut cfg = MockPollCfg::new(
        vec![FakeWfResponses {
            wf_id: WORKFLOW_ID.into(),
            hist: history,
            response_batches: vec![
                ResponseType::Raw(legacy_query.resp),
                ResponseType::ToTaskNum(2),
            ],
        }],
        true,
        0,
    );
    cfg.num_expected_legacy_query_resps = 1;
    let sent = Arc::new(Mutex::new(Vec::new()));
    let sink = sent.clone();
    cfg.completion_mock_fn = Some(Box::new(move |completion| {
        sink.lock()
            .unwrap()
            .extend(
                completion
                    .commands
                    .iter()
                    .filter_map(|c| match &c.attributes {
                        Some(Attributes::ScheduleActivityTaskCommandAttributes(a)) => {
                            Some(a.activity_id.clone())
                        }
                        _ => None,
                    }),
            );
        Ok(Default::default())
    }));
    let mut mocks = build_mock_pollers(cfg);
    // A cache, as every casebatch worker has: the query's state is what the real task finds.
    mocks.worker_cfg(|c| c.max_cached_workflows = 10);
    let core = mock_worker(mocks);

    let activations = drive(&core).await;

    let before_query: Vec<&Vec<String>> = activations
        .iter()
        .take_while(|jobs| !jobs.contains(&"query".to_string()))
        .collect();
    assert!(
        before_query
            .iter()
            .all(|jobs| !jobs.iter().any(|j| j.starts_with("result"))),
        "the query ran the workflow past its last completed task: {activations:?}"
    );
    assert_eq!(
        *sent.lock().unwrap(),
        ["next-1", "next-2", "next-3"],
        "the task's commands differ from what replay of its history issues: {activations:?}"
    );
    core.shutdown().await;
}

/// Task 1 starts cases 1-3. Case 2 reports, which schedules a workflow task: the legacy
/// query's history ends there (returned). Cases 1 and 3 report before task 2 starts.
fn three_cases_then_results_around_a_query() -> (TestHistoryBuilder, i64) {
    let mut t = TestHistoryBuilder::default();
    t.add_by_type(EventType::WorkflowExecutionStarted);
    t.add_full_wf_task();
    let scheduled: Vec<i64> = CASES
        .iter()
        .map(|c| t.add_activity_task_scheduled(format!("case-{c}")))
        .collect();
    let report = |t: &mut TestHistoryBuilder, at: i64| {
        let started = t.add_activity_task_started(at);
        t.add_activity_task_completed(at, started, "done".into());
    };
    report(&mut t, scheduled[1]);
    t.add_workflow_task_scheduled();
    let query_sees_up_to = t.current_event_id();
    report(&mut t, scheduled[0]);
    report(&mut t, scheduled[2]);
    t.add_workflow_task_started();
    (t, query_sees_up_to)
}

/// Plays the workflow until core runs out of tasks; returns each activation's jobs.
async fn drive(core: &Worker) -> Vec<Vec<String>> {
    let mut seen = Vec::new();
    loop {
        let activation =
            match tokio::time::timeout(Duration::from_secs(30), core.poll_workflow_activation())
                .await
                .expect("core answers a poll")
            {
                Ok(a) => a,
                Err(PollError::ShutDown) => return seen,
                Err(e) => panic!("poll failed: {e:?}"),
            };
        let (jobs, completion) = respond(&activation);
        seen.push(jobs);
        core.complete_workflow_activation(completion)
            .await
            .expect("completion accepted");
    }
}

/// The workflow: on start, cases 1-3; on results, each reported case's next activity, in case
/// order (as the batch polls its in-flight cases in admission order).
fn respond(activation: &WorkflowActivation) -> (Vec<String>, WorkflowActivationCompletion) {
    let mut jobs = Vec::new();
    let mut reported = Vec::new();
    let mut commands = Vec::new();
    for job in activation.jobs.iter().filter_map(|j| j.variant.as_ref()) {
        match job {
            Job::InitializeWorkflow(_) => {
                jobs.push("start".to_string());
                commands.extend(CASES.iter().map(|&c| activity(c, format!("case-{c}"))));
            }
            Job::ResolveActivity(r) => {
                jobs.push(format!("result-{}", r.seq));
                reported.push(r.seq);
            }
            Job::QueryWorkflow(q) => {
                jobs.push("query".to_string());
                commands.push(query_ok(q.query_id.clone(), "status"));
            }
            other => jobs.push(format!("{other:?}")),
        }
    }
    reported.sort_unstable();
    commands.extend(
        reported
            .into_iter()
            .map(|c| activity(NEXT + c, format!("next-{c}"))),
    );
    let completion = WorkflowActivationCompletion::from_cmds(activation.run_id.clone(), commands);
    (jobs, completion)
}

fn activity(
    seq: u32,
    id: String,
) -> temporalio_common::protos::coresdk::workflow_commands::workflow_command::Variant {
    schedule_activity_cmd(
        seq,
        "q",
        &id,
        ActivityCancellationType::TryCancel,
        Duration::from_secs(60),
        Duration::from_secs(60),
    )
}
