//! A worker's life from its launch to its exit: it is started through the
//! launcher, killed if it does not register in time, and its end is
//! recorded (unless the node ended it and said why first), freeing what its
//! lease held and retrying the request it was started for.

use std::sync::Arc;
use std::time::Duration;

use raylet_proto::WorkerId;
use raylet_proto::v1::WorkerExitKind;

use super::worker_pool::{Worker, WorkerState};
use super::{LeaseManager, PendingLease};
use crate::NodeManagerError;
use crate::worker_launcher::{LaunchedWorker, WorkerExited};
use crate::worker_process::WorkerEnd;

/// A worker that has not registered by then is killed.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(30);
/// The most worker ends remembered; the record starts over past it.
const MAX_REMEMBERED_EXITS: usize = 4096;

impl LeaseManager {
    /// Starts a worker for `session`, reserved for `request` when given,
    /// and watches it: its exit is recorded, and it is killed if it does not
    /// register in time.
    pub(super) fn spawn_worker(
        self: &Arc<Self>,
        worker_id: WorkerId,
        session: u64,
        request: Option<PendingLease>,
        gpu_ids: Vec<u32>,
    ) -> Result<(), NodeManagerError> {
        let (binary, bootstrap) = self.bootstrap(worker_id, session, gpu_ids.clone())?;
        let LaunchedWorker { pid, exited } = self.launcher.launch(&binary, &bootstrap)?;
        let worker = Worker::starting(session, pid, gpu_ids, request);
        self.state().workers.insert(worker_id, worker);
        self.record_exit(worker_id, exited);
        self.kill_if_unregistered(worker_id, pid);
        Ok(())
    }

    /// How `worker_id` exited, waiting up to `patience` for it to be reaped.
    pub(crate) async fn worker_exit(&self, worker_id: WorkerId, patience: Duration) -> Option<WorkerEnd> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(exit) = self.state().exits.get(&worker_id) {
                return Some(exit.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Records how the worker ended once it is gone.
    fn record_exit(self: &Arc<Self>, worker_id: WorkerId, exited: WorkerExited) {
        let manager = Arc::clone(self);
        tokio::spawn(async move {
            let end = exited.await;
            manager.worker_exited(worker_id, end);
        });
    }

    /// Records how the worker ended, unless the node ended it and recorded
    /// why already.
    fn worker_exited(self: &Arc<Self>, worker_id: WorkerId, end: WorkerEnd) {
        let mut state = self.state();
        state.ledger.release(worker_id);
        if state.exits.len() >= MAX_REMEMBERED_EXITS {
            state.exits.clear();
        }
        let description = state.exits.entry(worker_id).or_insert(end).description.clone();
        let Some(worker) = state.workers.remove(&worker_id) else {
            return;
        };
        tracing::debug!(%worker_id, pid = worker.pid, %description, "worker exited");
        worker.remove_socket_files();
        if let WorkerState::Starting { request } = worker.state {
            self.startup_failed(&mut state, worker.session, request, &description);
        }
        drop(state);
        self.pump();
    }

    /// Kills the worker if it has not registered within [`REGISTRATION_TIMEOUT`].
    fn kill_if_unregistered(self: &Arc<Self>, worker_id: WorkerId, pid: u32) {
        let manager = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(REGISTRATION_TIMEOUT).await;
            let mut state = manager.state();
            let stuck = matches!(
                state.workers.get(&worker_id),
                Some(Worker {
                    state: WorkerState::Starting { .. },
                    ..
                })
            );
            if stuck {
                tracing::warn!(%worker_id, pid, "worker did not register in time; killing it");
                let reason = format!("did not register within {REGISTRATION_TIMEOUT:?} of its start");
                let end = WorkerEnd::new(WorkerExitKind::StartTimedOut, reason);
                state.exits.insert(worker_id, end);
                drop(state);
                manager.launcher.kill(pid);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use raylet_proto::v1::LeaseRefusalKind;
    use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;

    use super::*;
    use crate::tests::harness::{WorkerPoolTest, cpus};
    use crate::tests::{assert_unknown, lease_one, only_grant, only_launched, only_refusal, permission_denied};
    use crate::worker_process::describe_exit;

    #[tokio::test(start_paused = true)]
    async fn a_lease_whose_worker_cannot_be_started_is_refused_saying_why() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_unregistered_workers();
        test.refuse_launches_after(0, io::ErrorKind::PermissionDenied);
        test.leases.request(owner.lease_request(1));
        test.settle().await;
        let refusal = (LeaseRefusalKind::WorkerStartFailed, permission_denied(&test));
        assert_eq!(only_refusal(&mut owner, 1), refusal);
        assert_eq!(test.leases.reported().1, cpus(4), "the refused lease holds nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_never_registers_is_killed_at_the_timeout_and_its_lease_goes_to_a_new_one() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        for request_id in 1..=3 {
            test.leases.request(owner.lease_request(request_id));
        }
        test.settle().await;
        let granted: Vec<u64> = owner
            .events()
            .iter()
            .map(|event| match event {
                LeaseEvent::Granted(grant) => grant.request_id,
                other => panic!("expected grants to the idle workers, got {other:?}"),
            })
            .collect();
        assert_eq!(granted, [1, 2]);
        let hung = only_launched(&test);
        test.advance(REGISTRATION_TIMEOUT - Duration::from_millis(2)).await;
        assert!(test.killed().is_empty(), "killed before its registration timeout");
        test.advance(Duration::from_millis(2)).await;
        assert_eq!(test.killed(), [hung.pid]);
        let timed_out = WorkerEnd::new(
            WorkerExitKind::StartTimedOut,
            "did not register within 30s of its start",
        );
        assert_eq!(test.exit_of(hung).await, Some(timed_out));
        assert!(owner.events().is_empty(), "one failed start does not refuse the lease");
        assert_unknown(&test, hung);
        let replacement = only_launched(&test);
        test.register(replacement).expect("the new worker registers");
        test.settle().await;
        assert_eq!(only_grant(&mut owner, 3), replacement);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leased_worker_that_dies_frees_its_resources_and_its_end_is_told() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        let worker = lease_one(&test, &mut owner, 1).await;
        assert_eq!(test.leases.reported().1, cpus(3));
        test.exit(worker, describe_exit(ExitStatus::from_raw(11)));
        test.settle().await;
        let crashed = WorkerEnd::new(WorkerExitKind::Signaled, "was killed by signal 11 (SIGSEGV)");
        assert_eq!(test.exit_of(worker).await, Some(crashed));
        assert_eq!(test.leases.reported().1, cpus(4));
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_a_worker_the_node_never_started_is_not_known() {
        let test = WorkerPoolTest::start(4);
        let stranger = WorkerId::random();
        assert_eq!(test.leases.worker_exit(stranger, Duration::from_millis(50)).await, None);
    }
}
