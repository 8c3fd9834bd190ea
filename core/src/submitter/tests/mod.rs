//! Unit tests of the submitter on virtual node managers and workers: no
//! processes, no sockets, a paused clock. One file per part of the
//! submitter; the helpers every part uses are here.

mod cancellation;
mod dispatch;
mod generators;
pub(super) mod harness;
mod leases;
mod lineage;
mod retries;

use raylet_proto::ObjectId;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{LeaseSpillback, TaskSpec};

use self::harness::{SubmitterTest, lease_request_ids};
use crate::links::virtual_cluster::{LOCAL_NODE, Leased};
use crate::submitter::task::TaskOptions;
use crate::task_error::TaskError;
use crate::value::Outcome;

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

/// Submits a task with `options` and leases it a worker at the local node;
/// returns its object, the worker and the task as the worker received it.
async fn running(test: &mut SubmitterTest, options: TaskOptions) -> (ObjectId, Leased, TaskSpec) {
    let object = test.submit(options);
    test.settle().await;
    let worker = lease_one(test, LOCAL_NODE).await;
    let mut tasks = test.tasks(&worker.address);
    assert_eq!(tasks.len(), 1, "the worker runs the task");
    (object, worker, tasks.remove(0))
}

/// Runs a task with `options` to `outcome` on a worker leased at the local
/// node; returns its object and the worker.
async fn finished(test: &mut SubmitterTest, options: TaskOptions, outcome: Outcome) -> (ObjectId, Leased) {
    let (object, worker, task) = running(test, options).await;
    test.answer(&worker.address, &task, outcome);
    test.settle().await;
    (object, worker)
}

/// The error `object` failed with.
fn failure(test: &SubmitterTest, object: ObjectId) -> TaskError {
    match test.outcome(object) {
        Some(Err(error)) => error,
        other => panic!("expected a failed task, got {:?}", other.map(|o| o.map(|_| "a value"))),
    }
}

/// The leases given back among `requests`: whether each went back as failed.
fn returns(requests: &[LeaseRequest]) -> Vec<bool> {
    requests
        .iter()
        .filter_map(|r| match r {
            LeaseRequest::ReturnLease(returned) => Some(returned.worker_failed),
            _ => None,
        })
        .collect()
}
