//! The autoscaler's scale simulation: a thousand node types (2 to 96 CPUs,
//! some with GPUs or an accelerator, labelled by zone and tier) over a
//! cluster of some hundreds of running nodes, busy, full or idle, and
//! demand patterns of a hundred thousand pending tasks or bundles. Each
//! pattern runs several rounds on one thread, each round's launches joining
//! the view as launching nodes; the decision of every round is timed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use raylet_proto::resources::{CPU, GPU, MEMORY};
use raylet_proto::{Amount, LabelSelector, Labels, NodeId, PlacementStrategy, ResourceSet};

use super::{
    Autoscaler, AutoscalerConfig, ClusterView, DEFAULT_LAUNCH_BATCH, Demand, GroupDemand, NodeState, NodeType,
    NodeView, Plan, ShapeDemand,
};

const GIB: u64 = 1 << 30;
const ZONES: usize = 4;
/// The custom resource some node types offer.
const ACCELERATOR: &str = "accelerator";
/// The launch batch of the pattern that launches as much as it needs.
const LARGE_BATCH: u32 = 1000;
/// Kinds of placement groups, in the pattern that counts alike ones together.
const GROUP_KINDS: u64 = 8;

/// The size of the simulated configuration, cluster and demand.
#[derive(Clone, Debug)]
pub struct SimulationSize {
    pub node_types: usize,
    /// Running nodes before the first round.
    pub nodes: usize,
    /// Tasks (or bundles) pending in every pattern.
    pub pending: u64,
    /// Distinct shapes of the many-shapes pattern.
    pub distinct_shapes: usize,
    /// Groups of the pattern that lists every group on its own.
    pub distinct_groups: u64,
    pub rounds: usize,
}

impl Default for SimulationSize {
    fn default() -> Self {
        SimulationSize {
            node_types: 1000,
            nodes: 500,
            pending: 100_000,
            distinct_shapes: 10_000,
            distinct_groups: 2_500,
            rounds: 20,
        }
    }
}

/// What one demand pattern measured.
#[derive(Clone, Debug)]
pub struct PatternReport {
    pub pattern: &'static str,
    /// Distinct shapes and groups in the demand.
    pub distinct: usize,
    pub pending: u64,
    pub max_launch_batch: u32,
    pub rounds: usize,
    pub median: Duration,
    pub max: Duration,
    /// Nodes launched over all rounds.
    pub launched: u32,
    /// Pending work the last round left waiting.
    pub unmet_at_end: u64,
}

/// Every pattern's figures.
#[derive(Clone, Debug)]
pub struct SimulationReport {
    pub node_types: usize,
    pub nodes: usize,
    pub patterns: Vec<PatternReport>,
}

/// Runs every pattern on the calling thread.
pub fn run(size: &SimulationSize) -> SimulationReport {
    let node_types = node_types(size.node_types);
    let cluster = cluster(&node_types, size.nodes);
    let patterns = [
        ("uniform 1-CPU tasks", uniform(size), DEFAULT_LAUNCH_BATCH),
        ("mixed CPU/GPU/memory shapes", mixed(size), DEFAULT_LAUNCH_BATCH),
        ("distinct shapes", distinct(size), DEFAULT_LAUNCH_BATCH),
        ("label-selected shapes", labelled(size), DEFAULT_LAUNCH_BATCH),
        (
            "placement groups of 4 bundles, STRICT_SPREAD and STRICT_PACK, alike ones counted together",
            groups(GROUP_KINDS, size.pending / 4 / GROUP_KINDS),
            DEFAULT_LAUNCH_BATCH,
        ),
        (
            "placement groups of 4 bundles, STRICT_SPREAD and STRICT_PACK, each on its own",
            groups(size.distinct_groups, 1),
            DEFAULT_LAUNCH_BATCH,
        ),
        ("mixed shapes with a launch batch of 1000", mixed(size), LARGE_BATCH),
    ];
    let patterns = patterns
        .into_iter()
        .map(|(pattern, demand, batch)| {
            let mut config = AutoscalerConfig::new(node_types.clone(), u32::MAX);
            config.max_launch_batch = batch;
            let autoscaler = Autoscaler::new(config).expect("the simulated configuration is valid");
            run_pattern(pattern, &autoscaler, cluster.clone(), &demand, size.rounds)
        })
        .collect();
    SimulationReport {
        node_types: size.node_types,
        nodes: size.nodes,
        patterns,
    }
}

