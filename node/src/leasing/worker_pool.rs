//! The worker pool: each worker is starting, idle or leased; a registering
//! worker takes the request it was started for, a returned one goes back
//! idle (or is killed when it failed or too many wait idle), and an idle one
//! of the right session and GPUs is leased before a new one is started.

use std::sync::Arc;

use raylet_proto::WorkerId;
use tokio::time::Instant;

use super::events::{granted, send, send_to_session};
use super::{LeaseManager, LeaseState, PendingLease};
use crate::NodeManagerError;

/// Where a worker is in its life.
pub(super) enum WorkerState {
    /// Started; reserved for a request when `request` is set.
    Starting {
        request: Option<PendingLease>,
    },
    Idle {
        address: String,
    },
    Leased {
        address: String,
        since: Instant,
        /// Its work is retried if the worker dies.
        retriable: bool,
        /// Held when its session ends, for a new session to adopt.
        outlives_session: bool,
    },
}

impl WorkerState {
    /// The address of its task stream, once it registered.
    pub(super) fn address(&self) -> Option<&str> {
        match self {
            WorkerState::Starting { .. } => None,
            WorkerState::Idle { address } | WorkerState::Leased { address, .. } => Some(address),
        }
    }

    /// Leased, for `pending`, at `address`, from now on.
    fn leased(address: String, pending: &PendingLease) -> Self {
        WorkerState::Leased {
            address,
            since: Instant::now(),
            retriable: pending.retriable,
            outlives_session: pending.outlives_session,
        }
    }

    /// Leased under a lease that is held for adoption when its session ends.
    pub(super) fn outlives_session(&self) -> bool {
        matches!(
            self,
            WorkerState::Leased {
                outlives_session: true,
                ..
            }
        )
    }
}

/// A worker this node started.
pub(super) struct Worker {
    /// [`NO_SESSION`](super::NO_SESSION) while its lease waits to be adopted.
    pub(super) session: u64,
    /// When its session ended and left its lease to be adopted.
    pub(super) orphaned_at: Option<Instant>,
    pub(super) pid: u32,
    /// The GPUs in its `CUDA_VISIBLE_DEVICES`: it serves only leases given these.
    pub(super) gpu_ids: Vec<u32>,
    pub(super) state: WorkerState,
    /// It owns objects still referenced: ending it would lose them.
    owns_objects: bool,
    /// Its owner service's address, once it registered.
    owner_address: Option<String>,
}

impl Worker {
    /// A worker of `session` just started, reserved for `request` if given.
    pub(super) fn starting(session: u64, pid: u32, gpu_ids: Vec<u32>, request: Option<PendingLease>) -> Self {
        Worker {
            session,
            orphaned_at: None,
            pid,
            gpu_ids,
            state: WorkerState::Starting { request },
            owns_objects: false,
            owner_address: None,
        }
    }

    /// Removes its same-node socket files, once it is gone (a worker
    /// killed cannot remove its own).
    pub(super) fn remove_socket_files(&self) {
        let addresses = self.state.address().into_iter().chain(self.owner_address.as_deref());
        addresses.for_each(raylet_proto::local_socket::remove_socket_of);
    }

    /// Removes its same-node socket files before it is killed: those it
    /// told its addresses for, and, while it is still starting and has not
    /// told them, those it listens on already.
    pub(super) fn remove_socket_files_before_kill(&self) {
        self.remove_socket_files();
        if self.state.address().is_none() {
            raylet_proto::local_socket::remove_sockets_of_process(self.pid);
        }
    }
}

impl LeaseManager {
    /// A started worker reports its addresses (its task stream's, its
    /// owner service's): it takes the request it was started for, or waits
    /// idle.
    pub(crate) fn register_worker(
        self: &Arc<Self>,
        worker_id: WorkerId,
        address: String,
        owner_address: String,
    ) -> Result<(), NodeManagerError> {
        let mut guard = self.state();
        let state = &mut *guard;
        let worker = state
            .workers
            .get_mut(&worker_id)
            .ok_or(NodeManagerError::UnknownWorker(worker_id))?;
        let session = worker.session;
        worker.owner_address = Some(owner_address);
        let idle = WorkerState::Idle {
            address: address.clone(),
        };
        let grant = match std::mem::replace(&mut worker.state, idle) {
            WorkerState::Starting { request: Some(pending) } => {
                worker.state = WorkerState::leased(address.clone(), &pending);
                Some(pending.request_id)
            }
            _ => None,
        };
        if let Some(session) = state.sessions.get_mut(&session) {
            session.startup_failures = 0;
            if let (Some(request_id), Some(worker)) = (grant, state.workers.get(&worker_id)) {
                let event = granted(request_id, worker_id, worker, &address, &self.context);
                send(&session.events, event);
            }
        }
        drop(guard);
        self.pump();
        Ok(())
    }

    /// The owner is done with `worker`: it becomes idle, or is killed when
    /// it failed or the session already has enough idle workers (unless it
    /// owns objects that are still referenced). A worker of another session
    /// is left alone.
    pub(crate) fn return_lease(self: &Arc<Self>, session: u64, worker_id: WorkerId, failed: bool) {
        let kill_pid = {
            let mut state = self.state();
            if !state.is_of_session(worker_id, session) {
                return;
            }
            state.ledger.release(worker_id);
            let max_idle = max_idle_workers(&state);
            let idle = state
                .workers
                .values()
                .filter(|w| w.session == session && matches!(w.state, WorkerState::Idle { .. }))
                .count();
            match state.workers.get_mut(&worker_id) {
                Some(worker) if worker.session == session => match &worker.state {
                    WorkerState::Leased { address, .. } if !failed && (idle < max_idle || worker.owns_objects) => {
                        worker.state = WorkerState::Idle {
                            address: address.clone(),
                        };
                        None
                    }
                    _ => Some(worker.pid),
                },
                _ => None,
            }
        };
        if let Some(pid) = kill_pid {
            tracing::debug!(%worker_id, pid, failed, "killing a returned worker");
            self.launcher.kill(pid);
        }
        self.pump();
    }

