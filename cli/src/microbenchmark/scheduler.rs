//! `raylet microbenchmark --filter scheduler`: the scale simulations of the
//! head and of the autoscaler's decision, printed as figures: a thousand virtual nodes fed to the
//! real placement code, and the autoscaler's decision over a thousand node
//! types for a hundred thousand pending tasks; each on one thread.

use raylet_head::simulation::{self, SimulationSize};
use raylet_placement::autoscaler::simulation as autoscaler;

/// The prefix of every figure this prints; a filter that starts with it
/// runs the simulation alone, without a cluster.
pub const PREFIX: &str = "scheduler";

pub fn run(quick: bool) {
    let size = match quick {
        true => SimulationSize {
            tasks: 50_000,
            ..Default::default()
        },
        false => SimulationSize::default(),
    };
    let gpu_nodes = size.nodes.div_ceil(size.gpu_node_every);
    println!(
        "{PREFIX} simulation: {} virtual nodes of {} CPUs ({gpu_nodes} with {} GPUs), one thread",
        size.nodes, size.cpus_per_node, size.gpus_per_gpu_node
    );
    let report = simulation::run(&size);
    println!(
        "{PREFIX} placement decisions per second {:.2} ({} mixed-shape tasks in {:.2} s, {} found no room)",
        report.decisions_per_second(),
        report.decisions,
        report.decisions_elapsed.as_secs_f64(),
        report.queued
    );
    println!(
        "{PREFIX} time to place {} actors: {:.3} s",
        size.actors,
        report.actors_elapsed.as_secs_f64()
    );
    println!(
        "{PREFIX} time to place {} placement groups of 4 bundles: {:.3} s ({} created)",
        size.placement_groups,
        report.groups_elapsed.as_secs_f64(),
        report.groups_created
    );
    println!(
        "{PREFIX} head memory for {} nodes, {} actors and {} placement groups: {:.1} MiB",
        size.nodes,
        size.actors,
        size.placement_groups,
        report.head_memory as f64 / (1 << 20) as f64
    );
    run_autoscaler(quick);
}

/// The autoscaler's decision time a round, for each demand pattern.
fn run_autoscaler(quick: bool) {
    let size = match quick {
        true => autoscaler::SimulationSize {
            pending: 20_000,
            distinct_shapes: 2_000,
            distinct_groups: 500,
            rounds: 5,
            ..Default::default()
        },
        false => autoscaler::SimulationSize::default(),
    };
    println!(
        "{PREFIX} autoscaler simulation: {} node types over {} running nodes, {} rounds a pattern, one thread",
        size.node_types, size.nodes, size.rounds
    );
    let report = autoscaler::run(&size);
    let ms = |time: std::time::Duration| time.as_secs_f64() * 1e3;
    for pattern in &report.patterns {
        println!(
            "{PREFIX} autoscaler decision time for {} pending shapes over {} node types: median {:.2} ms, max {:.2} ms \
             ({}; {} distinct, launch batch {}, {} nodes launched, {} left waiting)",
            pattern.pending,
            report.node_types,
            ms(pattern.median),
            ms(pattern.max),
            pattern.pattern,
            pattern.distinct,
            pattern.max_launch_batch,
            pattern.launched,
            pattern.unmet_at_end
        );
    }
}