/// Rounds of one pattern: the demand stays, each round's launches join
/// the view as launching nodes and its removals leave it.
fn run_pattern(
    pattern: &'static str,
    autoscaler: &Autoscaler,
    mut cluster: ClusterView,
    demand: &Demand,
    rounds: usize,
) -> PatternReport {
    let mut times = Vec::with_capacity(rounds);
    let mut launched = 0;
    let mut last = Plan::default();
    for _ in 0..rounds {
        let started = Instant::now();
        let plan = autoscaler.decide(&cluster, demand);
        times.push(started.elapsed());
        launched += plan.launch_count();
        carry_out(&mut cluster, &plan, autoscaler.config());
        last = plan;
    }
    times.sort();
    PatternReport {
        pattern,
        distinct: demand.shapes.len() + demand.groups.len(),
        pending: demand.pending(),
        max_launch_batch: autoscaler.config().max_launch_batch,
        rounds,
        median: times.get(times.len() / 2).copied().unwrap_or_default(),
        max: times.last().copied().unwrap_or_default(),
        launched,
        unmet_at_end: last.unmet_count(),
    }
}

/// What the head's loop would do with a plan, at once.
fn carry_out(cluster: &mut ClusterView, plan: &Plan, config: &AutoscalerConfig) {
    let removed: BTreeSet<NodeId> = plan.removals.iter().map(|removal| removal.node).collect();
    cluster.nodes.retain(|node| !removed.contains(&node.id));
    for launch in &plan.launches {
        let node_type = config
            .node_types
            .iter()
            .find(|t| t.name == launch.node_type)
            .expect("launches name configured types");
        for _ in 0..launch.count {
            cluster.nodes.push(NodeView {
                id: NodeId::random(),
                node_type: Some(node_type.name.clone()),
                total: node_type.resources.clone(),
                available: node_type.resources.clone(),
                labels: node_type.labels.clone(),
                state: NodeState::Launching { waited: Duration::ZERO },
            });
        }
    }
}

/// Types of 2 to 96 CPUs with 2, 4 or 8 GiB a CPU; every fifth with 1 to 8
/// GPUs, every fiftieth with an accelerator; labelled with a zone and a tier.
fn node_types(count: usize) -> Vec<NodeType> {
    const CPUS: [u64; 8] = [2, 4, 8, 16, 32, 48, 64, 96];
    (0..count)
        .map(|i| {
            let cpus = CPUS[i % CPUS.len()];
            let mut resources = ResourceSet::new()
                .with(CPU, Amount::whole(cpus))
                .with(MEMORY, Amount::whole(cpus * GIB * [2, 4, 8][(i / CPUS.len()) % 3]));
            if i % 5 == 0 {
                resources.set(GPU, Amount::whole([1, 2, 4, 8][(i / 5) % 4]));
            }
            if i % 50 == 7 {
                resources.set(ACCELERATOR, Amount::whole(4));
            }
            let mut node_type = NodeType::new(&format!("type-{i:04}-{cpus}cpu"), resources, 20 + (i % 80) as u32);
            node_type.labels = Labels::from([
                ("zone".to_string(), format!("z{}", (i / 3) % ZONES)),
                ("tier".to_string(), ["spot", "on-demand"][i % 2].to_string()),
            ]);
            node_type
        })
        .collect()
}

/// An unmanaged head and `nodes` managed running nodes: a quarter full, a
/// quarter idle, the rest partly busy.
fn cluster(node_types: &[NodeType], nodes: usize) -> ClusterView {
    let mut rng = StdRng::seed_from_u64(36);
    let head = ResourceSet::new().with(CPU, Amount::whole(16));
    let mut views = vec![NodeView {
        id: NodeId::random(),
        node_type: None,
        total: head.clone(),
        available: ResourceSet::new(),
        labels: Labels::new(),
        state: NodeState::Running { idle_for: None },
    }];
    for i in 0..nodes {
        let node_type = &node_types[(i * 7) % node_types.len()];
        let (available, idle_for) = match i % 4 {
            0 => (ResourceSet::new(), None),
            1 => (
                node_type.resources.clone(),
                Some(Duration::from_secs(rng.random_range(0..600))),
            ),
            _ => (partly_free(&node_type.resources, &mut rng), None),
        };
        views.push(NodeView {
            id: NodeId::random(),
            node_type: Some(node_type.name.clone()),
            total: node_type.resources.clone(),
            available,
            labels: node_type.labels.clone(),
            state: NodeState::Running { idle_for },
        });
    }
    ClusterView {
        nodes: views,
        ..Default::default()
    }
}

/// A random share of each resource, in whole units of it.
fn partly_free(total: &ResourceSet, rng: &mut StdRng) -> ResourceSet {
    let mut free = ResourceSet::new();
    for (name, amount) in total.iter() {
        let units = amount.raw() / Amount::SCALE;
        free.set(name, Amount::whole(rng.random_range(0..=units) as u64));
    }
    free
}

