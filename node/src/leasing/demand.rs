//! The demand this node reports to the head for `raylet status` and the
//! autoscaler: the requests waiting here and the backlogs owners reported,
//! by shape, and the shapes refused lately because no node could ever fit
//! them.

use std::time::Duration;

use raylet_cluster_status::ResourceDemand;
use raylet_proto::{ResourceSet, Scheduling};
use tokio::time::Instant;

use super::{LeaseManager, PendingLease};

/// How long an infeasible request stays listed in `raylet status`.
const INFEASIBLE_MEMORY: Duration = Duration::from_secs(300);
/// The most infeasible shapes listed at once.
const MAX_INFEASIBLE_SHAPES: usize = 50;

/// Requests of one shape refused as infeasible, for `raylet status`.
pub(super) struct RefusedDemand {
    demand: ResourceSet,
    scheduling: Scheduling,
    count: u64,
    reason: String,
    last: Instant,
}

impl LeaseManager {
    /// The requests waiting here and the backlogs owners reported, by
    /// shape, and those refused lately because no node could ever fit them.
    pub(crate) fn demands(&self) -> Vec<ResourceDemand> {
        let mut state = self.state();
        state
            .infeasible
            .retain(|refused| refused.last.elapsed() < INFEASIBLE_MEMORY);
        let mut demands: Vec<ResourceDemand> = Vec::new();
        let queued = state
            .queue
            .iter()
            .map(|pending| (&pending.demand, &pending.scheduling, 1));
        let backlogged = state
            .backlogs
            .iter()
            .map(|((_, demand, scheduling), count)| (demand, scheduling, *count));
        for (shape, scheduling, count) in queued.chain(backlogged) {
            add_waiting(&mut demands, shape, scheduling, count);
        }
        demands.extend(state.infeasible.iter().map(|refused| ResourceDemand {
            shape: refused.demand.clone(),
            constraint: refused.scheduling.to_string(),
            count: refused.count,
            infeasible: true,
            reason: refused.reason.clone(),
            scheduling: refused.scheduling.clone(),
            group: None,
        }));
        demands
    }

    /// Records the tasks `session`'s owner has queued beyond its requests.
    pub(crate) fn set_backlog(&self, session: u64, demand: ResourceSet, scheduling: Scheduling, backlog: u64) {
        let mut state = self.state();
        let key = (session, demand, scheduling);
        match backlog {
            0 => state.backlogs.remove(&key),
            count => state.backlogs.insert(key, count),
        };
    }
}

/// Counts `count` waiting tasks of a shape with the others of that shape.
fn add_waiting(demands: &mut Vec<ResourceDemand>, shape: &ResourceSet, scheduling: &Scheduling, count: u64) {
    let constraint = scheduling.to_string();
    match demands
        .iter_mut()
        .find(|d| d.shape == *shape && d.constraint == constraint)
    {
        Some(demand) => demand.count += count,
        None => demands.push(ResourceDemand {
            shape: shape.clone(),
            constraint,
            count,
            infeasible: false,
            reason: String::new(),
            scheduling: scheduling.clone(),
            group: None,
        }),
    }
}

/// Counts an infeasible refusal with the others of its shape.
pub(super) fn remember_infeasible(refused: &mut Vec<RefusedDemand>, pending: &PendingLease, reason: &str) {
    let same = refused
        .iter()
        .position(|r| r.demand == pending.demand && r.scheduling == pending.scheduling);
    match same {
        Some(index) => {
            refused[index].count += 1;
            refused[index].last = Instant::now();
        }
        None if refused.len() < MAX_INFEASIBLE_SHAPES => refused.push(RefusedDemand {
            demand: pending.demand.clone(),
            scheduling: pending.scheduling.clone(),
            count: 1,
            reason: reason.to_string(),
            last: Instant::now(),
        }),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::harness::{WorkerPoolTest, cpus};
    use crate::tests::{only_grant, only_refusal};

    #[tokio::test(start_paused = true)]
    async fn reported_backlogs_count_as_demand_with_the_queued_requests_until_the_session_ends() {
        let test = WorkerPoolTest::start(1);
        let mut owner = test.open_session_with_idle_workers().await;
        let other = test.open_session_with_idle_workers().await;
        test.leases.request(owner.lease_request(1));
        test.leases.request(owner.lease_request(2));
        test.settle().await;
        only_grant(&mut owner, 1);
        let manager = &test.leases;
        manager.set_backlog(owner.id, cpus(1), Scheduling::default(), 40);
        manager.set_backlog(other.id, cpus(1), Scheduling::default(), 9);
        manager.set_backlog(other.id, cpus(4), Scheduling::default(), 3);
        let counts = |manager: &LeaseManager| {
            let mut counts: Vec<(String, u64)> = manager
                .demands()
                .iter()
                .map(|d| (format!("{:?}", d.shape), d.count))
                .collect();
            counts.sort();
            counts
        };
        let (one, four) = (format!("{:?}", cpus(1)), format!("{:?}", cpus(4)));
        assert_eq!(counts(manager), [(one.clone(), 50), (four.clone(), 3)]);
        manager.set_backlog(owner.id, cpus(1), Scheduling::default(), 0);
        assert_eq!(counts(manager), [(one, 10), (four, 3)], "a zero backlog clears it");
        manager.close_session(other.id);
        assert!(
            counts(manager).iter().all(|(_, count)| *count <= 1),
            "the session's backlogs end with it: {:?}",
            counts(manager)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shape_no_node_fits_is_listed_as_infeasible_for_a_while_with_its_count() {
        let test = WorkerPoolTest::start(2);
        let mut owner = test.open_session_with_idle_workers().await;
        for request_id in [1, 2] {
            test.leases.request(PendingLease {
                demand: cpus(64),
                allow_spillback: true,
                ..owner.lease_request(request_id)
            });
            test.settle().await;
            assert!(owner.events().is_empty(), "refused only once a newer view is in");
            test.leases.set_cluster_view(Vec::new(), Default::default());
            only_refusal(&mut owner, request_id);
        }
        let demands = test.leases.demands();
        let [refused] = &demands[..] else {
            panic!("expected the one infeasible shape, got {demands:?}");
        };
        assert!(refused.infeasible && refused.count == 2, "{refused:?}");
        assert_eq!(refused.shape, cpus(64));
        tokio::time::advance(INFEASIBLE_MEMORY).await;
        assert!(test.leases.demands().is_empty(), "an old refusal is forgotten");
    }
}
