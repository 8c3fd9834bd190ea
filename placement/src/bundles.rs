//! Placing a placement group's bundles, all at once: PACK (as few nodes as
//! fit), SPREAD (as many as fit), STRICT_PACK (one node) and STRICT_SPREAD
//! (a node each). Bundles already placed stay where they are, so a group
//! that lost a node places only what it lost.

use std::cmp::Ordering;

use raylet_proto::PlacementStrategy;

use super::cluster::{ClusterResources, Demand, NodeIndex};

/// Where a group's bundles go, or why they cannot go anywhere.
#[derive(Clone, Debug, PartialEq)]
pub enum BundlePlan {
    /// A node for every bundle.
    Placed(Vec<NodeIndex>),
    /// The cluster could hold the group, but not with what is free now.
    Wait(String),
    /// The alive nodes can never hold the group.
    Infeasible(String),
}

/// Plans where `bundles` go under `strategy`. `placed[i]` is where bundle
/// `i` already is, if anywhere; those stay.
pub fn plan_bundles(
    cluster: &ClusterResources,
    bundles: &[Demand],
    placed: &[Option<NodeIndex>],
    strategy: PlacementStrategy,
) -> BundlePlan {
    if let Some(reason) = never_fits(cluster, bundles, placed, strategy) {
        return BundlePlan::Infeasible(reason);
    }
    match assign(cluster, bundles, placed, strategy, true) {
        Some(nodes) => BundlePlan::Placed(nodes),
        None => BundlePlan::Wait(format!(
            "waiting for free resources: the {} bundles ({strategy}) do not fit in what the nodes have free now",
            bundles.len()
        )),
    }
}

/// Why the group can never be placed on the alive nodes, if it cannot.
fn never_fits(
    cluster: &ClusterResources,
    bundles: &[Demand],
    placed: &[Option<NodeIndex>],
    strategy: PlacementStrategy,
) -> Option<String> {
    if let Some((index, name)) = bundles
        .iter()
        .enumerate()
        .find_map(|(index, bundle)| bundle.unknown_resource().map(|name| (index, name)))
    {
        return Some(format!("bundle {index} asks for '{name}', which no alive node has"));
    }
    if strategy == PlacementStrategy::StrictSpread && cluster.len() < bundles.len() {
        return Some(format!(
            "STRICT_SPREAD needs {} different nodes for its {} bundles, and the cluster has {} alive",
            bundles.len(),
            bundles.len(),
            cluster.len()
        ));
    }
    if let Some(index) =
        (0..bundles.len()).find(|&i| !(0..cluster.len()).any(|node| cluster.feasible(node, &bundles[i])))
    {
        return Some(format!(
            "bundle {index} {} fits on no alive node",
            cluster.describe(&bundles[index])
        ));
    }
    match assign(cluster, bundles, placed, strategy, false) {
        Some(_) => None,
        None => Some(format!(
            "the {} bundles cannot be placed {strategy} on the alive nodes, even when they are empty",
            bundles.len()
        )),
    }
}

/// Assigns every bundle not yet placed to a node, greedily, largest
/// bundles first, against free resources (`now`: bundles already placed
/// hold theirs already) or against totals (where every bundle counts).
fn assign(
    cluster: &ClusterResources,
    bundles: &[Demand],
    placed: &[Option<NodeIndex>],
    strategy: PlacementStrategy,
    now: bool,
) -> Option<Vec<NodeIndex>> {
    let mut nodes: Vec<Option<NodeIndex>> = placed.to_vec();
    nodes.resize(bundles.len(), None);
    if strategy == PlacementStrategy::StrictPack {
        return strict_pack(cluster, bundles, &nodes, now);
    }
    let mut order: Vec<usize> = (0..bundles.len()).filter(|&i| nodes[i].is_none()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(size(&bundles[i], cluster)));
    for bundle in order {
        let used: Vec<NodeIndex> = nodes.iter().flatten().copied().collect();
        let fits = |node: NodeIndex| {
            let counted =
                |other: usize| nodes[other] == Some(node) && (!now || placed.get(other).is_none_or(Option::is_none));
            let mut together: Vec<&Demand> = (0..bundles.len())
                .filter(|&other| counted(other))
                .map(|other| &bundles[other])
                .collect();
            together.push(&bundles[bundle]);
            cluster.fits_together(node, &together, now)
        };
        let fresh = |node: &NodeIndex| !used.contains(node);
        let candidates: Vec<NodeIndex> = (0..cluster.len()).filter(|&node| fits(node)).collect();
        let choice = match strategy {
            PlacementStrategy::Pack => candidates
                .iter()
                .copied()
                .find(|node| used.contains(node))
                .or_else(|| least_utilized(cluster, candidates.iter().copied())),
            PlacementStrategy::Spread => least_utilized(cluster, candidates.iter().copied().filter(fresh))
                .or_else(|| least_utilized(cluster, candidates.iter().copied())),
            PlacementStrategy::StrictSpread => least_utilized(cluster, candidates.iter().copied().filter(fresh)),
            PlacementStrategy::StrictPack => unreachable!("placed above"),
        };
        nodes[bundle] = Some(choice?);
    }
    nodes.into_iter().collect()
}

/// Every bundle on one node: the node that already holds some, else the
/// least utilized node that fits them all.
fn strict_pack(
    cluster: &ClusterResources,
    bundles: &[Demand],
    nodes: &[Option<NodeIndex>],
    now: bool,
) -> Option<Vec<NodeIndex>> {
    let all: Vec<&Demand> = bundles.iter().collect();
    let missing: Vec<&Demand> = (0..bundles.len())
        .filter(|&i| nodes[i].is_none())
        .map(|i| &bundles[i])
        .collect();
    let target = match nodes.iter().flatten().next() {
        Some(&node) => {
            let needed = if now { &missing } else { &all };
            cluster.fits_together(node, needed, now).then_some(node)?
        }
        None => least_utilized(
            cluster,
            (0..cluster.len()).filter(|&node| cluster.fits_together(node, &all, now)),
        )?,
    };
    Some(vec![target; bundles.len()])
}

