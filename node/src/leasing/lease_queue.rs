//! The queue of lease requests: each request joins it, and every change
//! that may let one run pumps it, granting, spilling back or refusing what
//! it can in order; a shape that must wait holds back the later requests of
//! the same shape.

use std::sync::Arc;

use raylet_proto::v1::LeaseRefusalKind;
use raylet_proto::{Error, ResourceSet, Scheduling, WorkerId};

use super::demand::remember_infeasible;
use super::events::{refused_event, send_to_session, spilled_event};
use super::spillback::{Decision, decide};
use super::worker_pool::WorkerState;
use super::{LeaseManager, LeaseState, PendingLease};

/// A new worker to start for a granted request, with the GPUs it holds.
type WorkerToStart = (WorkerId, PendingLease, Vec<u32>);

impl LeaseManager {
    /// Queues `pending`, seen with the current cluster view, and grants
    /// what it can.
    pub(crate) fn request(self: &Arc<Self>, mut pending: PendingLease) {
        let mut state = self.state();
        pending.view = state.view;
        state.queue.push_back(pending);
        drop(state);
        self.pump();
    }

    /// Answers a request that could not be decoded, so its owner is not left waiting.
    pub(crate) fn refuse_malformed(&self, session: u64, request_id: u64, error: &Error) {
        let reason = format!("the lease request is malformed: {error}");
        let event = refused_event(request_id, LeaseRefusalKind::Unschedulable, &reason);
        send_to_session(&self.state(), session, event);
    }

    /// Drops `session`'s request `request_id`, whether it waits in the
    /// queue or for the worker started for it.
    pub(crate) fn cancel_request(self: &Arc<Self>, session: u64, request_id: u64) {
        let mut state = self.state();
        state
            .queue
            .retain(|p| !(p.session == session && p.request_id == request_id));
        let reserved = state.workers.iter_mut().find_map(|(id, worker)| match &worker.state {
            WorkerState::Starting { request: Some(p) } if p.session == session && p.request_id == request_id => {
                worker.state = WorkerState::Starting { request: None };
                Some(*id)
            }
            _ => None,
        });
        if let Some(worker) = reserved {
            state.ledger.release(worker);
        }
        drop(state);
        self.pump();
    }

    /// Grants, spills back or refuses whatever queued requests it can.
    pub(super) fn pump(self: &Arc<Self>) {
        let to_start = {
            let mut guard = self.state();
            self.answer_queue(&mut guard)
        };
        for (worker_id, pending, gpu_ids) in to_start {
            let session = pending.session;
            let request_id = pending.request_id;
            if let Err(error) = self.spawn_worker(worker_id, session, Some(pending), gpu_ids) {
                self.state().ledger.release(worker_id);
                let state = self.state();
                let event = refused_event(request_id, LeaseRefusalKind::WorkerStartFailed, &error.to_string());
                send_to_session(&state, session, event);
            }
        }
    }

    /// Answers the queued requests that need not wait; returns the workers
    /// to start for those granted that no idle worker took.
    fn answer_queue(&self, state: &mut LeaseState) -> Vec<WorkerToStart> {
        let mut to_start = Vec::new();
        let available = state.ledger.available();
        state.cluster.set_available(state.local, &available);
        let mut waiting: Vec<(ResourceSet, Scheduling)> = Vec::new();
        let mut index = 0;
        while index < state.queue.len() {
            let pending = state.queue[index].clone();
            let class = (pending.demand.clone(), pending.scheduling.clone());
            let decision = match waiting.contains(&class) {
                true => Decision::Wait,
                false => decide(state, &pending),
            };
            if matches!(decision, Decision::Wait) {
                waiting.push(class);
                index += 1;
                continue;
            }
            state.queue.remove(index);
            match decision {
                Decision::Grant => {
                    let demand = state.cluster.demand(&pending.demand);
                    state.cluster.subtract(state.local, &demand);
                    if let Some(pending) = self.grant_idle(state, pending) {
                        let worker_id = WorkerId::random();
                        let gpu_ids = state.ledger.hold(worker_id, pending.demand.clone());
                        to_start.push((worker_id, pending, gpu_ids));
                    }
                }
                Decision::Spill(address) => {
                    let event = spilled_event(pending.request_id, address);
                    send_to_session(state, pending.session, event);
                }
                Decision::Refuse(kind, reason) => {
                    if kind == LeaseRefusalKind::Infeasible {
                        remember_infeasible(&mut state.infeasible, &pending, &reason);
                    }
                    send_to_session(state, pending.session, refused_event(pending.request_id, kind, &reason));
                }
                Decision::Wait => unreachable!("waiting requests stay queued"),
            }
        }
        to_start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::harness::{Launched, OwnerSession, WorkerPoolTest, cpus};
    use crate::tests::{only_grant, only_launched, only_refusal};

    /// On a node with one CPU, `owner` asks for two leases: the first is
    /// granted (its worker returned), the second waits.
    async fn granted_with_one_waiting(test: &WorkerPoolTest, owner: &mut OwnerSession) -> Launched {
        test.leases.request(owner.lease_request(1));
        test.leases.request(owner.lease_request(2));
        test.settle().await;
        only_grant(owner, 1)
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_room_and_is_granted_when_a_lease_is_returned() {
        let test = WorkerPoolTest::start(1);
        let mut owner = test.open_session_with_idle_workers().await;
        let first = granted_with_one_waiting(&test, &mut owner).await;
        assert_eq!(test.leases.demands().len(), 1, "the second request waits");
        test.leases.return_lease(owner.id, first.worker, false);
        test.settle().await;
        only_grant(&mut owner, 2);
        assert!(test.leases.demands().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_request_is_never_granted() {
        let test = WorkerPoolTest::start(1);
        let mut owner = test.open_session_with_idle_workers().await;
        let first = granted_with_one_waiting(&test, &mut owner).await;
        test.leases.cancel_request(owner.id, 2);
        test.leases.return_lease(owner.id, first.worker, false);
        test.settle().await;
        assert!(owner.events().is_empty(), "the cancelled request got an answer");
        assert!(test.leases.demands().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_the_request_a_new_worker_was_started_for_frees_what_it_held() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_unregistered_workers();
        test.leases.request(owner.lease_request(1));
        test.settle().await;
        let started = only_launched(&test);
        test.leases.cancel_request(owner.id, 1);
        assert_eq!(test.leases.reported().1, cpus(4));
        test.register(started).expect("the worker registers");
        test.settle().await;
        assert!(owner.events().is_empty(), "the worker waits idle, granting nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_malformed_request_is_refused_as_unschedulable_saying_why() {
        let test = WorkerPoolTest::start(1);
        let mut owner = test.open_session_with_idle_workers().await;
        let error = Error::InvalidArgument("a negative CPU count".into());
        test.leases.refuse_malformed(owner.id, 3, &error);
        let (kind, reason) = only_refusal(&mut owner, 3);
        assert_eq!(kind, LeaseRefusalKind::Unschedulable);
        assert!(
            reason.contains("malformed") && reason.contains("a negative CPU count"),
            "{reason}"
        );
    }
}
