//! Properties of the cluster view's resource sums over arbitrary clusters:
//! the totals and the free resources add up the alive nodes only, what is
//! free never exceeds the total, `fitting` counts what `ResourceSet::fits`
//! allows node by node, and merging the nodes' demands loses no task.

use proptest::prelude::*;
use raylet_cluster_status::{ClusterStatus, NodeState, NodeStats, NodeStatus, ResourceDemand};
use raylet_proto::resources::{CPU, GPU};
use raylet_proto::{Amount, Labels, NodeId, ResourceSet, Scheduling};

/// `quarters` of a resource.
fn quarters(quarters: i64) -> Amount {
    Amount::from_raw(quarters * Amount::SCALE / 4).expect("non-negative")
}

fn resources(cpus: i64, gpus: i64) -> ResourceSet {
    ResourceSet::new().with(CPU, quarters(cpus)).with(GPU, quarters(gpus))
}

fn demand(cpus: i64, count: u64) -> ResourceDemand {
    ResourceDemand {
        shape: resources(cpus, 0),
        constraint: String::new(),
        count,
        infeasible: false,
        reason: String::new(),
        scheduling: Scheduling::default(),
        group: None,
    }
}

/// A node with up to 64 CPUs and 16 GPUs, some of them in use, alive or
/// dead, with a few demands of a few shapes.
fn node() -> impl Strategy<Value = NodeStatus> {
    (0i64..=64, 0i64..=16, any::<bool>())
        .prop_flat_map(|(cpus, gpus, alive)| {
            let demands = proptest::collection::vec((1i64..=4, 1u64..=50), 0..4);
            (Just((cpus, gpus, alive)), 0..=cpus, 0..=gpus, demands)
        })
        .prop_map(|((cpus, gpus, alive), cpus_free, gpus_free, demands)| NodeStatus {
            node_id: NodeId::random(),
            incarnation: 1,
            address: "n:1".into(),
            hostname: "n".into(),
            is_head_node: false,
            state: if alive { NodeState::Alive } else { NodeState::Dead },
            total: resources(cpus, gpus),
            available: resources(cpus_free, gpus_free),
            labels: Labels::new(),
            metrics_address: None,
            stats: NodeStats::default(),
            demands: demands.into_iter().map(|(cpus, count)| demand(cpus, count)).collect(),
            registered_unix_ms: 0,
            last_heartbeat_unix_ms: 0,
            died_unix_ms: None,
            death_reason: None,
            draining: None,
        })
}

fn cluster() -> impl Strategy<Value = ClusterStatus> {
    proptest::collection::vec(node(), 0..8).prop_map(|nodes| ClusterStatus {
        now_unix_ms: 0,
        nodes,
        placement_groups: Vec::new(),
        waiting_drivers: Vec::new(),
    })
}

/// How many copies of `request` fit in `total`, by adding copies up.
fn copies_that_fit(total: &ResourceSet, request: &ResourceSet) -> usize {
    let mut asked = request.clone();
    let mut copies = 0;
    while total.fits(&asked) {
        copies += 1;
        asked.add(request);
    }
    copies
}

proptest! {
    #[test]
    fn the_sums_count_the_alive_nodes_only_and_what_is_free_fits_in_the_total(status in cluster()) {
        let (mut total, mut available) = (ResourceSet::new(), ResourceSet::new());
        for node in status.nodes.iter().filter(|node| node.state == NodeState::Alive) {
            total.add(&node.total);
            available.add(&node.available);
        }
        prop_assert_eq!(status.total(), total);
        prop_assert_eq!(status.available(), available);
        prop_assert!(status.total().fits(&status.available()));
    }

    #[test]
    fn fitting_counts_the_copies_each_alive_node_can_hold(
        status in cluster(),
        (cpus, gpus) in (0i64..=16, 0i64..=4).prop_filter("asks for something", |&(c, g)| c + g > 0),
    ) {
        let request = resources(cpus, gpus);
        let asked: Vec<(String, f64)> = request.iter().map(|(name, amount)| (name.to_string(), amount.as_f64())).collect();
        let expected: usize = status.alive().map(|node| copies_that_fit(&node.total, &request)).sum();
        prop_assert_eq!(status.fitting(&asked), expected);
    }

    #[test]
    fn merging_the_demands_loses_no_task_and_keeps_one_entry_per_shape(status in cluster()) {
        let alive_tasks: u64 = status.alive().flat_map(|node| &node.demands).map(|d| d.count).sum();
        let merged = status.demands();
        prop_assert_eq!(merged.iter().map(|d| d.count).sum::<u64>(), alive_tasks);
        for (i, demand) in merged.iter().enumerate() {
            prop_assert!(merged[i + 1..].iter().all(|other| other.shape != demand.shape), "{:?} twice", demand.shape);
        }
    }
}
