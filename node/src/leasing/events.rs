//! The lease events a session's owner gets (grants, refusals, spillbacks),
//! each counted in the node's lease-reply metric as it is made.

use std::sync::atomic::Ordering;

use raylet_proto::WorkerId;
use raylet_proto::peer_stream::PeerSender;
use raylet_proto::v1::lease_session_event::Kind as EventKind;
use raylet_proto::v1::{LeaseGranted, LeaseRefusalKind, LeaseRefused, LeaseSessionEvent, LeaseSpillback};

use super::worker_pool::Worker;
use super::{LeaseState, WorkerContext};

/// Where a session's lease events go.
pub(crate) type EventSender = PeerSender<LeaseSessionEvent>;

/// Lease requests this process's node manager answered, by how.
static LEASE_REPLIES: std::sync::LazyLock<prometheus::IntCounterVec> = std::sync::LazyLock::new(|| {
    raylet_common::metrics::counter(
        "raylet_node_lease_replies_total",
        "Lease requests this node answered: granted, refused or spilled back to another node",
        &["outcome"],
    )
});

/// `worker`, at `address` on `node`, is leased for `request_id`.
pub(super) fn granted(
    request_id: u64,
    worker_id: WorkerId,
    worker: &Worker,
    address: &str,
    node: &WorkerContext,
) -> EventKind {
    LEASE_REPLIES.with_label_values(&["granted"]).inc();
    EventKind::Granted(LeaseGranted {
        request_id,
        worker_id: worker_id.as_bytes().to_vec(),
        worker_address: address.to_string(),
        node_id: node.node_id.as_bytes().to_vec(),
        pid: worker.pid,
        incarnation: node.incarnation.load(Ordering::Acquire),
    })
}

/// `request_id` is refused, as `kind` says, for `reason`.
pub(super) fn refused_event(request_id: u64, kind: LeaseRefusalKind, reason: &str) -> EventKind {
    LEASE_REPLIES.with_label_values(&["refused"]).inc();
    EventKind::Refused(LeaseRefused {
        request_id,
        reason: reason.to_string(),
        kind: kind as i32,
    })
}

/// `request_id` should go to the node at `node_address`.
pub(super) fn spilled_event(request_id: u64, node_address: String) -> EventKind {
    LEASE_REPLIES.with_label_values(&["spilled_back"]).inc();
    EventKind::Spillback(LeaseSpillback {
        request_id,
        node_address,
    })
}

/// Sends `event` to `session`'s owner, if the session is still open.
pub(super) fn send_to_session(state: &LeaseState, session: u64, event: EventKind) {
    if let Some(entry) = state.sessions.get(&session) {
        send(&entry.events, event);
    }
}

/// Sends `event` down a session's stream; an owner that is gone misses it.
pub(super) fn send(events: &EventSender, event: EventKind) {
    let _ = events.send(Ok(LeaseSessionEvent { kind: Some(event) }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(outcome: &str) -> u64 {
        LEASE_REPLIES.with_label_values(&[outcome]).get()
    }

    #[test]
    fn a_refusal_carries_its_kind_and_reason_and_is_counted() {
        let before = replies("refused");
        let EventKind::Refused(refused) = refused_event(4, LeaseRefusalKind::Infeasible, "too big") else {
            panic!("a refusal is a refused event");
        };
        assert_eq!(
            (refused.request_id, refused.kind(), refused.reason.as_str()),
            (4, LeaseRefusalKind::Infeasible, "too big")
        );
        assert!(replies("refused") > before, "the refusal is counted");
    }

    #[test]
    fn a_spillback_names_the_node_the_request_goes_to_and_is_counted() {
        let before = replies("spilled_back");
        let EventKind::Spillback(spilled) = spilled_event(5, "b:1".into()) else {
            panic!("a spillback is a spillback event");
        };
        assert_eq!((spilled.request_id, spilled.node_address.as_str()), (5, "b:1"));
        assert!(replies("spilled_back") > before, "the spillback is counted");
    }
}
