//! The out-of-memory monitor's victims: the worker of the newest lease,
//! retriable work first, its end told as an out-of-memory kill.

use raylet_proto::WorkerId;
use raylet_proto::v1::WorkerExitKind;

use super::LeaseManager;
use super::worker_pool::WorkerState;
use crate::worker_process::WorkerEnd;

impl LeaseManager {
    /// Ends the worker of the newest lease, retriable work first, because
    /// the node's memory use (`usage`) is past the threshold. Returns the
    /// worker it ended, if any lease is held.
    pub(crate) fn end_newest_for_memory(&self, usage: &str) -> Option<WorkerId> {
        let mut state = self.state();
        let (worker, pid) = state
            .workers
            .iter()
            .filter_map(|(id, worker)| match worker.state {
                WorkerState::Leased { since, retriable, .. } => Some(((retriable, since), *id, worker.pid)),
                _ => None,
            })
            .max_by_key(|(newest_retriable, _, _)| *newest_retriable)
            .map(|(_, id, pid)| (id, pid))?;
        let reason = format!("was killed by the out-of-memory monitor: {usage}");
        tracing::warn!(%worker, pid, %reason, "ending a worker to free memory");
        state
            .exits
            .insert(worker, WorkerEnd::new(WorkerExitKind::OomKilled, reason));
        drop(state);
        self.launcher.kill(pid);
        Some(worker)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::leasing::PendingLease;
    use crate::tests::harness::WorkerPoolTest;
    use crate::tests::{only_grant, only_launched};

    #[tokio::test(start_paused = true)]
    async fn the_memory_monitor_ends_the_newest_retriable_lease_first_then_the_newest_other() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_idle_workers().await;
        let retriable = |request_id| PendingLease {
            retriable: true,
            ..owner.lease_request(request_id)
        };
        let (older_retriable, newer_retriable) = (retriable(1), retriable(2));
        test.leases.request(older_retriable);
        test.settle().await;
        let older_retriable = only_grant(&mut owner, 1);
        test.advance(Duration::from_secs(1)).await;
        test.leases.request(newer_retriable);
        test.settle().await;
        let newer_retriable = only_grant(&mut owner, 2);
        test.advance(Duration::from_secs(1)).await;
        test.leases.request(owner.lease_request(3));
        test.settle().await;
        test.register(only_launched(&test)).expect("the new worker registers");
        let newest_other = only_grant(&mut owner, 3);
        let usage = "the node's memory was 97.0% used";
        for victim in [newer_retriable, older_retriable, newest_other] {
            assert_eq!(test.leases.end_newest_for_memory(usage), Some(victim.worker));
            assert_eq!(test.killed(), [victim.pid]);
            test.settle().await;
            let reason = format!("was killed by the out-of-memory monitor: {usage}");
            let oom = WorkerEnd::new(WorkerExitKind::OomKilled, reason);
            assert_eq!(test.exit_of(victim).await, Some(oom), "told as OOM, not as its SIGKILL");
        }
        assert_eq!(test.leases.end_newest_for_memory(usage), None, "no lease is left");
    }

    #[tokio::test(start_paused = true)]
    async fn a_starting_or_idle_worker_is_no_victim() {
        let test = WorkerPoolTest::start(4);
        let _idle = test.open_session_with_idle_workers().await;
        let _starting = test.open_session_with_unregistered_workers();
        assert_eq!(test.leases.end_newest_for_memory("97% used"), None);
        assert!(test.killed().is_empty());
    }
}
