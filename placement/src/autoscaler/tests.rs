//! The autoscaler's rounds on small clusters, with exact counts.

use std::time::Duration;

use raylet_proto::resources::{CPU, GPU};
use raylet_proto::{Amount, LabelSelector, Labels, NodeId, PlacementStrategy, ResourceSet};

use super::*;

fn cpus(n: u64) -> ResourceSet {
    ResourceSet::new().with(CPU, Amount::whole(n))
}

fn cpu_type(name: &str, n: u64, max_count: u32) -> NodeType {
    NodeType::new(name, cpus(n), max_count)
}

fn autoscaler(node_types: Vec<NodeType>) -> Autoscaler {
    Autoscaler::new(AutoscalerConfig::new(node_types, 1000)).unwrap()
}

fn running(
    node_type: Option<&str>,
    total: ResourceSet,
    available: ResourceSet,
    idle_for: Option<Duration>,
) -> NodeView {
    NodeView {
        id: NodeId::random(),
        node_type: node_type.map(str::to_string),
        total,
        available,
        labels: Labels::new(),
        state: NodeState::Running { idle_for },
    }
}

fn idle(node_type: Option<&str>, n: u64, seconds: u64) -> NodeView {
    running(node_type, cpus(n), cpus(n), Some(Duration::from_secs(seconds)))
}

fn busy(node_type: Option<&str>, n: u64, free: u64) -> NodeView {
    running(node_type, cpus(n), cpus(free), None)
}

fn cluster(nodes: Vec<NodeView>) -> ClusterView {
    ClusterView {
        nodes,
        ..Default::default()
    }
}

fn tasks(resources: ResourceSet, count: u64) -> ShapeDemand {
    ShapeDemand {
        resources,
        selector: LabelSelector::default(),
        count,
    }
}

fn shapes(shapes: Vec<ShapeDemand>) -> Demand {
    Demand {
        shapes,
        groups: Vec::new(),
    }
}

fn groups(bundles: Vec<ResourceSet>, strategy: PlacementStrategy, count: u64) -> Demand {
    Demand {
        shapes: Vec::new(),
        groups: vec![GroupDemand {
            name: "pg".to_string(),
            bundles,
            strategy,
            count,
        }],
    }
}

fn group(bundles: Vec<ResourceSet>, strategy: PlacementStrategy) -> Demand {
    groups(bundles, strategy, 1)
}

fn launches(plan: &Plan) -> Vec<(&str, u32)> {
    plan.launches
        .iter()
        .map(|launch| (launch.node_type.as_str(), launch.count))
        .collect()
}

/// The view after the caller launched what `plan` says.
fn with_launches(mut view: ClusterView, plan: &Plan, config: &AutoscalerConfig) -> ClusterView {
    for launch in &plan.launches {
        let node_type = config.node_types.iter().find(|t| t.name == launch.node_type).unwrap();
        for _ in 0..launch.count {
            view.nodes.push(NodeView {
                id: NodeId::random(),
                node_type: Some(node_type.name.clone()),
                total: node_type.resources.clone(),
                available: node_type.resources.clone(),
                labels: node_type.labels.clone(),
                state: NodeState::Launching { waited: Duration::ZERO },
            });
        }
    }
    view
}

#[test]
fn an_8_cpu_actor_on_2_cpu_nodes_launches_one_8_cpu_node() {
    let autoscaler = autoscaler(vec![
        cpu_type("cpu2", 2, 10),
        cpu_type("cpu8", 8, 10),
        cpu_type("cpu16", 16, 10),
    ]);
    let view = cluster((0..3).map(|_| busy(Some("cpu2"), 2, 2)).collect());
    let plan = autoscaler.decide(&view, &shapes(vec![tasks(cpus(8), 1)]));
    assert_eq!(launches(&plan), [("cpu8", 1)]);
    assert_eq!(
        plan.launches[0].reason,
        "1 x {CPU: 8} wait, 1 node of type cpu8 holds them"
    );
    assert!(plan.unmet.is_empty());
    assert_eq!(plan.fits_existing, 0);
}

