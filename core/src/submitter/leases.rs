//! Lease sessions with node managers, one stream each, opened on first use
//! (which also starts watching node deaths), and closed when the node
//! manager ends it or its node dies: the requests out through it are lost,
//! and their tasks fail (those for the local node manager), ask elsewhere,
//! or wait for their placement group to be placed again. A leased worker
//! left idle for [`LEASE_LINGER`] is given back.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use raylet_proto::WorkerId;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{LeaseSessionRequest, ReturnLease};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::events::SubmitterEvent;
use super::{LeaseSession, Submitter};
use crate::objects::owner::Owner;
use crate::task_error::TaskErrorKind;

/// A leased worker with nothing to do is given back after this long.
pub(super) const LEASE_LINGER: Duration = Duration::from_millis(30);

impl Submitter {
    /// The lease session with `node`, opened on first use.
    pub(super) fn session(&mut self, node: &Arc<str>) -> SessionSender<'_> {
        if !self.watching_nodes {
            self.watching_nodes = true;
            crate::submitter::node_watch::spawn(self.owner.ctx.links.head.clone(), self.handle.events.clone());
        }
        if !self.sessions.contains_key(node) {
            let id = self.next_session;
            self.next_session += 1;
            let session = LeaseSession {
                id,
                requests: open_lease_session(&self.owner, self.handle.events.clone(), (node.clone(), id)),
                granted_by: None,
            };
            self.sessions.insert(node.clone(), session);
        }
        SessionSender(&self.sessions[node].requests)
    }

    /// Whether `session` is the open session with `node`.
    pub(super) fn is_current(&self, node: &Arc<str>, session: u64) -> bool {
        self.sessions.get(node).is_some_and(|open| open.id == session)
    }

    /// The session with `node` ended: its requests are lost.
    pub(super) fn close_session(&mut self, node: Arc<str>, reason: String) {
        tracing::warn!(%node, %reason, "lease session closed");
        self.sessions.remove(&node);
        let lost: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| r.node == node)
            .map(|(id, _)| *id)
            .collect();
        let mut shapes = HashSet::new();
        for request_id in lost {
            if let Some(request) = self.take_request(request_id) {
                shapes.insert(request.shape);
            }
        }
        let message = format!("the node manager at {node} is unreachable: {reason}");
        for shape in shapes {
            if let Some(group) = shape.group() {
                self.groups.relocate(&self.owner.ctx, &self.handle.events, group);
            } else if *node == *self.owner.ctx.node_manager {
                self.fail_queued(&shape, TaskErrorKind::WorkerCrashed, &message);
            } else {
                self.dispatch(&shape);
            }
        }
    }

    /// When the next idle lease is due to go back.
    pub(super) fn next_linger_deadline(&self) -> Instant {
        self.workers.values().filter_map(|w| w.idle_since).min().map_or_else(
            || Instant::now() + Duration::from_secs(3600),
            |idle| idle + LEASE_LINGER,
        )
    }

    /// The deadline the loop sleeps until next, noted.
    pub(super) fn arm_linger(&mut self) -> Instant {
        self.armed_linger = self.next_linger_deadline();
        self.armed_linger
    }

    /// Whether the next idle lease is now due before the loop wakes; if
    /// so, that deadline is noted as armed, for the loop to wake for.
    pub(super) fn linger_moved_earlier(&mut self) -> bool {
        let due = self.next_linger_deadline();
        let earlier = due < self.armed_linger;
        if earlier {
            self.armed_linger = due;
        }
        earlier
    }

    /// Gives back the leases idle for [`LEASE_LINGER`] whose class has no
    /// task queued.
    pub(super) fn return_idle_leases(&mut self) {
        let now = Instant::now();
        let expired: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.in_flight.is_empty() && w.idle_since.is_some_and(|t| now >= t + LEASE_LINGER))
            .filter(|(_, w)| self.shapes.get(&w.shape).is_none_or(|s| s.queue.is_empty()))
            .map(|(id, _)| *id)
            .collect();
        for worker_id in expired {
            let Some(worker) = self.forget_worker(worker_id) else {
                continue;
            };
            self.session(&worker.node)
                .send_request(LeaseRequest::ReturnLease(ReturnLease {
                    worker_id: worker_id.as_bytes().to_vec(),
                    worker_failed: worker.dying,
                }));
        }
    }
}

/// A borrowed lease session sender.
pub(super) struct SessionSender<'a>(&'a mpsc::UnboundedSender<LeaseSessionRequest>);

impl SessionSender<'_> {
    pub(super) fn send_request(&self, kind: LeaseRequest) {
        let _ = self.0.send(LeaseSessionRequest { kind: Some(kind) });
    }
}

/// Opens lease session `session` with the node manager at `node`; its
/// events flow into the submitter.
fn open_lease_session(
    owner: &Owner,
    events: mpsc::UnboundedSender<SubmitterEvent>,
    (node, session): (Arc<str>, u64),
) -> mpsc::UnboundedSender<LeaseSessionRequest> {
    // At most MAX_PENDING_LEASES requests per shape are outstanding, and
    // one cancel or return per request or lease.
    let (requests, outbound) = mpsc::unbounded_channel();
    let open = LeaseSessionRequest {
        kind: Some(LeaseRequest::Open(owner.ctx.binary.clone())),
    };
    let _ = requests.send(open);
    let opening = owner.ctx.links.nodes.lease_session(node.clone(), outbound);
    tokio::spawn(async move {
        let result: crate::Result<()> = async {
            let mut inbound = opening.await?;
            while let Some(event) = inbound.next().await {
                let _ = events.send(SubmitterEvent::Lease {
                    node: node.clone(),
                    session,
                    event: event?,
                });
            }
            Ok(())
        }
        .await;
        let reason = match result {
            Ok(()) => "the node manager ended the session".to_string(),
            Err(error) => error.to_string(),
        };
        let _ = events.send(SubmitterEvent::LeaseSessionClosed { node, session, reason });
    });
    requests
}
