//! The scale simulation: a virtual cluster of a thousand nodes that exist
//! only in the head's node table, fed to the real placement code on one
//! thread. It measures placement decisions per second for a million
//! mixed-shape tasks, the time to place ten thousand actors (recorded in
//! the real actor table) and a thousand placement groups (through the real
//! group manager, whose node calls succeed at once), and the memory that
//! head state takes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use raylet_placement::{Choice, ClusterResources, Demand, Placer, Request};
use raylet_proto::resources::{CPU, GPU, MEMORY};
use raylet_proto::v1::WorkerBinary;
use raylet_proto::{
    ActorId, Amount, LabelSelector, Labels, NodeId, PlacementGroupId, PlacementStrategy, ResourceSet, Scheduling,
    SchedulingStrategy, WorkerId,
};

use crate::actors::{ActorSpec, ActorTable, Grant};
use crate::placement_groups::{BundleCallError, BundleNodes, GroupManager, GroupSpec, GroupState};
use crate::{NodeTable, Registration};

/// The size of the simulated cluster and workload.
#[derive(Clone, Debug)]
pub struct SimulationSize {
    pub nodes: usize,
    pub cpus_per_node: u64,
    /// Every this many nodes one has GPUs.
    pub gpu_node_every: usize,
    pub gpus_per_gpu_node: u64,
    pub tasks: usize,
    pub actors: usize,
    pub placement_groups: usize,
}

impl Default for SimulationSize {
    fn default() -> Self {
        SimulationSize {
            nodes: 1000,
            cpus_per_node: 64,
            gpu_node_every: 4,
            gpus_per_gpu_node: 8,
            tasks: 1_000_000,
            actors: 10_000,
            placement_groups: 1000,
        }
    }
}

/// What the simulation measured.
#[derive(Clone, Debug)]
pub struct SimulationReport {
    pub decisions: usize,
    pub decisions_elapsed: Duration,
    /// Tasks that found no node with room and would wait.
    pub queued: usize,
    pub actors_elapsed: Duration,
    pub groups_elapsed: Duration,
    pub groups_created: usize,
    /// Resident memory the head's tables added, in bytes.
    pub head_memory: u64,
}

impl SimulationReport {
    pub fn decisions_per_second(&self) -> f64 {
        self.decisions as f64 / self.decisions_elapsed.as_secs_f64()
    }
}

/// Node calls that succeed at once: the group manager's own work is what is timed.
struct InstantNodes;

impl BundleNodes for InstantNodes {
    async fn reserve(
        &self,
        _: &str,
        _: PlacementGroupId,
        _: Vec<(u32, ResourceSet)>,
        _: bool,
    ) -> Result<(), BundleCallError> {
        Ok(())
    }

    async fn commit(&self, _: &str, _: PlacementGroupId, _: Vec<u32>) -> Result<(), BundleCallError> {
        Ok(())
    }

    async fn release(&self, _: &str, _: PlacementGroupId, _: Vec<u32>) -> Result<(), BundleCallError> {
        Ok(())
    }
}

/// Runs the whole simulation on the calling thread.
pub fn run(size: &SimulationSize) -> SimulationReport {
    let memory_before = resident_bytes();
    let nodes = Arc::new(Mutex::new(virtual_nodes(size)));
    let (decisions_elapsed, queued) = place_tasks(&mut nodes.lock().expect("one thread"), size);
    refill(&mut nodes.lock().expect("one thread"));
    let mut actors = ActorTable::default();
    let actors_elapsed = place_actors(&mut nodes.lock().expect("one thread"), &mut actors, size.actors);
    refill(&mut nodes.lock().expect("one thread"));
    let groups = GroupManager::new(nodes.clone(), InstantNodes);
    let started = Instant::now();
    let groups_created = place_groups(&groups, size.placement_groups);
    let groups_elapsed = started.elapsed();
    let head_memory = resident_bytes().saturating_sub(memory_before);
    drop((actors, groups, nodes));
    SimulationReport {
        decisions: size.tasks,
        decisions_elapsed,
        queued,
        actors_elapsed,
        groups_elapsed,
        groups_created,
        head_memory,
    }
}

