//! Queued tasks onto leased workers: in submission order per class, a
//! retry first; lease requests, their reuse and cancellation; spillback;
//! refusals; the backlog reported.

use raylet_proto::TaskId;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{LeaseRefusalKind, LeaseRefused, TaskSpec, WorkerExitKind};

use super::harness::{SubmitterTest, lease_request_ids};
use super::{failure, lease_one, only_lease_request, options, spill_back};
use crate::links::virtual_cluster::{LOCAL_NODE, number, value};
use crate::task_error::TaskErrorKind;

/// The ids of `specs`.
fn ids(specs: &[TaskSpec]) -> Vec<TaskId> {
    specs
        .iter()
        .map(|spec| TaskId::from_wire(&spec.task_id).expect("a task id"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_task_runs_on_a_leased_worker_and_its_value_is_stored() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options());
    test.settle().await;
    let worker = lease_one(&mut test, LOCAL_NODE).await;
    let tasks = test.tasks(&worker.address);
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].function, "tests::work");
    assert_eq!(tasks[0].attempt, 0);
    assert!(test.outcome(object).is_none());
    test.answer(&worker.address, &tasks[0], value(7));
    test.settle().await;
    assert_eq!(number(test.outcome(object)), 7);
    assert_eq!(test.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_second_task_reuses_the_idle_worker_and_the_spare_request_is_cancelled() {
    let mut test = SubmitterTest::start();
    let first = test.submit(options());
    let second = test.submit(options());
    test.settle().await;
    let requests = lease_request_ids(&test.requests(LOCAL_NODE));
    assert_eq!(requests.len(), 2, "one lease request per queued task");
    let worker = test.grant(LOCAL_NODE, requests[0]);
    test.settle().await;
    let tasks = test.tasks(&worker.address);
    assert_eq!(tasks.len(), 1, "a task of unknown length is not queued behind another");
    test.answer(&worker.address, &tasks[0], value(1));
    test.settle().await;
    let tasks = test.tasks(&worker.address);
    assert_eq!(tasks.len(), 1, "the second task goes to the same worker");
    let cancels: Vec<u64> = test
        .requests(LOCAL_NODE)
        .into_iter()
        .filter_map(|r| match r {
            LeaseRequest::Cancel(cancel) => Some(cancel.request_id),
            _ => None,
        })
        .collect();
    assert_eq!(cancels, [requests[1]]);
    test.answer(&worker.address, &tasks[0], value(2));
    test.settle().await;
    assert_eq!(number(test.outcome(first)), 1);
    assert_eq!(number(test.outcome(second)), 2);
}

#[tokio::test(start_paused = true)]
async fn a_spilled_back_request_goes_to_the_named_node_and_spills_no_further() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options());
    test.settle().await;
    let other = "node-other:7000";
    spill_back(&mut test, other).await;
    let requests = test.requests(other);
    let [LeaseRequest::Request(spilled)] = requests.as_slice() else {
        panic!("expected one lease request to the other node, got {requests:?}");
    };
    assert!(!spilled.allow_spillback);
    let worker = test.grant(other, spilled.request_id);
    test.settle().await;
    let tasks = test.tasks(&worker.address);
    test.answer(&worker.address, &tasks[0], value(5));
    test.settle().await;
    assert_eq!(number(test.outcome(object)), 5);
}

#[tokio::test(start_paused = true)]
async fn a_refused_infeasible_request_fails_the_queued_tasks() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options().num_gpus(8.0));
    test.settle().await;
    let request = only_lease_request(&mut test, LOCAL_NODE);
    test.lease_event(
        LOCAL_NODE,
        LeaseEvent::Refused(LeaseRefused {
            request_id: request,
            reason: "no node has 8 GPU".into(),
            kind: LeaseRefusalKind::Infeasible.into(),
        }),
    );
    test.settle().await;
    let error = failure(&test, object);
    assert_eq!(error.kind, TaskErrorKind::Infeasible);
    assert!(error.message.contains("no node has 8 GPU"));
}