#[test]
fn a_strict_spread_group_launches_its_missing_nodes_together() {
    let bundles = vec![cpus(1); 4];
    let demand = group(bundles, PlacementStrategy::StrictSpread);
    let view = cluster(vec![busy(None, 4, 4)]);
    let plan = autoscaler(vec![cpu_type("cpu4", 4, 10)]).decide(&view, &demand);
    assert_eq!(launches(&plan), [("cpu4", 3)]);
    assert_eq!(plan.fits_existing, 1);
    assert!(plan.unmet.is_empty());

    let plan = autoscaler(vec![cpu_type("cpu4", 4, 2)]).decide(&view, &demand);
    assert!(plan.launches.is_empty(), "{plan:?}");
    assert_eq!(plan.fits_existing, 0);
    assert_eq!(
        plan.unmet,
        [Unmet {
            demand: DemandRef::Group(0),
            count: 1,
            reason: UnmetReason::TypeMax {
                node_type: "cpu4".to_string()
            },
        }]
    );
}

#[test]
fn groups_alike_are_placed_one_by_one_each_all_or_nothing() {
    let autoscaler = autoscaler(vec![cpu_type("cpu4", 4, 5)]);
    let demand = groups(vec![cpus(4); 2], PlacementStrategy::StrictSpread, 3);
    let plan = autoscaler.decide(&ClusterView::default(), &demand);
    assert_eq!(launches(&plan), [("cpu4", 4)]);
    assert_eq!(
        plan.launches[0].reason,
        "bundles of 3 placement groups like 'pg' (2 bundles each, STRICT_SPREAD) wait, 4 nodes of type cpu4 hold them"
    );
    assert_eq!(plan.unmet_count(), 1);
    assert_eq!(
        plan.unmet[0].describe(&demand),
        "1 of 3 placement groups like 'pg' (2 bundles each, STRICT_SPREAD) wait: \
         every node type that fits is at its max_count (first: 'cpu4')"
    );
}

#[test]
fn a_strict_pack_group_launches_one_node_for_all_its_bundles() {
    let autoscaler = autoscaler(vec![
        cpu_type("cpu4", 4, 10),
        cpu_type("cpu8", 8, 10),
        cpu_type("cpu16", 16, 10),
    ]);
    let plan = autoscaler.decide(
        &cluster(vec![busy(None, 4, 4)]),
        &group(vec![cpus(2); 4], PlacementStrategy::StrictPack),
    );
    assert_eq!(launches(&plan), [("cpu8", 1)]);
}

#[test]
fn a_pack_group_shares_one_node_between_its_bundles() {
    let autoscaler = autoscaler(vec![cpu_type("cpu1", 1, 10), cpu_type("cpu4", 4, 10)]);
    let plan = autoscaler.decide(&cluster(vec![]), &group(vec![cpus(1); 4], PlacementStrategy::Pack));
    assert_eq!(launches(&plan), [("cpu4", 1)]);
}

#[test]
fn tasks_beyond_a_types_max_count_wait_on_it() {
    let autoscaler = autoscaler(vec![cpu_type("cpu4", 4, 3)]);
    let view = cluster(vec![busy(None, 8, 0)]);
    let demand = shapes(vec![tasks(cpus(1), 200)]);
    let plan = autoscaler.decide(&view, &demand);
    assert_eq!(launches(&plan), [("cpu4", 3)]);
    let cap = UnmetReason::TypeMax {
        node_type: "cpu4".to_string(),
    };
    assert_eq!(
        plan.unmet,
        [Unmet {
            demand: DemandRef::Shape(0),
            count: 188,
            reason: cap,
        }]
    );
    assert_eq!(
        plan.unmet[0].describe(&demand),
        "188 x {CPU: 1} wait: every node type that fits is at its max_count (first: 'cpu4')"
    );
}

