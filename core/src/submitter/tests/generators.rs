//! Generator calls on the virtual cluster: a retry skips the items its
//! caller has, and a run that makes lost items again sends only those,
//! failing them when it cannot.

use raylet_proto::v1::{TaskSpec, WorkerExitKind};
use raylet_proto::{ObjectId, TaskId};

use super::harness::SubmitterTest;
use super::{failure, lease_one, options};
use crate::links::virtual_cluster::{LOCAL_NODE, Leased, number, stored_value, value};
use crate::task_error::TaskErrorKind;

const OTHER_NODE: &str = "node-other:7000";

/// A generator call's item `index`.
fn item(task: TaskId, index: u64) -> ObjectId {
    task.object_at(index + 1)
}

/// Runs a generator call with `max_retries` on a leased worker; returns
/// the call, the worker and the spec it received.
async fn running_generator(test: &mut SubmitterTest, max_retries: u32) -> (TaskId, Leased, TaskSpec) {
    let task = test.submit_call(options().max_retries(max_retries).generator_backpressure(8));
    test.settle().await;
    let worker = lease_one(test, LOCAL_NODE).await;
    let mut specs = test.tasks(&worker.address);
    assert_eq!(specs.len(), 1);
    (task, worker, specs.remove(0))
}

#[tokio::test(start_paused = true)]
async fn a_retried_generator_skips_the_items_its_caller_has() {
    let mut test = SubmitterTest::start();
    let (task, worker, spec) = running_generator(&mut test, 1).await;
    let call = spec.generator.clone().expect("a generator call says so");
    assert_eq!((call.skip, call.consumed, call.backpressure), (0, 0, 8));
    for index in 0..3 {
        test.yield_item(&worker.address, &spec, index, value(index * 10));
    }
    test.settle().await;
    assert!(
        matches!(test.outcome(item(task, 2)), Some(Ok(_))),
        "the items are objects"
    );
    test.kill(&worker, WorkerExitKind::Signaled);
    test.settle().await;
    let retry = lease_one(&mut test, LOCAL_NODE).await;
    let again = test.tasks(&retry.address);
    assert_eq!(again.len(), 1);
    let call = again[0].generator.clone().expect("the retry is a generator call");
    assert_eq!(
        (again[0].attempt, call.skip),
        (1, 3),
        "the retry skips the 3 items there"
    );
    test.yield_item(&retry.address, &again[0], 1, value(999));
    test.yield_item(&retry.address, &again[0], 3, value(30));
    test.answer(&retry.address, &again[0], value(4));
    test.settle().await;
    assert_eq!(number(test.outcome(item(task, 1))), 10, "an item comes once");
    assert_eq!(number(test.outcome(item(task, 3))), 30);
    assert_eq!(number(test.outcome(task.return_object())), 4);
}

/// A generator call that yielded items 0 and 1 into `OTHER_NODE`'s store
/// and item 2 inline, and finished.
async fn finished_generator(test: &mut SubmitterTest, max_retries: u32) -> (TaskId, Leased) {
    let (task, worker, spec) = running_generator(test, max_retries).await;
    test.yield_item(&worker.address, &spec, 0, stored_value(OTHER_NODE));
    test.yield_item(&worker.address, &spec, 1, stored_value(OTHER_NODE));
    test.yield_item(&worker.address, &spec, 2, value(2));
    test.answer(&worker.address, &spec, value(3));
    test.settle().await;
    assert_eq!(number(test.outcome(task.return_object())), 3);
    (task, worker)
}

#[tokio::test(start_paused = true)]
async fn items_lost_together_are_made_again_by_one_run() {
    let mut test = SubmitterTest::start();
    let (task, worker) = finished_generator(&mut test, 1).await;
    test.reconstruct(item(task, 1))
        .await
        .expect("its generator may run again");
    assert!(test.outcome(item(task, 0)).is_none(), "item 0 was on the same node");
    assert!(test.outcome(item(task, 1)).is_none());
    assert!(test.outcome(item(task, 2)).is_some(), "item 2 was inline");
    let again = test.tasks(&worker.address);
    assert_eq!(again.len(), 1);
    let call = again[0].generator.clone().expect("a generator call");
    assert_eq!(call.rebuild, vec![0, 1], "only the lost items are made");
    test.yield_item(&worker.address, &again[0], 0, stored_value(LOCAL_NODE));
    test.yield_item(&worker.address, &again[0], 1, stored_value(LOCAL_NODE));
    test.answer(&worker.address, &again[0], value(3));
    test.settle().await;
    assert!(matches!(test.outcome(item(task, 0)), Some(Ok(_))));
    assert!(matches!(test.outcome(item(task, 1)), Some(Ok(_))));
}

#[tokio::test(start_paused = true)]
async fn lost_items_fail_when_the_run_that_makes_them_again_fails() {
    let mut test = SubmitterTest::start();
    let (task, worker) = finished_generator(&mut test, 1).await;
    test.reconstruct(item(task, 0))
        .await
        .expect("its generator may run again");
    assert_eq!(test.tasks(&worker.address).len(), 1);
    test.kill(&worker, WorkerExitKind::Signaled);
    test.settle().await;
    for index in [0, 1] {
        assert_eq!(failure(&test, item(task, index)).kind, TaskErrorKind::WorkerCrashed);
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_item_the_new_run_does_not_yield_fails() {
    let mut test = SubmitterTest::start();
    let (task, worker) = finished_generator(&mut test, 1).await;
    test.reconstruct(item(task, 1))
        .await
        .expect("its generator may run again");
    let again = test.tasks(&worker.address);
    test.yield_item(&worker.address, &again[0], 0, stored_value(LOCAL_NODE));
    test.answer(&worker.address, &again[0], value(1));
    test.settle().await;
    assert!(matches!(test.outcome(item(task, 0)), Some(Ok(_))));
    let error = failure(&test, item(task, 1));
    assert!(error.message.contains("yielded only 1 items"), "{error}");
}
