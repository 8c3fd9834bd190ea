//! Leases given back: a leased worker left idle lingers for a while, for
//! the next task of its class, then goes back.

use std::time::Duration;

use super::harness::{SubmitterTest, lease_request_ids};
use super::{finished, lease_one, options, returns};
use crate::links::virtual_cluster::{LOCAL_NODE, number, value};
use crate::submitter::leases::LEASE_LINGER;

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
async fn a_lingering_lease_takes_the_next_task_of_its_class_and_goes_back_after_it() {
    let mut test = SubmitterTest::start();
    let (_, worker) = finished(&mut test, options(), value(1)).await;
    test.advance(LEASE_LINGER / 2).await;
    let later = test.submit(options());
    test.settle().await;
    assert!(lease_request_ids(&test.requests(LOCAL_NODE)).is_empty(), "no new lease");
    let tasks = test.tasks(&worker.address);
    assert_eq!(tasks.len(), 1, "the lingering worker runs it");
    test.advance(LEASE_LINGER).await;
    assert!(
        returns(&test.requests(LOCAL_NODE)).is_empty(),
        "kept while it runs a task"
    );
    test.answer(&worker.address, &tasks[0], value(2));
    test.settle().await;
    assert_eq!(number(test.outcome(later)), 2);
    test.advance(LEASE_LINGER).await;
    assert_eq!(returns(&test.requests(LOCAL_NODE)), [false]);
}