#[test]
fn launching_nodes_are_not_launched_again_for_the_same_demand() {
    let autoscaler = autoscaler(vec![cpu_type("cpu4", 4, 10)]);
    let demand = shapes(vec![tasks(cpus(1), 8)]);
    let first = autoscaler.decide(&ClusterView::default(), &demand);
    assert_eq!(launches(&first), [("cpu4", 2)]);
    let view = with_launches(ClusterView::default(), &first, autoscaler.config());
    let second = autoscaler.decide(&view, &demand);
    assert!(second.launches.is_empty(), "{second:?}");
    assert_eq!(second.fits_existing, 8);
    assert!(second.unmet.is_empty());
}

#[test]
fn idle_nodes_past_their_timeout_are_removed_unless_busy_at_min_count_or_unmanaged() {
    let idle_timeout = Duration::from_secs(60);
    let mut keep = cpu_type("keep", 4, 10);
    keep.min_count = 1;
    let mut autoscaled = cpu_type("cpu4", 4, 10);
    autoscaled.idle_timeout = idle_timeout;
    keep.idle_timeout = idle_timeout;
    let autoscaler = autoscaler(vec![autoscaled, keep]);
    let view = cluster(vec![
        busy(Some("cpu4"), 4, 2),
        idle(Some("cpu4"), 4, 30),
        idle(Some("cpu4"), 4, 120),
        idle(Some("keep"), 4, 120),
        idle(None, 4, 10_000),
    ]);
    let plan = autoscaler.decide(&view, &Demand::default());
    let removed: Vec<(NodeId, RemovalCause)> = plan.removals.iter().map(|r| (r.node, r.cause)).collect();
    assert_eq!(removed, [(view.nodes[2].id, RemovalCause::Idle)]);
    assert_eq!(
        plan.removals[0].reason,
        "idle for 120 s, longer than type cpu4's idle_timeout of 60 s"
    );
    assert!(plan.launches.is_empty());
}

#[test]
fn an_idle_node_that_pending_demand_needs_is_kept() {
    let autoscaler = autoscaler(vec![cpu_type("cpu4", 4, 10)]);
    let view = cluster(vec![busy(Some("cpu4"), 4, 1), idle(Some("cpu4"), 4, 10_000)]);
    let plan = autoscaler.decide(&view, &shapes(vec![tasks(cpus(1), 3)]));
    assert!(plan.removals.is_empty(), "{plan:?}");
    assert!(plan.launches.is_empty());
    assert_eq!(plan.fits_existing, 3);
}

#[test]
fn min_count_launches_without_demand() {
    let mut node_type = cpu_type("cpu4", 4, 10);
    node_type.min_count = 2;
    let autoscaler = autoscaler(vec![node_type]);
    let plan = autoscaler.decide(&ClusterView::default(), &Demand::default());
    assert_eq!(launches(&plan), [("cpu4", 2)]);
    assert_eq!(
        plan.launches[0].reason,
        "type cpu4 keeps min_count 2 and has 0, 2 nodes of type cpu4 launch"
    );
    let plan = autoscaler.decide(&cluster(vec![busy(Some("cpu4"), 4, 0)]), &Demand::default());
    assert_eq!(launches(&plan), [("cpu4", 1)]);
}

#[test]
fn a_shape_no_type_can_hold_is_reported_and_not_launched() {
    let autoscaler = autoscaler(vec![cpu_type("cpu4", 4, 10), cpu_type("cpu8", 8, 10)]);
    let tpu = ResourceSet::new().with("TPU", Amount::whole(1));
    let plan = autoscaler.decide(
        &ClusterView::default(),
        &shapes(vec![tasks(cpus(64), 2), tasks(tpu, 1)]),
    );
    assert!(plan.launches.is_empty(), "{plan:?}");
    let unmet: Vec<(DemandRef, u64, UnmetReason)> = plan
        .unmet
        .iter()
        .map(|u| (u.demand, u.count, u.reason.clone()))
        .collect();
    assert_eq!(
        unmet,
        [
            (DemandRef::Shape(0), 2, UnmetReason::NoTypeFits),
            (DemandRef::Shape(1), 1, UnmetReason::NoTypeFits)
        ]
    );
}