/// A node table with every virtual node registered, GPU nodes mixed in,
/// each labelled with one of four zones.
fn virtual_nodes(size: &SimulationSize) -> NodeTable {
    let mut table = NodeTable::new(Duration::from_secs(3600));
    let now = Instant::now();
    for i in 0..size.nodes {
        let mut total = ResourceSet::new()
            .with(CPU, Amount::whole(size.cpus_per_node))
            .with(MEMORY, Amount::whole(size.cpus_per_node << 32));
        if i % size.gpu_node_every == 0 {
            total.set(GPU, Amount::whole(size.gpus_per_gpu_node));
        }
        let labels = Labels::from([("zone".to_string(), format!("z{}", i % 4))]);
        let registration = Registration {
            node_id: NodeId::random(),
            address: format!("10.0.{}.{}:6381", i / 250, i % 250),
            hostname: format!("virtual-{i}"),
            is_head_node: i == 0,
            total,
            labels,
            metrics_address: None,
        };
        table.register(registration, now);
    }
    table
}

/// Frees every node, as fresh heartbeats after the work ended would.
fn refill(table: &mut NodeTable) {
    let view = table.placement_view();
    let full: Vec<ResourceSet> = (0..view.len()).map(|i| view.total_of(i)).collect();
    for (index, total) in full.iter().enumerate() {
        view.set_available(index, total);
    }
}

/// One shape of the task mix, with its strategy.
struct TaskShape {
    demand: Demand,
    /// CPUs in fixed-point units, to keep the cluster busy but not full.
    cpus: i64,
    scheduling: Scheduling,
}

fn task_mix(view: &ClusterResources) -> Vec<TaskShape> {
    let amount = |name: &str, value: f64| Amount::parse(name, value).expect("valid amounts");
    let shape = |set: ResourceSet, scheduling: Scheduling| TaskShape {
        demand: view.demand(&set),
        cpus: set.get(CPU).raw(),
        scheduling,
    };
    let cpus = |n: f64| ResourceSet::new().with(CPU, amount(CPU, n));
    let spread = Scheduling {
        strategy: SchedulingStrategy::Spread,
        ..Default::default()
    };
    let zone = Scheduling {
        label_selector: LabelSelector::default()
            .with("zone", "in(z1,z2)")
            .expect("valid selector"),
        ..Default::default()
    };
    let near = Scheduling {
        strategy: SchedulingStrategy::NodeAffinity {
            node_id: view.node(view.len() / 2).node_id,
            soft: true,
        },
        ..Default::default()
    };
    let mut mix: Vec<TaskShape> = (0..10).map(|_| shape(cpus(1.0), Scheduling::default())).collect();
    mix.extend([
        shape(cpus(0.5), Scheduling::default()),
        shape(cpus(0.5), Scheduling::default()),
        shape(cpus(2.0), Scheduling::default()),
        shape(cpus(2.0), Scheduling::default()),
        shape(cpus(1.0).with(GPU, amount(GPU, 1.0)), Scheduling::default()),
        shape(cpus(4.0).with(MEMORY, Amount::whole(16 << 30)), Scheduling::default()),
        shape(cpus(1.0), spread.clone()),
        shape(cpus(1.0), spread),
        shape(cpus(1.0), zone),
        shape(cpus(1.0), near),
    ]);
    mix
}

