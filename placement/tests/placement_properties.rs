//! Properties of the placement policies and of the cluster's resources
//! over arbitrary clusters and requests: a chosen node has room, a request
//! no node can ever fit is never placed, work never waits while a node has
//! room, SPREAD goes round robin, the default packs the preferred node below
//! half utilization and keeps work that needs no GPU off GPU nodes; and
//! taking a demand from a node and giving it back agree with `fits_now`.

use proptest::prelude::*;
use raylet_placement::{Choice, ClusterResources, Demand, NodeIndex, Placer, Request};
use raylet_proto::resources::{CPU, GPU};
use raylet_proto::{Amount, LabelSelector, Labels, NodeId, ResourceSet, Scheduling, SchedulingStrategy};

/// One node: CPUs and GPUs in total and in use (quarters), and its zone.
#[derive(Clone, Debug)]
struct NodeShape {
    cpus: i64,
    gpus: i64,
    cpus_used: i64,
    gpus_used: i64,
    zone: bool,
}

fn node_shape() -> impl Strategy<Value = NodeShape> {
    (0i64..=64, 0i64..=16, any::<bool>())
        .prop_flat_map(|(cpus, gpus, zone)| (Just(cpus), Just(gpus), 0..=cpus, 0..=gpus, Just(zone)))
        .prop_map(|(cpus, gpus, cpus_used, gpus_used, zone)| NodeShape {
            cpus,
            gpus,
            cpus_used,
            gpus_used,
            zone,
        })
}

/// `quarters` of a resource as a set entry.
fn quarters(quarters: i64) -> Amount {
    Amount::from_raw(quarters * Amount::SCALE / 4).expect("non-negative")
}

fn resources(cpus: i64, gpus: i64) -> ResourceSet {
    let mut set = ResourceSet::new();
    set.set(CPU, quarters(cpus));
    set.set(GPU, quarters(gpus));
    set
}

fn cluster_of(shapes: &[NodeShape]) -> ClusterResources {
    let mut cluster = ClusterResources::new();
    for (i, shape) in shapes.iter().enumerate() {
        let id = NodeId::from_wire(&[i as u8 + 1; 16]).expect("16 bytes");
        let zone = if shape.zone { "a" } else { "b" };
        let labels = Labels::from([("zone".to_string(), zone.to_string())]);
        let index = cluster.upsert(id, &format!("n{i}:1"), &labels, &resources(shape.cpus, shape.gpus));
        let available = resources(shape.cpus - shape.cpus_used, shape.gpus - shape.gpus_used);
        cluster.set_available(index, &available);
    }
    cluster
}

/// A node with no GPU whose CPUs are below half in use, and a CPU count
/// (quarters) that fits in what it has free.
fn packable_node() -> impl Strategy<Value = (NodeShape, i64)> {
    (2i64..=64)
        .prop_flat_map(|cpus| (Just(cpus), 0..(cpus + 1) / 2))
        .prop_flat_map(|(cpus, cpus_used)| {
            let shape = NodeShape {
                cpus,
                gpus: 0,
                cpus_used,
                gpus_used: 0,
                zone: true,
            };
            (Just(shape), 0..=cpus - cpus_used)
        })
}

/// Arbitrary nodes with `node` among them; its index.
fn among_others(node: NodeShape) -> impl Strategy<Value = (Vec<NodeShape>, usize)> {
    proptest::collection::vec(node_shape(), 0..7).prop_flat_map(move |others| {
        let count = others.len();
        (Just(others), 0..=count).prop_map({
            let node = node.clone();
            move |(mut nodes, index)| {
                nodes.insert(index, node.clone());
                (nodes, index)
            }
        })
    })
}

fn strategy() -> impl Strategy<Value = Scheduling> {
    let strategy = prop_oneof![Just(SchedulingStrategy::Default), Just(SchedulingStrategy::Spread)];
    (strategy, proptest::option::of(any::<bool>())).prop_map(|(strategy, zone)| {
        let label_selector = match zone {
            Some(true) => LabelSelector::default().with("zone", "a").expect("a valid selector"),
            Some(false) => LabelSelector::default().with("zone", "b").expect("a valid selector"),
            None => LabelSelector::default(),
        };
        Scheduling {
            strategy,
            label_selector,
        }
    })
}