/// The backlogs the submitter reported to `node` since last asked.
fn backlogs(test: &mut SubmitterTest, node: &str) -> Vec<u64> {
    let requests = test.requests(node);
    let reports = requests.iter().filter_map(|request| match request {
        LeaseRequest::Backlog(report) => Some(report.backlog),
        _ => None,
    });
    reports.collect()
}

#[tokio::test(start_paused = true)]
async fn tasks_queued_beyond_the_lease_requests_are_reported_as_backlog_in_few_messages() {
    let mut test = SubmitterTest::start();
    for _ in 0..110 {
        test.submit(options());
        test.settle().await;
    }
    let reported = backlogs(&mut test, LOCAL_NODE);
    let last = *reported.last().unwrap();
    assert!(
        (88..=100).contains(&last),
        "110 queued, 10 requests out: within an eighth of 100: {reported:?}"
    );
    assert!(reported.len() < 30, "growing by one task at a time: {reported:?}");
    assert!(reported.windows(2).all(|pair| pair[0] < pair[1]), "{reported:?}");
}

#[tokio::test(start_paused = true)]
async fn tasks_of_a_class_run_in_the_order_they_were_submitted() {
    let mut test = SubmitterTest::start();
    let first = test.submit_call(options());
    let bigger = test.submit_call(options().num_cpus(2.0));
    let second = test.submit_call(options());
    let third = test.submit_call(options());
    test.settle().await;
    let requests = lease_request_ids(&test.requests(LOCAL_NODE));
    assert_eq!(requests.len(), 4, "one request per queued task");
    let worker = test.grant(LOCAL_NODE, requests[0]);
    test.settle().await;
    let mut sent = Vec::new();
    while sent.len() < 3 {
        let tasks = test.tasks(&worker.address);
        assert!(!tasks.is_empty(), "the worker has work while its class has: {sent:?}");
        for task in &tasks {
            test.answer(&worker.address, task, value(1));
        }
        sent.extend(ids(&tasks));
        test.settle().await;
    }
    assert_eq!(sent, [first, second, third]);
    assert!(
        test.tasks(&worker.address).is_empty(),
        "the other class's task is not sent here"
    );
    let other = test.grant(LOCAL_NODE, requests[1]);
    test.settle().await;
    assert_eq!(ids(&test.tasks(&other.address)), [bigger]);
}

#[tokio::test(start_paused = true)]
async fn a_task_run_again_goes_ahead_of_those_queued_after_it() {
    let mut test = SubmitterTest::start();
    let first = test.submit_call(options().max_retries(1));
    let second = test.submit_call(options());
    test.settle().await;
    let requests = lease_request_ids(&test.requests(LOCAL_NODE));
    let worker = test.grant(LOCAL_NODE, requests[0]);
    test.settle().await;
    assert_eq!(ids(&test.tasks(&worker.address)), [first]);
    test.kill(&worker, WorkerExitKind::Signaled);
    test.settle().await;
    let asked = lease_request_ids(&test.requests(LOCAL_NODE));
    assert_eq!(asked.len(), 1, "one more request: two tasks, one request out");
    let next = test.grant(LOCAL_NODE, requests[1]);
    test.settle().await;
    let tasks = test.tasks(&next.address);
    assert_eq!((ids(&tasks), tasks[0].attempt), (vec![first], 1), "the retry first");
    test.answer(&next.address, &tasks[0], value(1));
    test.settle().await;
    assert_eq!(ids(&test.tasks(&next.address)), [second]);
}

#[tokio::test(start_paused = true)]
async fn a_task_submitted_to_an_idle_lease_is_sent_by_the_submitting_thread_unless_it_is_handling_an_event() {
    let mut test = SubmitterTest::start();
    let (_, worker) = super::finished(&mut test, options(), value(1)).await;
    test.submit(options());
    let sent = test.tasks(&worker.address);
    assert_eq!(sent.len(), 1, "written before submit returned, without the loop");
    test.answer(&worker.address, &sent[0], value(2));
    test.settle().await;
    let handling = crate::submitter::handle::Handling::start();
    test.submit(options());
    drop(handling);
    assert!(
        test.tasks(&worker.address).is_empty(),
        "a thread already handling an event leaves the next to the loop"
    );
    test.settle().await;
    assert_eq!(test.tasks(&worker.address).len(), 1, "the loop sends it");
}
