//! Cancellation on the virtual cluster: a queued task never runs and fails
//! as cancelled, and the lease it asked for is no longer wanted; a running
//! one's worker is told to stop it, and ended when forced; a task waiting
//! out a backoff does not come back.

use raylet_proto::v1::WorkerExitKind;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;

use super::harness::{SubmitterTest, lease_request_ids};
use super::{failure, lease_one, only_lease_request, options, returns, running};
use crate::links::virtual_cluster::{LOCAL_NODE, value};
use crate::submitter::retries::OOM_RETRY_BACKOFF;
use crate::task_error::TaskErrorKind;

/// The lease requests cancelled among `requests`.
fn cancelled_requests(requests: &[LeaseRequest]) -> Vec<u64> {
    requests
        .iter()
        .filter_map(|r| match r {
            LeaseRequest::Cancel(cancel) => Some(cancel.request_id),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_queued_task_fails_it_before_it_runs_and_drops_its_lease() {
    let mut test = SubmitterTest::start();
    let object = test.submit(options());
    test.settle().await;
    let request = only_lease_request(&mut test, LOCAL_NODE);
    test.cancel(object, false);
    test.settle().await;
    assert_eq!(failure(&test, object).kind, TaskErrorKind::Cancelled);
    let requests = test.requests(LOCAL_NODE);
    assert_eq!(cancelled_requests(&requests), [request], "its lease is not needed");
    let worker = test.grant(LOCAL_NODE, request);
    test.settle().await;
    assert!(test.tasks(&worker.address).is_empty(), "nothing runs on the late lease");
    assert_eq!(returns(&test.requests(LOCAL_NODE)), [false], "which goes back at once");
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
async fn a_task_cancelled_while_it_waits_out_a_backoff_does_not_run_again() {
    let mut test = SubmitterTest::start();
    let (object, worker, _) = running(&mut test, options().max_retries(2)).await;
    test.kill(&worker, WorkerExitKind::OomKilled);
    test.settle().await;
    test.requests(LOCAL_NODE);
    test.cancel(object, false);
    test.settle().await;
    assert_eq!(failure(&test, object).kind, TaskErrorKind::Cancelled);
    test.advance(OOM_RETRY_BACKOFF * 2).await;
    assert!(
        lease_request_ids(&test.requests(LOCAL_NODE)).is_empty(),
        "no lease is asked for it"
    );
    assert_eq!(test.pending(), 0, "it is no longer pending");
}
