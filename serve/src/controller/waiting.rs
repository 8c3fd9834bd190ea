//! Why replicas wait: a replica whose actor is not placed yet either is
//! being built or waits for room. The head does not say which of its
//! actors wait, but every node lists the requests it queues by resource
//! shape (the demand `raylet status` and the autoscaler read). So, per
//! shape, as many of the newest unplaced replicas as the cluster lists
//! waiting requests of that shape are said to wait, with what is free of
//! each resource they need, as the autoscaler's `Waiting:` lines do. Other
//! work of the very same shape waiting at the same time can make a replica
//! that is being built look waiting; never the other way round.
//!
//! Pure: the reconciler reads the cluster's status once a second and
//! hands it here.

use std::collections::BTreeMap;
use std::time::Instant;

use raylet::Amount;
use raylet::ResourceSet;
use raylet::resource_names::{CPU, GPU};
use raylet::status::ClusterStatus;

/// A replica whose actor is not placed yet.
pub(super) struct Unplaced<'a> {
    pub name: &'a str,
    /// What it asks of a node.
    pub shape: &'a ResourceSet,
    /// When it was created.
    pub since: Instant,
}

/// What a replica of `num_cpus` CPUs and `num_gpus` GPUs asks of a node.
pub(super) fn shape(num_cpus: f64, num_gpus: f64) -> ResourceSet {
    let mut shape = ResourceSet::new();
    for (name, amount) in [(CPU, num_cpus), (GPU, num_gpus)] {
        if let Ok(amount) = Amount::parse(name, amount) {
            shape.set(name, amount);
        }
    }
    shape
}

