//! The placement policies, one decision at a time over a
//! [`ClusterResources`]: Ray's hybrid default (the preferred node while it is
//! below half utilization, else a random one of the top-k least utilized),
//! SPREAD (round robin), node affinity (hard or soft), label selectors, and
//! work that needs no GPU kept off GPU nodes while others have room.

use std::cmp::Ordering;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use raylet_proto::{Scheduling, SchedulingStrategy};

use super::cluster::{ClusterResources, Demand, NodeIndex, display};

/// Below this utilization a node scores as empty: work packs onto it.
pub const SPREAD_THRESHOLD: f64 = 0.5;
/// The default policy picks at random among this share of the nodes that
/// score best (at least one).
pub const TOP_K_FRACTION: f64 = 0.2;

/// What a policy decided for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// This node has room now.
    Run(NodeIndex),
    /// No node has room now; this one will once work there ends.
    Queue(NodeIndex),
    /// No node can ever fit the request; the message says what is missing.
    Infeasible(String),
    /// No alive node can ever fit the request, but a node type the
    /// autoscaler may launch can: it waits for that launch. Made from
    /// `Infeasible` by [`LaunchableNodes::await_launch`](super::LaunchableNodes::await_launch).
    AwaitLaunch(String),
    /// A hard constraint names something that is not there, such as a dead node.
    Unschedulable(String),
}

/// One request to place.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub demand: &'a Demand,
    pub scheduling: &'a Scheduling,
    /// The node tried first: the requester's own, or the one that holds the
    /// work's largest arguments.
    pub preferred: Option<NodeIndex>,
}

/// Makes placement decisions; keeps the SPREAD cursor and a random source.
pub struct Placer {
    rng: StdRng,
    spread_next: usize,
    /// The nodes with room passed over while walking the ranking.
    fitting: Vec<NodeIndex>,
}

impl Placer {
    /// A placer whose random choices follow `seed`.
    pub fn new(seed: u64) -> Self {
        Placer {
            rng: StdRng::seed_from_u64(seed),
            spread_next: 0,
            fitting: Vec::new(),
        }
    }

    pub fn choose(&mut self, cluster: &ClusterResources, request: &Request) -> Choice {
        let selector = &request.scheduling.label_selector;
        let eligible = |index: NodeIndex| selector.is_empty() || selector.matches(&cluster.node(index).labels);
        if let Some(name) = request.demand.unknown_resource() {
            return Choice::Infeasible(format!(
                "infeasible: no node of the cluster has any '{name}' (asked {})",
                describe_request(cluster, request)
            ));
        }
        match &request.scheduling.strategy {
            SchedulingStrategy::Default | SchedulingStrategy::PlacementGroup { .. } => {
                self.hybrid(cluster, request, &eligible)
            }
            SchedulingStrategy::Spread => self.spread(cluster, request, &eligible),
            SchedulingStrategy::NodeAffinity { node_id, soft } => match cluster.index(*node_id) {
                Some(index) => self.affinity(cluster, request, index, *soft, &eligible),
                None if *soft => self.hybrid(cluster, request, &eligible),
                None => Choice::Unschedulable(format!(
                    "node {node_id} is not alive, and the node affinity is hard (soft = false)"
                )),
            },
        }
    }

    fn hybrid(
        &mut self,
        cluster: &ClusterResources,
        request: &Request,
        eligible: &dyn Fn(NodeIndex) -> bool,
    ) -> Choice {
        if !request.demand.needs_gpu() {
            let off_gpu = |index: NodeIndex| eligible(index) && !cluster.has_gpu(index);
            if let Some(index) = self.least_utilized(cluster, request, &off_gpu) {
                return Choice::Run(index);
            }
        }
        match self.least_utilized(cluster, request, eligible) {
            Some(index) => Choice::Run(index),
            None => self.queue_or_refuse(cluster, request, eligible),
        }
    }

    /// The preferred node while it has room and is below the threshold,
    /// else a random one of the top-k scored nodes with room: the ranking
    /// is walked only as far as the pick.
    fn least_utilized(
        &mut self,
        cluster: &ClusterResources,
        request: &Request,
        eligible: &dyn Fn(NodeIndex) -> bool,
    ) -> Option<NodeIndex> {
        let demand = request.demand;
        if let Some(preferred) = request.preferred
            && eligible(preferred)
            && cluster.fits_now(preferred, demand)
            && cluster.node(preferred).utilization() < SPREAD_THRESHOLD
        {
            return Some(preferred);
        }
        let top_k = ((cluster.len() as f64 * TOP_K_FRACTION).ceil() as usize).max(1);
        let pick = self.rng.random_range(0..top_k);
        self.fitting.clear();
        for index in cluster.ranked() {
            if !cluster.fits_now(index, demand) || !eligible(index) {
                continue;
            }
            if self.fitting.len() == pick {
                return Some(index);
            }
            self.fitting.push(index);
        }
        match self.fitting.is_empty() {
            true => None,
            false => Some(self.fitting[self.rng.random_range(0..self.fitting.len())]),
        }
    }