#[test]
fn a_label_selected_shape_launches_only_a_type_whose_labels_match() {
    let zone = |name: &str, n: u64, value: &str| {
        let mut node_type = cpu_type(name, n, 10);
        node_type.labels = Labels::from([("zone".to_string(), value.to_string())]);
        node_type
    };
    let autoscaler = autoscaler(vec![zone("zone-a", 4, "a"), zone("zone-b", 8, "b")]);
    let mut in_zone_a = busy(None, 4, 4);
    in_zone_a.labels = Labels::from([("zone".to_string(), "a".to_string())]);
    let demand = shapes(vec![ShapeDemand {
        resources: cpus(4),
        selector: LabelSelector::default().with("zone", "b").unwrap(),
        count: 1,
    }]);
    let plan = autoscaler.decide(&cluster(vec![in_zone_a]), &demand);
    assert_eq!(launches(&plan), [("zone-b", 1)]);
    assert_eq!(plan.fits_existing, 0);
    assert_eq!(
        plan.launches[0].reason,
        "1 x {CPU: 4} on zone=b wait, 1 node of type zone-b holds them"
    );
}

#[test]
fn max_launch_batch_bounds_the_launches_of_a_round() {
    let mut config = AutoscalerConfig::new(vec![cpu_type("cpu1", 1, 100)], 1000);
    config.max_launch_batch = 10;
    let autoscaler = Autoscaler::new(config).unwrap();
    let plan = autoscaler.decide(&ClusterView::default(), &shapes(vec![tasks(cpus(1), 1000)]));
    assert_eq!(launches(&plan), [("cpu1", 10)]);
    assert_eq!(plan.unmet_count(), 990);
    assert_eq!(plan.unmet[0].reason, UnmetReason::LaunchBatch);
}

#[test]
fn max_nodes_bounds_the_managed_nodes() {
    let autoscaler = Autoscaler::new(AutoscalerConfig::new(vec![cpu_type("cpu1", 1, 100)], 4)).unwrap();
    let view = cluster(vec![busy(Some("cpu1"), 1, 0), busy(None, 1, 0)]);
    let plan = autoscaler.decide(&view, &shapes(vec![tasks(cpus(1), 5)]));
    assert_eq!(launches(&plan), [("cpu1", 3)]);
    assert_eq!(plan.unmet_count(), 2);
    assert_eq!(plan.unmet[0].reason, UnmetReason::MaxNodes);
}

#[test]
fn a_node_stuck_launching_past_the_join_timeout_is_removed_and_its_demand_launched_again() {
    let autoscaler = autoscaler(vec![cpu_type("cpu4", 4, 10)]);
    let mut stuck = busy(Some("cpu4"), 4, 4);
    stuck.state = NodeState::Launching {
        waited: Duration::from_secs(601),
    };
    let mut joining = stuck.clone();
    joining.id = NodeId::random();
    joining.state = NodeState::Launching {
        waited: Duration::from_secs(599),
    };
    let view = cluster(vec![stuck, joining]);
    let plan = autoscaler.decide(&view, &shapes(vec![tasks(cpus(1), 8)]));
    assert_eq!(plan.removals.len(), 1);
    assert_eq!(plan.removals[0].node, view.nodes[0].id);
    assert_eq!(plan.removals[0].cause, RemovalCause::DidNotJoin);
    assert_eq!(
        plan.removals[0].reason,
        "did not join in 600 s (type cpu4, launched 601 s ago)"
    );
    assert_eq!(launches(&plan), [("cpu4", 1)]);
    assert_eq!(plan.fits_existing, 4);
}

#[test]
fn a_type_backing_off_is_passed_over_for_one_that_fits() {
    let autoscaler = autoscaler(vec![cpu_type("cpu4", 4, 10), cpu_type("cpu8", 8, 10)]);
    let demand = shapes(vec![tasks(cpus(4), 1)]);
    let mut view = ClusterView::default();
    view.backing_off.insert("cpu4".to_string());
    assert_eq!(launches(&autoscaler.decide(&view, &demand)), [("cpu8", 1)]);
    view.backing_off.insert("cpu8".to_string());
    let plan = autoscaler.decide(&view, &demand);
    assert!(plan.launches.is_empty());
    assert_eq!(
        plan.unmet[0].reason,
        UnmetReason::BackingOff {
            node_type: "cpu4".to_string()
        }
    );
}