/// The replicas of `unplaced` that wait for room, by name, each with what
/// it waits for, e.g. `waits for {CPU: 1}: no node has it free (CPU: 0
/// of 2 free in the cluster)`.
pub(super) fn waiting(cluster: &ClusterStatus, unplaced: &[Unplaced<'_>]) -> BTreeMap<String, String> {
    let demands = cluster.demands();
    let mut by_shape: BTreeMap<Vec<(String, i64)>, Vec<&Unplaced<'_>>> = BTreeMap::new();
    for replica in unplaced.iter().filter(|replica| !replica.shape.is_empty()) {
        by_shape.entry(key(replica.shape)).or_default().push(replica);
    }
    let mut reasons = BTreeMap::new();
    for replicas in by_shape.values_mut() {
        let shape = replicas[0].shape;
        let same = || demands.iter().filter(|d| d.group.is_none() && &d.shape == shape);
        let queued: u64 = same().filter(|d| !d.infeasible).map(|d| d.count).sum();
        let infeasible = same().find(|d| d.infeasible);
        let count = queued + infeasible.map_or(0, |d| d.count);
        let reason = match infeasible {
            Some(demand) if queued == 0 => cannot_fit(cluster, shape, &demand.reason),
            _ => no_room(cluster, shape),
        };
        replicas.sort_by_key(|replica| std::cmp::Reverse(replica.since));
        for replica in replicas.iter().take(count as usize) {
            reasons.insert(replica.name.to_string(), reason.clone());
        }
    }
    reasons
}

/// Sorts shapes: a [`ResourceSet`] is not ordered.
fn key(shape: &ResourceSet) -> Vec<(String, i64)> {
    shape
        .iter()
        .map(|(name, amount)| (name.to_string(), amount.raw()))
        .collect()
}

fn no_room(cluster: &ClusterStatus, shape: &ResourceSet) -> String {
    let (free, total) = (cluster.available(), cluster.total());
    let parts: Vec<String> = shape
        .iter()
        .map(|(name, _)| {
            format!(
                "{name}: {} of {} free",
                free.get(name).as_f64(),
                total.get(name).as_f64()
            )
        })
        .collect();
    format!(
        "waits for {}: no node has it free ({} in the cluster)",
        describe(shape),
        parts.join(", ")
    )
}

fn cannot_fit(cluster: &ClusterStatus, shape: &ResourceSet, reason: &str) -> String {
    let largest: Vec<String> = shape
        .iter()
        .map(|(name, _)| {
            let most = cluster
                .alive()
                .map(|node| node.total.get(name).as_f64())
                .fold(0.0, f64::max);
            format!("{name}: {most}")
        })
        .collect();
    let why = match reason.is_empty() {
        true => String::new(),
        false => format!(": {reason}"),
    };
    format!(
        "waits for {}: no node could ever fit it (the largest has {}){why}",
        describe(shape),
        largest.join(", ")
    )
}

/// E.g. `{CPU: 1, GPU: 0.5}`.
pub(super) fn describe(shape: &ResourceSet) -> String {
    let parts: Vec<String> = shape
        .iter()
        .map(|(name, amount)| format!("{name}: {}", amount.as_f64()))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use raylet::NodeId;
    use raylet::status::{NodeState, NodeStats, NodeStatus, ResourceDemand};

    use super::*;

    fn cluster(total: f64, free: f64, demands: Vec<ResourceDemand>) -> ClusterStatus {
        let cpus = |amount: f64| shape(amount, 0.0);
        ClusterStatus {
            now_unix_ms: 0,
            nodes: vec![NodeStatus {
                node_id: NodeId::random(),
                incarnation: 1,
                address: "127.0.0.1:1".into(),
                hostname: "head".into(),
                is_head_node: true,
                state: NodeState::Alive,
                total: cpus(total),
                available: cpus(free),
                labels: Default::default(),
                metrics_address: None,
                stats: NodeStats::default(),
                demands,
                registered_unix_ms: 0,
                last_heartbeat_unix_ms: 0,
                died_unix_ms: None,
                death_reason: None,
                draining: None,
            }],
            placement_groups: Vec::new(),
            waiting_drivers: Vec::new(),
        }
    }

    fn demand(shape: ResourceSet, count: u64, infeasible: bool, reason: &str) -> ResourceDemand {
        ResourceDemand {
            shape,
            constraint: String::new(),
            count,
            infeasible,
            reason: reason.into(),
            scheduling: Default::default(),
            group: None,
        }
    }

    #[test]
    fn the_newest_unplaced_replicas_wait_as_many_as_the_cluster_queues() {
        let one = shape(1.0, 0.0);
        let start = Instant::now();
        let names = ["replica:a:m:0", "replica:a:m:1", "replica:a:m:2"];
        let unplaced: Vec<Unplaced<'_>> = names
            .iter()
            .enumerate()
            .map(|(i, name)| Unplaced {
                name,
                shape: &one,
                since: start + Duration::from_millis(i as u64),
            })
            .collect();
        let status = cluster(2.0, 0.0, vec![demand(one.clone(), 1, false, "")]);
        let waiting = waiting(&status, &unplaced);
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        assert_eq!(
            waiting["replica:a:m:2"],
            "waits for {CPU: 1}: no node has it free (CPU: 0 of 2 free in the cluster)"
        );
        let nothing_queued = cluster(2.0, 0.0, Vec::new());
        assert!(
            super::waiting(&nothing_queued, &unplaced).is_empty(),
            "they are being built"
        );
    }

    #[test]
    fn a_replica_no_node_could_fit_says_so_with_the_largest_node() {
        let gpu = shape(1.0, 1.0);
        let unplaced = [Unplaced {
            name: "replica:a:m:0",
            shape: &gpu,
            since: Instant::now(),
        }];
        let status = cluster(2.0, 2.0, vec![demand(gpu.clone(), 1, true, "no node has GPU")]);
        let waiting = waiting(&status, &unplaced);
        assert_eq!(
            waiting["replica:a:m:0"],
            "waits for {CPU: 1, GPU: 1}: no node could ever fit it (the largest has CPU: 2, GPU: 0): no node has GPU"
        );
    }
}