    pub(crate) fn set_owns_objects(&self, worker_id: WorkerId, owns: bool) {
        if let Some(worker) = self.state().workers.get_mut(&worker_id) {
            worker.owns_objects = owns;
        }
    }

    /// Leases an idle worker of the session that sees the GPUs the request
    /// is given, or hands the request back.
    pub(super) fn grant_idle(&self, state: &mut LeaseState, pending: PendingLease) -> Option<PendingLease> {
        let gpu_ids = state.ledger.gpu_ids_for(&pending.demand).unwrap_or_default();
        let idle = state.workers.iter_mut().find(|(_, w)| {
            w.session == pending.session && w.gpu_ids == gpu_ids && matches!(w.state, WorkerState::Idle { .. })
        });
        let Some((worker_id, worker)) = idle else {
            return Some(pending);
        };
        let worker_id = *worker_id;
        let WorkerState::Idle { address } = &worker.state else {
            unreachable!("filtered for idle workers")
        };
        let address = address.clone();
        worker.state = WorkerState::leased(address.clone(), &pending);
        state.ledger.hold(worker_id, pending.demand);
        let event = granted(pending.request_id, worker_id, worker, &address, &self.context);
        send_to_session(state, pending.session, event);
        None
    }

    /// Ends every lease session (their owners see their streams end) and
    /// kills every worker, as the node shuts down, removing their
    /// same-node socket files (no exit of theirs is recorded after this).
    pub(crate) fn shut_down(&self) {
        let pids: Vec<u32> = {
            let mut state = self.state();
            state.sessions.clear();
            state.workers.values().for_each(Worker::remove_socket_files_before_kill);
            state.workers.values().map(|w| w.pid).collect()
        };
        pids.into_iter().for_each(|pid| self.launcher.kill(pid));
    }

    /// The id and pid of every worker of this node.
    pub(crate) fn workers(&self) -> Vec<(WorkerId, u32)> {
        self.state()
            .workers
            .iter()
            .map(|(id, worker)| (*id, worker.pid))
            .collect()
    }

    /// Kills every worker, keeping the sessions: the node's old incarnation
    /// was counted dead and its work failed or retried elsewhere. Returns
    /// how many there were.
    pub(crate) fn kill_all_workers(&self) -> usize {
        let pids: Vec<u32> = self.state().workers.values().map(|w| w.pid).collect();
        pids.iter().for_each(|pid| self.launcher.kill(*pid));
        pids.len()
    }
}

/// The most idle workers a session keeps: one per CPU, at least two.
fn max_idle_workers(state: &LeaseState) -> usize {
    state
        .ledger
        .total()
        .get(raylet_proto::resources::CPU)
        .as_f64()
        .ceil()
        .max(2.0) as usize
}

#[cfg(test)]
mod tests {
    use crate::tests::harness::{WorkerPoolTest, cpus};
    use crate::tests::{lease_one, only_grant, only_launched};

    #[tokio::test(start_paused = true)]
    async fn a_registering_worker_takes_the_lease_it_was_started_for() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_unregistered_workers();
        test.leases.request(owner.lease_request(1));
        test.settle().await;
        let worker = only_launched(&test);
        assert!(
            owner.events().is_empty(),
            "nothing is granted before the worker registers"
        );
        test.register(worker).expect("a started worker registers");
        test.settle().await;
        assert_eq!(only_grant(&mut owner, 1), worker);
    }

    #[tokio::test(start_paused = true)]
    async fn a_returned_worker_waits_idle_for_the_next_lease_and_a_failed_one_is_killed() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        let first = lease_one(&test, &mut owner, 1).await;
        test.leases.return_lease(owner.id, first.worker, false);
        test.settle().await;
        assert!(test.killed().is_empty(), "a worker returned healthy is kept");
        assert_eq!(test.leases.reported().1, cpus(4), "its lease is freed");
        let second = lease_one(&test, &mut owner, 2).await;
        test.leases.return_lease(owner.id, second.worker, true);
        test.settle().await;
        assert_eq!(test.killed(), [second.pid], "a worker returned failed is killed");
        assert!(
            test.launched().is_empty(),
            "no worker was started: the idle ones served"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_cannot_return_a_worker_another_session_leased() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        let stranger = test.open_session_with_idle_workers().await;
        let leased = lease_one(&test, &mut owner, 1).await;
        test.leases.return_lease(stranger.id, leased.worker, true);
        test.settle().await;
        assert!(test.killed().is_empty(), "the lease is the owner's");
        assert_eq!(test.leases.reported().1, cpus(3), "the lease still holds its CPU");
    }

    #[tokio::test(start_paused = true)]
    async fn killing_every_worker_counts_them() {
        let test = WorkerPoolTest::start(4);
        let _owner = test.open_session_with_idle_workers().await;
        assert_eq!(test.leases.kill_all_workers(), 2);
        assert_eq!(test.killed().len(), 2);
    }
}
