//! Leases that outlive their session (the workers host the head's actors):
//! held for the adoption grace when the session ends, handed to a session
//! that adopts them, and killed when nobody does in time.

use std::sync::Arc;

use raylet_proto::WorkerId;
use raylet_proto::v1::{LeaseRefusalKind, WorkerExitKind};
use tokio::time::Instant;

use super::events::{granted, refused_event, send_to_session};
use super::worker_pool::WorkerState;
use super::{LeaseManager, LeaseState, NO_SESSION};
use crate::worker_process::WorkerEnd;

impl LeaseManager {
    /// Moves the session's leases that outlive it to [`NO_SESSION`] and has
    /// them killed unless adopted within the adoption grace; returns how many.
    pub(super) fn orphan_outliving_leases(self: &Arc<Self>, state: &mut LeaseState, session: u64) -> usize {
        let now = Instant::now();
        let orphans = state
            .workers
            .values_mut()
            .filter(|w| w.session == session && w.state.outlives_session());
        let count = orphans
            .map(|worker| {
                worker.session = NO_SESSION;
                worker.orphaned_at = Some(now);
            })
            .count();
        if count > 0 {
            let (manager, grace) = (Arc::downgrade(self), self.adoption_grace);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                if let Some(manager) = manager.upgrade() {
                    manager.kill_unadopted();
                }
            });
        }
        count
    }

    /// Kills the workers whose leases waited the adoption grace in vain.
    fn kill_unadopted(self: &Arc<Self>) {
        let grace = self.adoption_grace;
        let doomed: Vec<(WorkerId, u32)> = {
            let mut state = self.state();
            let expired: Vec<(WorkerId, u32)> = state
                .workers
                .iter()
                .filter(|(_, w)| w.orphaned_at.is_some_and(|at| at.elapsed() >= grace))
                .map(|(id, w)| (*id, w.pid))
                .collect();
            for (worker_id, _) in &expired {
                let reason = format!("was not adopted within {grace:?} after its lease session ended");
                state
                    .exits
                    .insert(*worker_id, WorkerEnd::new(WorkerExitKind::LeaseRevoked, reason));
            }
            expired
        };
        for (worker_id, pid) in doomed {
            tracing::warn!(%worker_id, pid, "killing a worker whose lease nobody adopted");
            self.launcher.kill(pid);
        }
    }

    /// Hands a lease that outlives its session to `session`: granted under
    /// `request_id` when the worker is still leased here, refused when not.
    pub(crate) fn adopt_lease(&self, session: u64, request_id: u64, worker_id: WorkerId) {
        let mut guard = self.state();
        let state = &mut *guard;
        let grace = self.adoption_grace;
        let adoptable = state.workers.get_mut(&worker_id).filter(|worker| {
            worker.state.outlives_session() && worker.orphaned_at.is_none_or(|at| at.elapsed() < grace)
        });
        let event = match adoptable {
            Some(worker) => {
                worker.session = session;
                worker.orphaned_at = None;
                let WorkerState::Leased { address, .. } = &worker.state else {
                    unreachable!("filtered for leased workers")
                };
                granted(request_id, worker_id, worker, address, &self.context)
            }
            None => {
                let exit = state
                    .exits
                    .get(&worker_id)
                    .map_or("is not held here", |end| end.description.as_str());
                let reason = format!("worker {worker_id} {exit}");
                refused_event(request_id, LeaseRefusalKind::WorkerGone, &reason)
            }
        };
        send_to_session(state, session, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::harness::{ADOPTION_GRACE, WorkerPoolTest};
    use crate::tests::{lease_one, only_grant, only_refusal, orphaned_actor_host};

    #[tokio::test(start_paused = true)]
    async fn a_lease_that_outlives_its_session_is_handed_to_the_session_that_adopts_it() {
        let test = WorkerPoolTest::start(4);
        let owner = test.open_session_with_idle_workers().await;
        let host = orphaned_actor_host(&test, owner).await;
        let mut adopter = test.open_session().expect("the session opens");
        test.leases.adopt_lease(adopter.id, 9, host.worker);
        assert_eq!(only_grant(&mut adopter, 9), host);
        test.advance(ADOPTION_GRACE).await;
        assert!(
            !test.killed().contains(&host.pid),
            "an adopted worker outlives the adoption grace"
        );
        assert_eq!(test.exit_of(host).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn adopting_a_worker_nobody_adopted_within_the_grace_is_refused_as_gone() {
        let test = WorkerPoolTest::start(4);
        let owner = test.open_session_with_idle_workers().await;
        let host = orphaned_actor_host(&test, owner).await;
        test.advance(ADOPTION_GRACE).await;
        assert_eq!(test.killed(), [host.pid]);
        let revoked = "was not adopted within 60s after its lease session ended";
        let end = WorkerEnd::new(WorkerExitKind::LeaseRevoked, revoked);
        assert_eq!(test.exit_of(host).await, Some(end));
        let mut adopter = test.open_session().expect("the session opens");
        test.leases.adopt_lease(adopter.id, 9, host.worker);
        let gone = (
            LeaseRefusalKind::WorkerGone,
            format!("worker {} {revoked}", host.worker),
        );
        assert_eq!(only_refusal(&mut adopter, 9), gone);
        let stranger = WorkerId::random();
        test.leases.adopt_lease(adopter.id, 10, stranger);
        let unknown = (
            LeaseRefusalKind::WorkerGone,
            format!("worker {stranger} is not held here"),
        );
        assert_eq!(only_refusal(&mut adopter, 10), unknown);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_that_does_not_outlive_its_session_cannot_be_adopted() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        let leased = lease_one(&test, &mut owner, 1).await;
        let mut adopter = test.open_session().expect("the session opens");
        test.leases.adopt_lease(adopter.id, 9, leased.worker);
        let refusal = only_refusal(&mut adopter, 9);
        assert_eq!(refusal.0, LeaseRefusalKind::WorkerGone);
    }
}