/// Places `size.tasks` tasks of the mix (half plain 1-CPU tasks, one in
/// twenty on a GPU); the oldest finish while seven tenths of the CPUs are
/// taken, so most decisions are made on a busy cluster, past the point
/// where the default policy packs.
fn place_tasks(table: &mut NodeTable, size: &SimulationSize) -> (Duration, usize) {
    let view = table.placement_view();
    let shapes = task_mix(view);
    let mut placer = Placer::new(7);
    let mut rng = StdRng::seed_from_u64(11);
    let busy = Amount::whole(size.nodes as u64 * size.cpus_per_node).raw() / 10 * 7;
    let mut running: VecDeque<(usize, usize)> = VecDeque::new();
    let mut taken = 0;
    let mut queued = 0;
    let started = Instant::now();
    for _ in 0..size.tasks {
        let kind = rng.random_range(0..shapes.len());
        let shape = &shapes[kind];
        let request = Request {
            demand: &shape.demand,
            scheduling: &shape.scheduling,
            preferred: Some(rng.random_range(0..view.len())),
        };
        match placer.choose(view, &request) {
            Choice::Run(node) => {
                view.subtract(node, &shape.demand);
                running.push_back((node, kind));
                taken += shape.cpus;
            }
            _ => queued += 1,
        }
        while taken > busy
            && let Some((node, kind)) = running.pop_front()
        {
            view.add_back(node, &shapes[kind].demand);
            taken -= shapes[kind].cpus;
        }
    }
    (started.elapsed(), queued)
}

/// Places actors as the head does (its policy, the demand counted against
/// the node) and records each one alive in the actor table.
fn place_actors(table: &mut NodeTable, actors: &mut ActorTable, count: usize) -> Duration {
    let view = table.placement_view();
    let one_cpu = ResourceSet::new().with(CPU, Amount::whole(1));
    let mut placer = Placer::new(13);
    let started = Instant::now();
    for i in 0..count {
        let spec = actor_spec(i, &one_cpu);
        let demand = view.demand(&spec.placement);
        let scheduling = Scheduling::default();
        let request = Request {
            demand: &demand,
            scheduling: &scheduling,
            preferred: None,
        };
        let Choice::Run(node) = placer.choose(view, &request) else {
            continue;
        };
        view.subtract(node, &demand);
        let Ok((spec, _kill)) = actors.create(spec) else {
            continue;
        };
        let host = Grant {
            node: view.node(node).address.clone(),
            worker_id: WorkerId::random(),
            address: view.node(node).address.clone(),
            node_id: view.node(node).node_id,
            incarnation: 1,
            pid: 1000 + i as u32,
        };
        actors.alive(spec.id, &host);
    }
    started.elapsed()
}

fn actor_spec(i: usize, placement: &ResourceSet) -> ActorSpec {
    ActorSpec {
        id: ActorId::random(),
        class_name: "simulation::Trainer".into(),
        args: Vec::new(),
        binary: WorkerBinary {
            path: "/opt/app/bin/train".into(),
            hash: "0123456789abcdef".into(),
            namespace: "default".into(),
        },
        placement: placement.clone(),
        running: ResourceSet::new(),
        scheduling: Scheduling::default(),
        name: format!("trainer-{i}"),
        namespace: "default".into(),
        detached: false,
        max_restarts: 3,
        max_task_retries: 0,
        max_concurrency: 1,
        owner: "10.0.0.1:40000".into(),
    }
}

/// Creates groups of four bundles under every strategy in turn; returns
/// how many were created.
fn place_groups(groups: &GroupManager<InstantNodes>, count: usize) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let strategies = [
        PlacementStrategy::Pack,
        PlacementStrategy::Spread,
        PlacementStrategy::StrictPack,
        PlacementStrategy::StrictSpread,
    ];
    let bundle = ResourceSet::new().with(CPU, Amount::whole(2));
    runtime.block_on(async {
        let mut created = 0;
        for i in 0..count {
            let spec = GroupSpec {
                id: PlacementGroupId::random(),
                name: format!("trial-{i}"),
                bundles: vec![bundle.clone(); 4],
                strategy: strategies[i % strategies.len()],
            };
            if let Ok(record) = groups.create(spec).await
                && record.state == GroupState::Created
            {
                created += 1;
            }
        }
        created
    })
}

/// This process's resident memory, from /proc/self/statm.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_simulation_places_everything_it_can() {
        let size = SimulationSize {
            nodes: 20,
            tasks: 5000,
            actors: 100,
            placement_groups: 20,
            ..Default::default()
        };
        let report = run(&size);
        assert_eq!(report.decisions, 5000);
        assert!(report.queued < report.decisions / 10, "{report:?}");
        assert_eq!(report.groups_created, 20, "{report:?}");
    }
}
