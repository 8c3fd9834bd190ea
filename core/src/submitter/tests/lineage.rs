//! Lineage on the virtual cluster: a task whose value is stored is kept
//! to make it again when it is lost, while its retries allow, and dropped
//! when its objects are freed; an inline value is not kept.

use super::harness::SubmitterTest;
use super::{finished, options};
use crate::links::virtual_cluster::{LOCAL_NODE, stored_value, value};
use crate::submitter::NotRebuilt;

#[tokio::test(start_paused = true)]
async fn a_lost_stored_object_is_rebuilt_by_running_its_task_again() {
    let mut test = SubmitterTest::start();
    let (object, worker) = finished(&mut test, options().max_retries(1), stored_value(LOCAL_NODE)).await;
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
async fn a_freed_object_is_no_longer_kept_to_rebuild() {
    let mut test = SubmitterTest::start();
    let (object, worker) = finished(&mut test, options().max_retries(3), stored_value(LOCAL_NODE)).await;
    test.forget_lineage(object);
    test.settle().await;
    assert!(test.reconstruct(object).await.is_err(), "nothing left to run");
    assert!(test.tasks(&worker.address).is_empty(), "the task does not run again");
}

#[tokio::test(start_paused = true)]
async fn a_value_returned_inline_is_not_kept_to_rebuild() {
    let mut test = SubmitterTest::start();
    let (object, worker) = finished(&mut test, options().max_retries(3), value(5)).await;
    assert!(test.reconstruct(object).await.is_err());
    assert!(test.tasks(&worker.address).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_task_that_spent_its_retries_says_so_each_time_its_object_is_lost() {
    let mut test = SubmitterTest::start();
    let (object, worker) = finished(&mut test, options().max_retries(0), stored_value(LOCAL_NODE)).await;
    for asked in 1..=2 {
        let spent = test.reconstruct(object).await;
        assert!(
            matches!(
                spent,
                Err(NotRebuilt::RetriesSpent {
                    runs: 1,
                    max_retries: 0,
                    ..
                })
            ),
            "ask {asked}: {spent:?}"
        );
    }
    assert!(test.tasks(&worker.address).is_empty());
}