fn least_utilized(cluster: &ClusterResources, nodes: impl Iterator<Item = NodeIndex>) -> Option<NodeIndex> {
    nodes.min_by(|&a, &b| {
        let utilization = |node: NodeIndex| cluster.node(node).utilization();
        utilization(a)
            .partial_cmp(&utilization(b))
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(&b))
    })
}

/// A bundle's size for ordering: the sum of its amounts.
fn size(bundle: &Demand, cluster: &ClusterResources) -> i64 {
    cluster.demand_amounts(bundle).map(|(_, _, amount)| amount).sum()
}

#[cfg(test)]
mod tests {
    use raylet_proto::resources::CPU;
    use raylet_proto::{Amount, Labels, NodeId, ResourceSet};

    use super::*;

    fn cpus(n: u64) -> ResourceSet {
        ResourceSet::new().with(CPU, Amount::whole(n))
    }

    fn cluster(sizes: &[u64]) -> ClusterResources {
        let mut cluster = ClusterResources::new();
        for (i, &size) in sizes.iter().enumerate() {
            cluster.upsert(NodeId::random(), &format!("n{i}:1"), &Labels::new(), &cpus(size));
        }
        cluster
    }

    fn plan(
        cluster: &ClusterResources,
        bundles: &[u64],
        placed: &[Option<NodeIndex>],
        strategy: PlacementStrategy,
    ) -> BundlePlan {
        let demands: Vec<Demand> = bundles.iter().map(|&n| cluster.demand(&cpus(n))).collect();
        plan_bundles(cluster, &demands, placed, strategy)
    }

    fn distinct(nodes: &[NodeIndex]) -> usize {
        let mut unique = nodes.to_vec();
        unique.sort();
        unique.dedup();
        unique.len()
    }

    #[test]
    fn pack_fills_one_node_before_the_next_and_spread_uses_them_all() {
        let cluster = cluster(&[4, 4, 4]);
        let BundlePlan::Placed(packed) = plan(&cluster, &[1, 1, 1, 1], &[], PlacementStrategy::Pack) else {
            panic!("fits");
        };
        assert_eq!(distinct(&packed), 1);
        let BundlePlan::Placed(packed) = plan(&cluster, &[2, 2, 2], &[], PlacementStrategy::Pack) else {
            panic!("fits");
        };
        assert_eq!(distinct(&packed), 2, "the third bundle overflows: {packed:?}");
        let BundlePlan::Placed(spread) = plan(&cluster, &[1, 1, 1, 1], &[], PlacementStrategy::Spread) else {
            panic!("fits");
        };
        assert_eq!(distinct(&spread), 3, "four bundles over three nodes: {spread:?}");
    }

    #[test]
    fn strict_strategies_hold_or_say_why_they_never_can() {
        let cluster = cluster(&[4, 4]);
        assert!(
            matches!(plan(&cluster, &[2, 2], &[], PlacementStrategy::StrictPack), BundlePlan::Placed(n) if distinct(&n) == 1)
        );
        let BundlePlan::Infeasible(reason) = plan(&cluster, &[2, 3], &[], PlacementStrategy::StrictPack) else {
            panic!("5 CPUs on one 4-CPU node");
        };
        assert!(reason.contains("STRICT_PACK"), "{reason}");
        assert!(
            matches!(plan(&cluster, &[1, 1], &[], PlacementStrategy::StrictSpread), BundlePlan::Placed(n) if distinct(&n) == 2)
        );
        let BundlePlan::Infeasible(reason) = plan(&cluster, &[1, 1, 1], &[], PlacementStrategy::StrictSpread) else {
            panic!("three bundles on two nodes");
        };
        assert!(
            reason.contains("needs 3 different nodes") && reason.contains("has 2 alive"),
            "{reason}"
        );
        let BundlePlan::Infeasible(reason) = plan(&cluster, &[8], &[], PlacementStrategy::Pack) else {
            panic!("8 CPUs fit nowhere");
        };
        assert!(reason.contains("bundle 0"), "{reason}");
    }

    #[test]
    fn a_group_that_fits_only_when_nodes_empty_waits() {
        let mut cluster = cluster(&[4, 4]);
        let used = cluster.demand(&cpus(3));
        cluster.subtract(0, &used);
        cluster.subtract(1, &used);
        assert!(matches!(
            plan(&cluster, &[2], &[], PlacementStrategy::Pack),
            BundlePlan::Wait(_)
        ));
    }

    #[test]
    fn bundles_already_placed_stay_and_only_the_lost_ones_move() {
        let mut cluster = cluster(&[4, 4, 4]);
        let one = cluster.demand(&cpus(1));
        cluster.subtract(0, &one);
        cluster.subtract(1, &one);
        let placed = [Some(0), Some(1), None];
        let BundlePlan::Placed(nodes) = plan(&cluster, &[1, 1, 1], &placed, PlacementStrategy::StrictSpread) else {
            panic!("the third node is free");
        };
        assert_eq!(nodes, [0, 1, 2]);
        let two = cluster.demand(&cpus(2));
        cluster.subtract(0, &two);
        let BundlePlan::Placed(nodes) = plan(&cluster, &[1, 1], &[Some(0), None], PlacementStrategy::StrictPack) else {
            panic!("node 0 has one CPU left");
        };
        assert_eq!(nodes, [0, 0], "a placed bundle's own resources are not counted twice");
    }
}
