//! Unit tests of the submitter on virtual node managers and workers: no
//! processes, no sockets, a paused clock.

mod generators;
mod harness;

use std::time::Duration;

use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{LeaseRefusalKind, LeaseRefused, LeaseSpillback, WorkerExitKind};

use self::harness::{SubmitterTest, lease_request_ids};
use super::{LEASE_LINGER, NotRebuilt, OOM_RETRY_BACKOFF};
use crate::links::virtual_cluster::{LOCAL_NODE, Leased, number, stored_value, value};
use crate::task::TaskOptions;
use crate::task_error::{TaskError, TaskErrorKind};

fn options() -> TaskOptions {
    TaskOptions::new("tests::work")
}

/// The one lease request the submitter sent `node` since last asked.
fn only_lease_request(test: &mut SubmitterTest, node: &str) -> u64 {
    let ids = lease_request_ids(&test.requests(node));
    assert_eq!(ids.len(), 1, "expected one lease request to {node}, got {ids:?}");
    ids[0]
}

/// Leases a worker at `node` for the one request pending there.
async fn lease_one(test: &mut SubmitterTest, node: &str) -> Leased {
    let request = only_lease_request(test, node);
    let worker = test.grant(node, request);
    test.settle().await;
    worker
}

/// The local node manager sends its one pending lease request to `node`.
async fn spill_back(test: &mut SubmitterTest, node: &str) {
    let request = only_lease_request(test, LOCAL_NODE);
    let spillback = LeaseSpillback {
        request_id: request,
        node_address: node.into(),
    };
    test.lease_event(LOCAL_NODE, LeaseEvent::Spillback(spillback));
    test.settle().await;
}

fn failure(test: &SubmitterTest, object: raylet_proto::ObjectId) -> TaskError {
    match test.outcome(object) {
        Some(Err(error)) => error,
        other => panic!("expected a failed task, got {:?}", other.map(|o| o.map(|_| "a value"))),
    }
}

fn returns(requests: &[LeaseRequest]) -> Vec<bool> {
    requests
        .iter()
        .filter_map(|r| match r {
            LeaseRequest::ReturnLease(returned) => Some(returned.worker_failed),
            _ => None,
        })
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
async fn a_task_whose_worker_died_runs_again_on_a_new_lease() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options().max_retries(1));
    test.settle().await;
    let first = lease_one(&mut test, LOCAL_NODE).await;
    assert_eq!(test.tasks(&first.address).len(), 1);
    test.kill(&first, WorkerExitKind::Signaled);
    test.settle().await;
    let requests = test.requests(LOCAL_NODE);
    assert_eq!(
        returns(&requests),
        [true],
        "the dead worker's lease goes back as failed"
    );
    let retry = lease_request_ids(&requests);
    assert_eq!(retry.len(), 1, "the task asks for a new worker");
    let second = test.grant(LOCAL_NODE, retry[0]);
    test.settle().await;
    let tasks = test.tasks(&second.address);
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].attempt, 1);
    test.answer(&second.address, &tasks[0], value(1));
    test.settle().await;
    assert_eq!(number(test.outcome(object)), 1);
}