#[test]
fn cpu_work_goes_to_cpu_nodes_and_a_remainder_to_a_smaller_type() {
    let gpu = NodeType::new("gpu64", cpus(64).with(GPU, Amount::whole(8)), 10);
    let autoscaler = autoscaler(vec![gpu, cpu_type("cpu2", 2, 10), cpu_type("cpu64", 64, 10)]);
    let plan = autoscaler.decide(&ClusterView::default(), &shapes(vec![tasks(cpus(1), 130)]));
    assert_eq!(launches(&plan), [("cpu64", 2), ("cpu2", 1)]);
    let gpu_work = shapes(vec![tasks(cpus(1).with(GPU, Amount::whole(1)), 8)]);
    let plan = autoscaler.decide(&ClusterView::default(), &gpu_work);
    assert_eq!(launches(&plan), [("gpu64", 1)]);
}

#[test]
fn the_type_a_nodes_worth_of_copies_leaves_least_unused_is_launched() {
    let autoscaler = autoscaler(vec![
        cpu_type("cpu7", 7, 10),
        cpu_type("cpu5", 5, 10),
        cpu_type("cpu4", 4, 10),
    ]);
    let plan = autoscaler.decide(&ClusterView::default(), &shapes(vec![tasks(cpus(2), 10)]));
    assert_eq!(launches(&plan), [("cpu4", 5)]);
}

#[test]
fn invalid_configurations_are_refused_with_the_rule_named() {
    let check = |node_types: Vec<NodeType>, max_nodes: u32| AutoscalerConfig::new(node_types, max_nodes).validate();
    let mut above = cpu_type("a", 1, 1);
    above.min_count = 2;
    assert_eq!(
        check(vec![above.clone()], 10),
        Err(ConfigError::MinAboveMax {
            node_type: "a".to_string(),
            min: 2,
            max: 1
        })
    );
    assert_eq!(
        check(vec![cpu_type("a", 1, 1), cpu_type("a", 2, 1)], 10),
        Err(ConfigError::DuplicateType("a".to_string()))
    );
    assert_eq!(
        check(vec![NodeType::new("empty", ResourceSet::new(), 1)], 10),
        Err(ConfigError::NoResources("empty".to_string()))
    );
    assert_eq!(
        check(vec![cpu_type("", 1, 1)], 10),
        Err(ConfigError::EmptyName { index: 0 })
    );
    above.max_count = 5;
    assert_eq!(
        check(vec![above], 1),
        Err(ConfigError::MinimumsAboveMaxNodes { total: 2, max_nodes: 1 })
    );
    let mut config = AutoscalerConfig::new(vec![], 1);
    config.max_launch_batch = 0;
    assert_eq!(config.validate(), Err(ConfigError::NoLaunchBatch));
}

#[test]
fn a_configuration_reads_from_its_text_form_with_defaults() {
    let text = r#"{
        "max_nodes": 20,
        "node_types": [
            {"name": "gpu", "resources": {"CPU": 8, "GPU": 0.5}, "max_count": 4,
             "labels": {"zone": "a"}, "idle_timeout_s": 90}
        ]
    }"#;
    let config: AutoscalerConfig = serde_json::from_str(text).unwrap();
    let node_type = &config.node_types[0];
    assert_eq!(node_type.resources.get(GPU), Amount::parse(GPU, 0.5).unwrap());
    assert_eq!(node_type.idle_timeout, Duration::from_secs(90));
    assert_eq!(node_type.min_count, 0);
    assert_eq!(config.max_launch_batch, 10);
    assert_eq!(config.join_timeout, Duration::from_secs(600));
    let written = serde_json::to_string(&config).unwrap();
    assert_eq!(serde_json::from_str::<AutoscalerConfig>(&written).unwrap(), config);
    let negative = text.replace("0.5", "-1");
    assert!(serde_json::from_str::<AutoscalerConfig>(&negative).is_err());
}