    /// Round robin over the eligible nodes with room.
    fn spread(
        &mut self,
        cluster: &ClusterResources,
        request: &Request,
        eligible: &dyn Fn(NodeIndex) -> bool,
    ) -> Choice {
        let count = cluster.len();
        let start = self.spread_next.min(count);
        for index in (start..count).chain(0..start) {
            if eligible(index) && cluster.fits_now(index, request.demand) {
                self.spread_next = index + 1;
                return Choice::Run(index);
            }
        }
        self.queue_or_refuse(cluster, request, eligible)
    }

    fn affinity(
        &mut self,
        cluster: &ClusterResources,
        request: &Request,
        index: NodeIndex,
        soft: bool,
        eligible: &dyn Fn(NodeIndex) -> bool,
    ) -> Choice {
        let fits_ever = eligible(index) && cluster.feasible(index, request.demand);
        if fits_ever && cluster.fits_now(index, request.demand) {
            return Choice::Run(index);
        }
        match (fits_ever, soft) {
            (_, true) => match self.hybrid(cluster, request, eligible) {
                Choice::Queue(_) if fits_ever => Choice::Queue(index),
                other => other,
            },
            (true, false) => Choice::Queue(index),
            (false, false) => Choice::Infeasible(format!(
                "infeasible: node {} can never fit {}, and the node affinity is hard (soft = false); it has {}",
                cluster.node(index).node_id,
                describe_request(cluster, request),
                cluster.describe_total(index)
            )),
        }
    }

    /// No node has room now: wait on the preferred node, else on the least
    /// utilized node that can ever fit the request, else refuse it.
    fn queue_or_refuse(
        &mut self,
        cluster: &ClusterResources,
        request: &Request,
        eligible: &dyn Fn(NodeIndex) -> bool,
    ) -> Choice {
        let fits_ever = |index: NodeIndex| eligible(index) && cluster.feasible(index, request.demand);
        if let Some(preferred) = request.preferred.filter(|&index| fits_ever(index)) {
            return Choice::Queue(preferred);
        }
        let least_utilized = (0..cluster.len()).filter(|&index| fits_ever(index)).min_by(|&a, &b| {
            let utilization = |index: NodeIndex| cluster.node(index).utilization();
            utilization(a).partial_cmp(&utilization(b)).unwrap_or(Ordering::Equal)
        });
        match least_utilized {
            Some(index) => Choice::Queue(index),
            None => Choice::Infeasible(infeasible_reason(cluster, request, eligible)),
        }
    }
}

/// Names the resource that no eligible node has enough of, and the node
/// with the most of it.
fn infeasible_reason(cluster: &ClusterResources, request: &Request, eligible: &dyn Fn(NodeIndex) -> bool) -> String {
    let asked = describe_request(cluster, request);
    if !(0..cluster.len()).any(eligible) {
        return format!(
            "infeasible: no alive node has labels matching {} (asked {asked})",
            request.scheduling.label_selector
        );
    }
    for (resource, name, amount) in cluster.demand_amounts(request.demand) {
        if let Some((largest, most)) = cluster.largest(resource, eligible)
            && most < amount
        {
            return format!(
                "infeasible: no node can ever fit {asked}: it asks {name}: {}, and the most {name} any node has is {} \
                 (node {} has {})",
                display(amount),
                display(most),
                cluster.node(largest).node_id,
                cluster.describe_total(largest)
            );
        }
    }
    format!("infeasible: no single node has all of {asked} at once")
}

fn describe_request(cluster: &ClusterResources, request: &Request) -> String {
    let demand = cluster.describe(request.demand);
    match request.scheduling.label_selector.is_empty() {
        true => demand,
        false => format!("{demand} on nodes labelled {}", request.scheduling.label_selector),
    }
}

#[cfg(test)]
mod tests {
    use raylet_proto::resources::{CPU, GPU};
    use raylet_proto::{Amount, LabelSelector, Labels, NodeId, ResourceSet};