/// A cluster of one to eight nodes and a request of up to 20 CPUs and 5 GPUs.
fn case() -> impl Strategy<Value = (Vec<NodeShape>, (i64, i64), Scheduling, Option<usize>, u64)> {
    proptest::collection::vec(node_shape(), 1..8).prop_flat_map(|nodes| {
        let count = nodes.len();
        (
            Just(nodes),
            (0i64..=80, 0i64..=20),
            strategy(),
            proptest::option::of(0..count),
            any::<u64>(),
        )
    })
}

fn choose(
    cluster: &ClusterResources,
    demand: &Demand,
    scheduling: &Scheduling,
    preferred: Option<NodeIndex>,
    seed: u64,
) -> Choice {
    Placer::new(seed).choose(
        cluster,
        &Request {
            demand,
            scheduling,
            preferred,
        },
    )
}

fn eligible(cluster: &ClusterResources, scheduling: &Scheduling, index: NodeIndex) -> bool {
    scheduling.label_selector.matches(&cluster.node(index).labels)
}

proptest! {
    #[test]
    fn a_chosen_node_has_room_and_a_queued_one_can_ever_fit(
        (nodes, (cpus, gpus), scheduling, preferred, seed) in case(),
    ) {
        let cluster = cluster_of(&nodes);
        let demand = cluster.demand(&resources(cpus, gpus));
        match choose(&cluster, &demand, &scheduling, preferred, seed) {
            Choice::Run(index) => {
                prop_assert!(cluster.fits_now(index, &demand), "node {} has no room", index);
                prop_assert!(eligible(&cluster, &scheduling, index), "node {} is not eligible", index);
            }
            Choice::Queue(index) => {
                prop_assert!(cluster.feasible(index, &demand), "node {} can never fit it", index);
                prop_assert!(eligible(&cluster, &scheduling, index), "node {} is not eligible", index);
            }
            Choice::Infeasible(_) | Choice::AwaitLaunch(_) | Choice::Unschedulable(_) => {}
        }
    }

    #[test]
    fn a_request_no_node_can_ever_fit_is_never_placed_and_one_that_fits_never_waits(
        (nodes, (cpus, gpus), scheduling, preferred, seed) in case(),
    ) {
        let cluster = cluster_of(&nodes);
        let demand = cluster.demand(&resources(cpus, gpus));
        let choice = choose(&cluster, &demand, &scheduling, preferred, seed);
        let eligible = |index| eligible(&cluster, &scheduling, index);
        let fits_ever = (0..cluster.len()).any(|index| eligible(index) && cluster.feasible(index, &demand));
        let fits_now = (0..cluster.len()).any(|index| eligible(index) && cluster.fits_now(index, &demand));
        match (fits_ever, fits_now) {
            (false, _) => prop_assert!(matches!(choice, Choice::Infeasible(_)), "{:?}", choice),
            (true, false) => prop_assert!(matches!(choice, Choice::Queue(_)), "{:?}", choice),
            (true, true) => prop_assert!(matches!(choice, Choice::Run(_)), "{:?}", choice),
        }
    }

    #[test]
    fn a_resource_no_node_has_is_infeasible(nodes in proptest::collection::vec(node_shape(), 1..8), seed: u64) {
        let cluster = cluster_of(&nodes);
        let demand = cluster.demand(&ResourceSet::new().with("TPU", quarters(1)));
        let choice = choose(&cluster, &demand, &Scheduling::default(), None, seed);
        prop_assert!(matches!(&choice, Choice::Infeasible(reason) if reason.contains("TPU")), "{:?}", choice);
    }

    #[test]
    fn spread_goes_round_robin_over_the_nodes_with_room(
        nodes in proptest::collection::vec(node_shape(), 1..8),
        (cpus, gpus) in (0i64..=8, 0i64..=2),
    ) {
        let cluster = cluster_of(&nodes);
        let demand = cluster.demand(&resources(cpus, gpus));
        let spread = Scheduling { strategy: SchedulingStrategy::Spread, ..Scheduling::default() };
        let with_room: Vec<NodeIndex> = (0..cluster.len()).filter(|&index| cluster.fits_now(index, &demand)).collect();
        let mut placer = Placer::new(1);
        let mut request = |_| placer.choose(&cluster, &Request { demand: &demand, scheduling: &spread, preferred: None });
        let picks: Vec<Choice> = (0..2 * with_room.len()).map(&mut request).collect();
        let expected: Vec<Choice> = with_room.iter().chain(&with_room).map(|&index| Choice::Run(index)).collect();
        prop_assert_eq!(picks, expected);
    }

    #[test]
    fn the_default_packs_the_preferred_node_while_it_is_below_half_utilization(
        ((nodes, preferred), cpus, seed) in packable_node()
            .prop_flat_map(|(node, cpus)| (among_others(node), Just(cpus), any::<u64>())),
    ) {
        let cluster = cluster_of(&nodes);
        let demand = cluster.demand(&resources(cpus, 0));
        let choice = choose(&cluster, &demand, &Scheduling::default(), Some(preferred), seed);
        prop_assert_eq!(choice, Choice::Run(preferred));
    }

    #[test]
    fn the_default_keeps_work_that_needs_no_gpu_off_gpu_nodes_while_others_have_room(
        ((nodes, _), cpus, preferred, seed) in packable_node()
            .prop_flat_map(|(node, cpus)| (among_others(node), Just(cpus), 0usize..8, any::<u64>())),
    ) {
        let cluster = cluster_of(&nodes);
        let preferred = preferred % cluster.len();
        let demand = cluster.demand(&resources(cpus, 0));
        let Choice::Run(index) = choose(&cluster, &demand, &Scheduling::default(), Some(preferred), seed) else {
            return Err(TestCaseError::fail("a node without GPUs has room"));
        };
        prop_assert!(!cluster.has_gpu(index), "node {} has GPUs", index);
    }

    #[test]
    fn taking_a_demand_that_fits_leaves_room_for_exactly_what_fitted_with_it(
        (shape, first) in node_shape().prop_flat_map(|shape| {
            let free = (0..=shape.cpus - shape.cpus_used, 0..=shape.gpus - shape.gpus_used);
            (Just(shape), free)
        }),
        second in (0i64..=64, 0i64..=16),
    ) {
        let mut cluster = cluster_of(&[shape]);
        let first = cluster.demand(&resources(first.0, first.1));
        let second = cluster.demand(&resources(second.0, second.1));
        prop_assert!(cluster.fits_now(0, &first), "drawn from what is free");
        let together = cluster.fits_together(0, &[&first, &second], true);
        cluster.subtract(0, &first);
        prop_assert_eq!(cluster.fits_now(0, &second), together);
    }

    #[test]
    fn taking_a_demand_and_giving_it_back_restores_the_node_and_never_goes_below_zero(
        shape in node_shape(),
        (cpus, gpus) in (0i64..=100, 0i64..=30),
        probes in proptest::collection::vec((0i64..=64, 0i64..=16), 1..8),
    ) {
        let mut cluster = cluster_of(&[shape]);
        let demand = cluster.demand(&resources(cpus, gpus));
        let probes: Vec<Demand> = probes.iter().map(|&(c, g)| cluster.demand(&resources(c, g))).collect();
        let fits = |cluster: &ClusterResources| probes.iter().map(|probe| cluster.fits_now(0, probe)).collect::<Vec<bool>>();
        let (before, utilization) = (fits(&cluster), cluster.node(0).utilization());
        let fitted = cluster.fits_now(0, &demand);
        cluster.subtract(0, &demand);
        prop_assert!((0.0..=1.0).contains(&cluster.node(0).utilization()), "{}", cluster.node(0).utilization());
        prop_assert!(cluster.fits_now(0, &Demand::default()));
        if fitted {
            cluster.add_back(0, &demand);
            prop_assert_eq!(fits(&cluster), before);
            prop_assert!((cluster.node(0).utilization() - utilization).abs() < 1e-9);
        }
    }
}
