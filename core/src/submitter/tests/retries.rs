//! What a failed attempt does on the virtual cluster: a worker's death
//! runs its task again while retries are left (after a backoff when the
//! out-of-memory monitor ended it) and fails it after; an error the task
//! raised runs it again only with retry_exceptions; a node's death runs
//! its tasks elsewhere.

use std::time::Duration;

use raylet_proto::v1::WorkerExitKind;

use super::harness::{SubmitterTest, lease_request_ids};
use super::{failure, lease_one, only_lease_request, options, returns, spill_back};
use crate::links::virtual_cluster::{LOCAL_NODE, number, value};
use crate::submitter::retries::OOM_RETRY_BACKOFF;
use crate::task_error::{TaskError, TaskErrorKind};

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