    use super::*;

    fn resources(cpus: f64, gpus: f64) -> ResourceSet {
        ResourceSet::new()
            .with(CPU, Amount::parse(CPU, cpus).unwrap())
            .with(GPU, Amount::parse(GPU, gpus).unwrap())
    }

    /// Nodes of `cpus` CPUs and `gpus` GPUs each, labelled `zone=<i>`.
    fn cluster(shapes: &[(f64, f64)]) -> ClusterResources {
        let mut cluster = ClusterResources::new();
        for (i, &(cpus, gpus)) in shapes.iter().enumerate() {
            let labels = Labels::from([("zone".to_string(), i.to_string())]);
            cluster.upsert(NodeId::random(), &format!("n{i}:1"), &labels, &resources(cpus, gpus));
        }
        cluster
    }

    fn place(
        placer: &mut Placer,
        cluster: &ClusterResources,
        demand: &ResourceSet,
        scheduling: &Scheduling,
        preferred: Option<NodeIndex>,
    ) -> Choice {
        let demand = cluster.demand(demand);
        placer.choose(
            cluster,
            &Request {
                demand: &demand,
                scheduling,
                preferred,
            },
        )
    }

    fn run_and_take(
        placer: &mut Placer,
        cluster: &mut ClusterResources,
        demand: &ResourceSet,
        scheduling: &Scheduling,
        preferred: Option<NodeIndex>,
    ) -> NodeIndex {
        let Choice::Run(index) = place(placer, cluster, demand, scheduling, preferred) else {
            panic!("expected room");
        };
        cluster.subtract(index, &cluster.demand(demand));
        index
    }

    #[test]
    fn the_default_packs_the_preferred_node_to_half_then_spreads_over_the_least_utilized() {
        let mut cluster = cluster(&[(8.0, 0.0), (8.0, 0.0), (8.0, 0.0)]);
        let mut placer = Placer::new(7);
        let one = resources(1.0, 0.0);
        let default = Scheduling::default();
        let first: Vec<NodeIndex> = (0..4)
            .map(|_| run_and_take(&mut placer, &mut cluster, &one, &default, Some(0)))
            .collect();
        assert_eq!(first, [0, 0, 0, 0], "packs while below half");
        let next = run_and_take(&mut placer, &mut cluster, &one, &default, Some(0));
        assert_ne!(next, 0, "at half utilization the preferred node no longer packs");
        for _ in 0..14 {
            run_and_take(&mut placer, &mut cluster, &one, &default, Some(0));
        }
        let used: Vec<f64> = cluster.nodes().iter().map(|n| n.utilization()).collect();
        assert!(used.iter().all(|&u| u >= 0.5), "spread over all nodes: {used:?}");
    }

    #[test]
    fn the_default_keeps_cpu_work_off_gpu_nodes_while_others_have_room() {
        let mut cluster = cluster(&[(8.0, 2.0), (2.0, 0.0)]);
        let mut placer = Placer::new(1);
        let cpu = resources(1.0, 0.0);
        let default = Scheduling::default();
        assert_eq!(run_and_take(&mut placer, &mut cluster, &cpu, &default, Some(0)), 1);
        assert_eq!(run_and_take(&mut placer, &mut cluster, &cpu, &default, Some(0)), 1);
        assert_eq!(
            run_and_take(&mut placer, &mut cluster, &cpu, &default, Some(0)),
            0,
            "the GPU node once the other is full"
        );
        assert_eq!(
            run_and_take(&mut placer, &mut cluster, &resources(1.0, 1.0), &default, None),
            0
        );
    }

