//! Placement groups on clusters of `raylet start` daemons: STRICT_SPREAD
//! bundles on distinct nodes with tasks and actors run in their bundle,
//! removal that ends what runs in the group and frees its resources, a
//! group that can never fit reported infeasible at once, a bundle on a
//! killed node placed again, and `raylet list placement-groups`.

use std::time::{Duration, Instant};

use raylet::prelude::*;
use raylet::{Error, NodeId, PlacementGroupInfo, PlacementGroupState};
use serde_json::Value;

use crate::common;

use common::{ZonedCluster, daemon_records, raylet};

/// The pid of the node manager that runs this task.
#[raylet::remote]
fn node_manager() -> u32 {
    std::os::unix::process::parent_id()
}

#[raylet::actor]
#[derive(Default)]
pub struct InGroup;

#[raylet::actor]
impl InGroup {
    pub fn new() -> Self {
        InGroup
    }

    pub fn node_manager(&self) -> u32 {
        std::os::unix::process::parent_id()
    }
}

fn one_cpu_bundles(count: usize) -> Vec<Bundle> {
    (0..count).map(|_| Bundle::new().num_cpus(1.0)).collect()
}

fn info(cluster: &Cluster, group: &PlacementGroup) -> PlacementGroupInfo {
    let groups = cluster.list_placement_groups().unwrap();
    groups
        .into_iter()
        .find(|info| info.id == group.id())
        .expect("the group is listed")
}

fn wait_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid of the daemon that runs node `node`.
fn pid_of(nodes: &ZonedCluster, node: NodeId) -> u32 {
    daemon_records(nodes.temp)
        .into_iter()
        .find(|record| record["node_id"] == node.to_string().as_str())
        .map(|record| record["pid"].as_u64().unwrap() as u32)
        .expect("the bundle's node is one of the cluster's daemons")
}

#[test]
fn strict_spread_bundles_hold_one_node_each_run_their_work_and_free_it_all_on_removal() {
    let temp = tempfile::tempdir().unwrap();
    let zones = ["a", "b", "c"];
    let nodes = ZonedCluster::start(temp.path(), &zones);
    let cluster = nodes.driver();
    let group = cluster
        .placement_group(one_cpu_bundles(3), PlacementStrategy::StrictSpread)
        .unwrap();
    group.ready_timeout(Duration::from_secs(10)).unwrap();
    let created = info(&cluster, &group);
    assert_eq!(created.state, PlacementGroupState::Created);
    let mut distinct = created.nodes.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "one bundle per node: {:?}", created.nodes);

    for (index, node) in created.nodes.iter().enumerate() {
        let task = node_manager::options()
            .placement_group(&group, Some(index as u32))
            .remote(&cluster)
            .unwrap();
        assert_eq!(task.get().unwrap(), pid_of(&nodes, *node), "bundle {index}");
    }
    let actor = InGroup::remote(&cluster)
        .placement_group(&group, Some(2))
        .spawn()
        .unwrap();
    assert_eq!(actor.node_manager().get().unwrap(), pid_of(&nodes, created.nodes[2]));

    let listed: Value =
        serde_json::from_str(&raylet(temp.path(), &["list", "placement-groups", "--format", "json"])).unwrap();
    assert_eq!(listed[0]["state"], "CREATED", "{listed}");
    assert_eq!(listed[0]["strategy"], "STRICT_SPREAD", "{listed}");
    let text = raylet(temp.path(), &["list", "placement-groups"]);
    assert!(
        text.contains(&group.id().to_string()) && text.contains("CREATED"),
        "{text}"
    );

    group.remove().unwrap();
    assert_eq!(info(&cluster, &group).state, PlacementGroupState::Removed);
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        match actor.node_manager().get_timeout(Duration::from_secs(10)) {
            Err(error) => break error,
            Ok(_) => assert!(
                Instant::now() < deadline,
                "the group's actor is ended soon after removal"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(matches!(&after, Error::Task(task) if task.is_actor_death()), "{after}");
    let task = node_manager::options()
        .placement_group(&group, Some(0))
        .remote(&cluster)
        .unwrap();
    let error = task.get_timeout(Duration::from_secs(10)).unwrap_err();
    assert!(error.to_string().contains("removed"), "{error}");
    wait_until(Duration::from_secs(10), "every CPU is free again", || {
        let status = cluster.status().unwrap();
        status.available().get(raylet::resource_names::CPU) == raylet::Amount::whole(6)
    });
    assert!(matches!(group.ready(), Err(Error::PlacementGroupRemoved { .. })));
    cluster.shutdown().unwrap();
}

#[test]
fn strict_spread_over_more_bundles_than_nodes_is_reported_infeasible_at_once() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b"]);
    let cluster = nodes.driver();
    let group = cluster
        .placement_group(one_cpu_bundles(3), PlacementStrategy::StrictSpread)
        .unwrap();
    let error = group.ready_timeout(Duration::from_secs(10)).unwrap_err();
    let Error::PlacementGroupInfeasible { reason, .. } = &error else {
        panic!("expected an infeasible group, got {error}");
    };
    assert!(
        reason.contains("needs 3 different nodes") && reason.contains("has 2 alive"),
        "{reason}"
    );
    assert_eq!(info(&cluster, &group).state, PlacementGroupState::Infeasible);
    let status = cluster.status().unwrap();
    assert_eq!(
        status.available().get(raylet::resource_names::CPU),
        raylet::Amount::whole(4),
        "no part of the group is held"
    );
    let too_big = cluster
        .placement_group(vec![Bundle::new().num_cpus(8.0)], PlacementStrategy::Pack)
        .unwrap();
    let error = too_big.ready_timeout(Duration::from_secs(10)).unwrap_err();
    assert!(error.to_string().contains("CPU: 8.0"), "{error}");
    cluster.shutdown().unwrap();
}

#[test]
fn a_bundle_on_a_killed_node_is_placed_again_on_a_node_without_one() {
    let temp = tempfile::tempdir().unwrap();
    let zones = ["a", "b", "c", "d"];
    let nodes = ZonedCluster::start(temp.path(), &zones);
    let cluster = nodes.driver();
    let group = cluster
        .placement_group(one_cpu_bundles(3), PlacementStrategy::StrictSpread)
        .unwrap();
    group.ready_timeout(Duration::from_secs(10)).unwrap();
    let before = info(&cluster, &group).nodes;
    let head_node = nodes.node("a").0;
    let (lost_index, victim) = before
        .iter()
        .enumerate()
        .find(|(_, node)| **node != head_node)
        .map(|(index, node)| (index, *node))
        .expect("three bundles on four nodes use a node besides the head's");
    let victim_pid = pid_of(&nodes, victim);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    wait_until(Duration::from_secs(20), "the lost bundle has a node again", || {
        let now = info(&cluster, &group);
        now.state == PlacementGroupState::Created && !now.nodes.contains(&victim)
    });
    let after = info(&cluster, &group).nodes;
    let mut distinct = after.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "still one bundle per node: {after:?}");
    for index in (0..3).filter(|&i| i != lost_index) {
        assert_eq!(after[index], before[index], "bundle {index} stayed where it was");
    }
    let task = node_manager::options()
        .placement_group(&group, Some(lost_index as u32))
        .remote(&cluster)
        .unwrap();
    assert_eq!(
        task.get_timeout(Duration::from_secs(10)).unwrap(),
        pid_of(&nodes, after[lost_index])
    );
    cluster.shutdown().unwrap();
}
