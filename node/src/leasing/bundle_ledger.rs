//! What the node's resource ledger holds besides worker leases: placement
//! group bundles (reserved, committed, released, ending the workers leased
//! in them), the holds of job drivers, resized and blocked leases; each
//! change that frees resources answers the requests waiting for them.

use std::sync::Arc;

use raylet_proto::v1::WorkerExitKind;
use raylet_proto::{ResourceSet, WorkerId};

use super::{LeaseManager, LeaseState};
use crate::bundle_ops::{BundleError, BundleOperation};
use crate::worker_process::WorkerEnd;

impl LeaseManager {
    /// The machine's resources and what of them is free, as the head is told.
    pub(crate) fn reported(&self) -> (ResourceSet, ResourceSet) {
        self.state().ledger.reported()
    }

    /// Applies bundle operations in order under one lock, each on its own,
    /// ends the workers leased in released bundles, then grants what the
    /// changes let run.
    pub(crate) fn apply_bundle_ops(
        self: &Arc<Self>,
        ops: Vec<Result<BundleOperation, BundleError>>,
    ) -> Vec<Result<(), BundleError>> {
        let mut ended = Vec::new();
        let results = {
            let mut state = self.state();
            ops.into_iter()
                .map(|op| op.and_then(|op| apply_bundle_op(&mut state, op, &mut ended)))
                .collect()
        };
        if !ended.is_empty() {
            tracing::info!(workers = ?ended, "placement group bundles released; ending their workers");
        }
        ended.into_iter().for_each(|pid| self.launcher.kill(pid));
        self.pump();
        results
    }

    /// Sets `demand` aside for a job's driver under a holder id of its own,
    /// if it fits now.
    pub(crate) fn hold_for_driver(&self, demand: ResourceSet) -> Option<WorkerId> {
        let mut state = self.state();
        if !state.ledger.fits_now(&demand) {
            return None;
        }
        let holder = WorkerId::random();
        state.ledger.hold(holder, demand);
        Some(holder)
    }

    /// Gives back what a job's driver held, and grants what that lets run.
    pub(crate) fn release_driver(self: &Arc<Self>, holder: WorkerId) {
        self.state().ledger.release(holder);
        self.pump();
    }

    /// Changes what a lease of `session` holds; freed resources go to
    /// waiting requests. Leases of other sessions are left alone.
    pub(crate) fn resize_lease(self: &Arc<Self>, session: u64, worker_id: WorkerId, resources: ResourceSet) {
        {
            let mut state = self.state();
            if !state.is_of_session(worker_id, session) {
                return;
            }
            state.ledger.resize(worker_id, resources);
        }
        self.pump();
    }

    pub(crate) fn set_blocked(self: &Arc<Self>, worker_id: WorkerId, blocked: bool) {
        self.state().ledger.set_blocked(worker_id, blocked);
        self.pump();
    }
}

/// Applies one bundle operation to the ledger; the pids of workers leased in
/// released bundles go to `ended`.
fn apply_bundle_op(state: &mut LeaseState, op: BundleOperation, ended: &mut Vec<u32>) -> Result<(), BundleError> {
    match op {
        BundleOperation::Reserve { group, bundles, commit } => {
            state.ledger.reserve_bundles(group, &bundles)?;
            let indexes: Vec<u32> = bundles.iter().map(|(index, _)| *index).collect();
            match commit {
                true => state.ledger.commit_bundles(group, &indexes),
                false => Ok(()),
            }
        }
        BundleOperation::Commit { group, indexes } => state.ledger.commit_bundles(group, &indexes),
        BundleOperation::Release { group, indexes } => {
            let workers = state.ledger.release_bundles(group, &indexes);
            let reason = format!("was ended: its placement group {group} was removed");
            for worker in &workers {
                let end = WorkerEnd::new(WorkerExitKind::LeaseRevoked, reason.clone());
                state.exits.insert(*worker, end);
            }
            ended.extend(
                workers
                    .iter()
                    .filter_map(|worker| state.workers.remove(worker).map(|w| w.pid)),
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use raylet_proto::PlacementGroupId;

    use super::*;
    use crate::tests::harness::{WorkerPoolTest, cpus};
    use crate::tests::{lease_one, only_grant};

    fn reserve(group: PlacementGroupId, cpus_each: &[u64]) -> Result<BundleOperation, BundleError> {
        let bundles = (0..).zip(cpus_each.iter().map(|n| cpus(*n))).collect();
        Ok(BundleOperation::Reserve {
            group,
            bundles,
            commit: true,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn bundles_set_resources_aside_until_released_and_a_bundle_that_does_not_fit_is_refused() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        let (group, other) = (PlacementGroupId::random(), PlacementGroupId::random());
        let results = test
            .leases
            .apply_bundle_ops(vec![reserve(group, &[1, 2]), reserve(other, &[2])]);
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert!(
            matches!(results[1], Err(BundleError::DoNotFit { count: 1 })),
            "{results:?}"
        );
        assert_eq!(test.leases.reported().1, cpus(1));
        test.leases.request(crate::leasing::PendingLease {
            demand: cpus(2),
            ..owner.lease_request(1)
        });
        test.settle().await;
        assert!(owner.events().is_empty(), "the bundles hold what the lease needs");
        let release = BundleOperation::Release {
            group,
            indexes: Vec::new(),
        };
        assert!(test.leases.apply_bundle_ops(vec![Ok(release)])[0].is_ok());
        test.settle().await;
        only_grant(&mut owner, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_driver_holds_what_fits_and_its_release_lets_waiting_leases_run() {
        let test = WorkerPoolTest::start(2);
        let mut owner = test.open_session_with_idle_workers().await;
        assert_eq!(test.leases.hold_for_driver(cpus(3)), None, "more than the node has");
        let holder = test.leases.hold_for_driver(cpus(2)).expect("two CPUs are free");
        test.leases.request(owner.lease_request(1));
        test.settle().await;
        assert!(owner.events().is_empty(), "the driver holds every CPU");
        test.leases.release_driver(holder);
        test.settle().await;
        only_grant(&mut owner, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_resized_only_by_its_own_session() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        let stranger = test.open_session_with_idle_workers().await;
        let leased = lease_one(&test, &mut owner, 1).await;
        test.leases.resize_lease(stranger.id, leased.worker, cpus(3));
        assert_eq!(test.leases.reported().1, cpus(3), "another session's resize is ignored");
        test.leases.resize_lease(owner.id, leased.worker, cpus(3));
        assert_eq!(test.leases.reported().1, cpus(1));
    }
}