    #[test]
    fn spread_goes_round_robin_over_nodes_with_room() {
        let mut cluster = cluster(&[(4.0, 0.0), (4.0, 0.0), (1.0, 0.0)]);
        let mut placer = Placer::new(3);
        let spread = Scheduling {
            strategy: SchedulingStrategy::Spread,
            ..Default::default()
        };
        let one = resources(1.0, 0.0);
        let picks: Vec<NodeIndex> = (0..7)
            .map(|_| run_and_take(&mut placer, &mut cluster, &one, &spread, Some(0)))
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 0, 1]);
    }

    #[test]
    fn hard_affinity_waits_for_its_node_or_fails_when_the_node_is_dead() {
        let mut cluster = cluster(&[(1.0, 0.0), (4.0, 0.0)]);
        let mut placer = Placer::new(5);
        let target = cluster.node(0).node_id;
        let hard = Scheduling {
            strategy: SchedulingStrategy::NodeAffinity {
                node_id: target,
                soft: false,
            },
            ..Default::default()
        };
        let soft = Scheduling {
            strategy: SchedulingStrategy::NodeAffinity {
                node_id: target,
                soft: true,
            },
            ..Default::default()
        };
        let one = resources(1.0, 0.0);
        assert_eq!(run_and_take(&mut placer, &mut cluster, &one, &hard, Some(1)), 0);
        assert_eq!(place(&mut placer, &cluster, &one, &hard, Some(1)), Choice::Queue(0));
        assert_eq!(
            place(&mut placer, &cluster, &one, &soft, Some(1)),
            Choice::Run(1),
            "soft falls back"
        );
        let Choice::Infeasible(reason) = place(&mut placer, &cluster, &resources(2.0, 0.0), &hard, None) else {
            panic!("a node too small for a hard affinity is infeasible");
        };
        assert!(reason.contains(&target.to_string()), "{reason}");
        cluster.remove(target);
        let Choice::Unschedulable(reason) = place(&mut placer, &cluster, &one, &hard, None) else {
            panic!("a dead node under a hard affinity is unschedulable");
        };
        assert!(
            reason.contains("not alive") && reason.contains(&target.to_string()),
            "{reason}"
        );
        assert_eq!(
            place(&mut placer, &cluster, &one, &soft, None),
            Choice::Run(0),
            "soft: anywhere"
        );
    }

    #[test]
    fn label_selectors_restrict_the_nodes_and_name_themselves_when_none_match() {
        let cluster = cluster(&[(4.0, 0.0), (4.0, 0.0), (4.0, 0.0)]);
        let mut placer = Placer::new(9);
        let zone = |expression: &str| Scheduling {
            label_selector: LabelSelector::default().with("zone", expression).unwrap(),
            ..Default::default()
        };
        let one = resources(1.0, 0.0);
        for _ in 0..20 {
            assert_eq!(place(&mut placer, &cluster, &one, &zone("2"), Some(0)), Choice::Run(2));
            assert!(matches!(
                place(&mut placer, &cluster, &one, &zone("!in(0,1)"), None),
                Choice::Run(2)
            ));
        }
        let Choice::Infeasible(reason) = place(&mut placer, &cluster, &one, &zone("9"), None) else {
            panic!("no node matches");
        };
        assert!(reason.contains("zone=9"), "{reason}");
    }

    #[test]
    fn infeasible_requests_name_the_missing_resource_and_the_largest_node() {
        let cluster = cluster(&[(4.0, 2.0), (8.0, 1.0)]);
        let mut placer = Placer::new(2);
        let Choice::Infeasible(reason) = place(
            &mut placer,
            &cluster,
            &resources(1.0, 8.0),
            &Scheduling::default(),
            None,
        ) else {
            panic!("8 GPUs fit nowhere");
        };
        assert!(
            reason.contains("GPU: 8.0") && reason.contains("the most GPU any node has is 2.0"),
            "{reason}"
        );
        assert!(reason.contains(&cluster.node(0).node_id.to_string()), "{reason}");
        let Choice::Infeasible(reason) = place(
            &mut placer,
            &cluster,
            &resources(8.0, 2.0),
            &Scheduling::default(),
            None,
        ) else {
            panic!("no node has both");
        };
        assert!(reason.contains("no single node"), "{reason}");
        let tpu = ResourceSet::new().with("TPU", Amount::whole(1));
        let Choice::Infeasible(reason) = place(&mut placer, &cluster, &tpu, &Scheduling::default(), None) else {
            panic!("no node has TPUs");
        };
        assert!(reason.contains("'TPU'"), "{reason}");
    }

    #[test]
    fn work_that_fits_nowhere_now_queues_on_the_preferred_or_least_utilized_node() {
        let mut cluster = cluster(&[(1.0, 0.0), (2.0, 0.0)]);
        let mut placer = Placer::new(4);
        let one = resources(1.0, 0.0);
        let default = Scheduling::default();
        for _ in 0..3 {
            run_and_take(&mut placer, &mut cluster, &one, &default, None);
        }
        assert_eq!(place(&mut placer, &cluster, &one, &default, Some(0)), Choice::Queue(0));
        assert_eq!(
            place(&mut placer, &cluster, &resources(2.0, 0.0), &default, Some(0)),
            Choice::Queue(1)
        );
    }
}