#[tokio::test(start_paused = true)]
async fn a_task_whose_worker_died_past_its_retries_fails_as_crashed() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options().max_retries(0));
    test.settle().await;
    let worker = lease_one(&mut test, LOCAL_NODE).await;
    test.tasks(&worker.address);
    test.kill(&worker, WorkerExitKind::Signaled);
    test.settle().await;
    let error = failure(&test, object);
    assert_eq!(error.kind, TaskErrorKind::WorkerCrashed);
    assert!(error.message.contains("ran 1 time(s)"), "{}", error.message);
    assert!(lease_request_ids(&test.requests(LOCAL_NODE)).is_empty());
    assert_eq!(test.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_application_error_runs_again_only_with_retry_exceptions() {
    let mut test = SubmitterTest::start();
    let retried = test.submit(options().max_retries(2).retry_exceptions(true));
    test.settle().await;
    let worker = lease_one(&mut test, LOCAL_NODE).await;
    let tasks = test.tasks(&worker.address);
    let raised = || Err(TaskError::new(TaskErrorKind::Application, "tests::work", "bad input"));
    test.answer(&worker.address, &tasks[0], raised());
    test.settle().await;
    assert!(test.outcome(retried).is_none(), "the failure is not final");
    let again = test.tasks(&worker.address);
    assert_eq!(again.len(), 1, "the idle worker runs the retry");
    assert_eq!(again[0].attempt, 1);
    test.answer(&worker.address, &again[0], value(3));
    test.settle().await;
    assert_eq!(number(test.outcome(retried)), 3);

    let not_retried = test.submit(options().max_retries(2));
    test.settle().await;
    let tasks = test.tasks(&worker.address);
    test.answer(&worker.address, &tasks[0], raised());
    test.settle().await;
    assert_eq!(failure(&test, not_retried).kind, TaskErrorKind::Application);
    assert!(test.tasks(&worker.address).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_task_the_oom_monitor_ended_runs_again_after_a_doubling_backoff() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options().max_retries(2));
    test.settle().await;
    let mut worker = lease_one(&mut test, LOCAL_NODE).await;
    for backoff in [OOM_RETRY_BACKOFF, OOM_RETRY_BACKOFF * 2] {
        test.tasks(&worker.address);
        test.kill(&worker, WorkerExitKind::OomKilled);
        test.settle().await;
        let requests = test.requests(LOCAL_NODE);
        assert!(lease_request_ids(&requests).is_empty(), "no retry before the backoff");
        // The backoff is jittered within [backoff / 2, backoff].
        test.advance(backoff / 2 - Duration::from_millis(10)).await;
        assert!(lease_request_ids(&test.requests(LOCAL_NODE)).is_empty());
        test.advance(backoff / 2 + Duration::from_millis(10)).await;
        worker = lease_one(&mut test, LOCAL_NODE).await;
    }
    test.tasks(&worker.address);
    test.kill(&worker, WorkerExitKind::OomKilled);
    test.settle().await;
    let error = failure(&test, object);
    assert_eq!(error.kind, TaskErrorKind::OutOfMemory);
    assert_eq!(error.attempt, 2);
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
async fn an_idle_lease_is_returned_after_it_lingers() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options());
    test.settle().await;
    let worker = lease_one(&mut test, LOCAL_NODE).await;
    let tasks = test.tasks(&worker.address);
    test.answer(&worker.address, &tasks[0], value(1));
    test.settle().await;
    assert_eq!(number(test.outcome(object)), 1);
    test.advance(LEASE_LINGER - Duration::from_millis(5)).await;
    assert!(
        returns(&test.requests(LOCAL_NODE)).is_empty(),
        "kept while it may be reused"
    );
    test.advance(Duration::from_millis(5)).await;
    assert_eq!(
        returns(&test.requests(LOCAL_NODE)),
        [false],
        "given back, not as failed"
    );
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

#[tokio::test(start_paused = true)]
async fn a_lost_stored_object_is_rebuilt_by_running_its_task_again() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options().max_retries(1));
    test.settle().await;
    let worker = lease_one(&mut test, LOCAL_NODE).await;
    let tasks = test.tasks(&worker.address);
    test.answer(&worker.address, &tasks[0], stored_value(LOCAL_NODE));
    test.settle().await;
    assert!(matches!(test.outcome(object), Some(Ok(_))));
    test.reconstruct(object).await.expect("its task may run again");
    assert!(test.outcome(object).is_none(), "pending again while rebuilt");
    let again = test.tasks(&worker.address);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 1);
    test.answer(&worker.address, &again[0], stored_value(LOCAL_NODE));
    test.settle().await;
    assert!(matches!(test.outcome(object), Some(Ok(_))));
    let spent = test.reconstruct(object).await;
    assert!(
        matches!(
            spent,
            Err(NotRebuilt::RetriesSpent {
                runs: 2,
                max_retries: 1,
                ..
            })
        ),
        "{spent:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_queued_task_fails_it_before_it_runs() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options());
    test.settle().await;
    let request = only_lease_request(&mut test, LOCAL_NODE);
    test.cancel(object, false);
    test.settle().await;
    assert_eq!(failure(&test, object).kind, TaskErrorKind::Cancelled);
    let worker = test.grant(LOCAL_NODE, request);
    test.settle().await;
    assert!(test.tasks(&worker.address).is_empty(), "nothing runs on the late lease");
    assert_eq!(test.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_running_task_tells_its_worker_and_force_ends_the_worker() {
    let mut test = SubmitterTest::start();
    let gentle = test.submit(options());
    test.settle().await;
    let worker = lease_one(&mut test, LOCAL_NODE).await;
    let tasks = test.tasks(&worker.address);
    test.cancel(gentle, false);
    test.settle().await;
    assert_eq!(failure(&test, gentle).kind, TaskErrorKind::Cancelled);
    let (_, cancels) = test.received(&worker.address);
    assert_eq!(cancels.len(), 1, "the worker is told to stop the task");
    assert!(
        returns(&test.requests(LOCAL_NODE)).is_empty(),
        "a gentle cancel keeps the worker"
    );
    test.answer(&worker.address, &tasks[0], value(9));
    test.settle().await;
    assert_eq!(
        failure(&test, gentle).kind,
        TaskErrorKind::Cancelled,
        "a late result is ignored"
    );

    let forced = test.submit(options());
    test.settle().await;
    assert_eq!(test.tasks(&worker.address).len(), 1);
    test.cancel(forced, true);
    test.settle().await;
    assert_eq!(failure(&test, forced).kind, TaskErrorKind::Cancelled);
    assert_eq!(returns(&test.requests(LOCAL_NODE)), [true], "the worker is ended");
    test.kill(&worker, WorkerExitKind::LeaseRevoked);
    test.settle().await;
    assert_eq!(failure(&test, forced).kind, TaskErrorKind::Cancelled, "not retried");
    assert!(lease_request_ids(&test.requests(LOCAL_NODE)).is_empty());
}

#[tokio::test(start_paused = true)]
async fn tasks_on_a_node_the_head_counts_dead_run_again_elsewhere() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options());
    test.settle().await;
    let other = "node-other:7000";
    spill_back(&mut test, other).await;
    let cut_off = lease_one(&mut test, other).await;
    assert_eq!(test.tasks(&cut_off.address).len(), 1);
    test.node_died(other);
    test.settle().await;
    let retry = only_lease_request(&mut test, LOCAL_NODE);
    let elsewhere = test.grant(LOCAL_NODE, retry);
    test.settle().await;
    let tasks = test.tasks(&elsewhere.address);
    assert_eq!(tasks[0].attempt, 1);
    assert!(test.outcome(object).is_none());
    test.answer(&elsewhere.address, &tasks[0], value(8));
    test.settle().await;
    assert_eq!(number(test.outcome(object)), 8);
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