fn shape(cpus: f64, gpus: u64, memory_gib: u64) -> ResourceSet {
    let mut resources = ResourceSet::new().with(CPU, Amount::parse(CPU, cpus).expect("valid amount"));
    resources.set(GPU, Amount::whole(gpus));
    resources.set(MEMORY, Amount::whole(memory_gib * GIB));
    resources
}

fn pending(shapes: Vec<(ResourceSet, LabelSelector)>, total: u64) -> Demand {
    let each = total / shapes.len() as u64;
    Demand {
        shapes: shapes
            .into_iter()
            .map(|(resources, selector)| ShapeDemand {
                resources,
                selector,
                count: each,
            })
            .collect(),
        groups: Vec::new(),
    }
}

fn uniform(size: &SimulationSize) -> Demand {
    pending(vec![(shape(1.0, 0, 0), LabelSelector::default())], size.pending)
}

/// 60 shapes: 0.5 to 8 CPUs, 0 to 2 GPUs, 0 to 32 GiB.
fn mixed(size: &SimulationSize) -> Demand {
    let mut shapes = Vec::new();
    for cpus in [0.5, 1.0, 2.0, 4.0, 8.0] {
        for gpus in 0..3 {
            for memory in [0, 2, 8, 32] {
                shapes.push((shape(cpus, gpus, memory), LabelSelector::default()));
            }
        }
    }
    pending(shapes, size.pending)
}

/// `distinct_shapes` shapes of 0.25 to 16 CPUs and 1 to 256 GiB (distinct
/// up to 16,384 of them), one in ten with a GPU and one in a hundred with
/// an accelerator.
fn distinct(size: &SimulationSize) -> Demand {
    let shapes = (0..size.distinct_shapes)
        .map(|i| {
            let quarters = 1 + i % 64;
            let memory = 1 + (i / 64) % 256;
            let mut resources = shape(quarters as f64 / 4.0, u64::from(i % 10 == 0), memory as u64);
            if i % 100 == 1 {
                resources.set(ACCELERATOR, Amount::whole(1));
            }
            (resources, LabelSelector::default())
        })
        .collect();
    pending(shapes, size.pending)
}

/// 1 to 4 CPU shapes in one zone, in two zones, or off spot nodes.
fn labelled(size: &SimulationSize) -> Demand {
    let select = |key: &str, expression: &str| LabelSelector::default().with(key, expression).expect("valid selector");
    let mut selectors: Vec<LabelSelector> = (0..ZONES).map(|zone| select("zone", &format!("z{zone}"))).collect();
    selectors.push(select("zone", "in(z1,z2)"));
    selectors.push(select("tier", "!spot"));
    let shapes = selectors
        .iter()
        .flat_map(|selector| [1.0, 2.0, 4.0].map(|cpus| (shape(cpus, 0, 0), selector.clone())))
        .collect();
    pending(shapes, size.pending)
}

/// `kinds` kinds of `count` groups of 4 bundles of 1 to 4 CPUs, half
/// STRICT_SPREAD, half STRICT_PACK.
fn groups(kinds: u64, count: u64) -> Demand {
    let groups = (0..kinds)
        .map(|i| GroupDemand {
            name: format!("pg-{i}"),
            bundles: vec![shape((1 + i % 4) as f64, 0, 0); 4],
            strategy: match i % 2 {
                0 => PlacementStrategy::StrictSpread,
                _ => PlacementStrategy::StrictPack,
            },
            count,
        })
        .collect();
    Demand {
        shapes: Vec::new(),
        groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run in release mode for the figures:
    /// `cargo test --release -p raylet-placement --lib autoscaler::simulation -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn full_size_decision_times() {
        let report = run(&SimulationSize::default());
        for pattern in &report.patterns {
            println!("{pattern:?}");
        }
    }

    #[test]
    fn a_small_simulation_launches_and_times_every_pattern() {
        let size = SimulationSize {
            node_types: 50,
            nodes: 40,
            pending: 2000,
            distinct_shapes: 100,
            distinct_groups: 500,
            rounds: 3,
        };
        let report = run(&size);
        assert_eq!(report.patterns.len(), 7);
        for pattern in &report.patterns {
            assert!(pattern.launched > 0, "{pattern:?}");
            assert!(
                pattern.launched <= pattern.max_launch_batch * size.rounds as u32,
                "{pattern:?}"
            );
            assert!(pattern.max >= pattern.median, "{pattern:?}");
        }
    }
}
