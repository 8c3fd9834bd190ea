//! What the lease manager's unit tests share: the virtual harness (no
//! processes, no sockets, a paused clock) and the checks of what an owner
//! and the launcher saw.

pub(crate) mod harness;

use raylet_proto::WorkerId;
use raylet_proto::v1::LeaseRefusalKind;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;

use self::harness::{Launched, OwnerSession, WorkerPoolTest, worker_address};
use super::NodeManagerError;
use super::leasing::PendingLease;

/// The one event the owner got: a grant of `request_id`; the worker granted.
pub(crate) fn only_grant(owner: &mut OwnerSession, request_id: u64) -> Launched {
    let events = owner.events();
    let [LeaseEvent::Granted(grant)] = &events[..] else {
        panic!("expected a grant of request {request_id}, got {events:?}");
    };
    assert_eq!(grant.request_id, request_id);
    let worker = WorkerId::from_wire(&grant.worker_id).expect("a worker id");
    assert_eq!(grant.worker_address, worker_address(worker));
    Launched { worker, pid: grant.pid }
}

/// Leases a worker to `owner` for `request_id` (one CPU); the worker leased.
pub(crate) async fn lease_one(test: &WorkerPoolTest, owner: &mut OwnerSession, request_id: u64) -> Launched {
    test.leases.request(owner.lease_request(request_id));
    test.settle().await;
    only_grant(owner, request_id)
}

/// The one event the owner got: a refusal of `request_id`; its kind and reason.
pub(crate) fn only_refusal(owner: &mut OwnerSession, request_id: u64) -> (LeaseRefusalKind, String) {
    let events = owner.events();
    let [LeaseEvent::Refused(refused)] = &events[..] else {
        panic!("expected a refusal of request {request_id}, got {events:?}");
    };
    assert_eq!(refused.request_id, request_id);
    (refused.kind(), refused.reason.clone())
}

/// The one worker started since last asked.
pub(crate) fn only_launched(test: &WorkerPoolTest) -> Launched {
    let launched = test.launched();
    let [worker] = launched[..] else {
        panic!("expected one worker started, got {launched:?}");
    };
    worker
}

/// A late registration of `worker`, which the pool gave up, is refused.
pub(crate) fn assert_unknown(test: &WorkerPoolTest, worker: Launched) {
    let late = test.register(worker).expect_err("the pool gave the worker up");
    assert!(
        matches!(late, NodeManagerError::UnknownWorker(id) if id == worker.worker),
        "{late}"
    );
}

/// The text of a launch that failed with "permission denied".
pub(crate) fn permission_denied(test: &WorkerPoolTest) -> String {
    format!("starting a worker from {}: permission denied", test.binary().display())
}

/// Leases a worker that outlives `owner`'s session, then closes the session.
pub(crate) async fn orphaned_actor_host(test: &WorkerPoolTest, mut owner: OwnerSession) -> Launched {
    test.leases.request(PendingLease {
        outlives_session: true,
        ..owner.lease_request(1)
    });
    test.settle().await;
    let host = only_grant(&mut owner, 1);
    test.leases.close_session(owner.id);
    test.settle().await;
    let killed = test.killed();
    assert_eq!(killed.len(), 1, "the session's idle worker is killed with it");
    assert!(!killed.contains(&host.pid), "the actor's host is held for adoption");
    host
}
