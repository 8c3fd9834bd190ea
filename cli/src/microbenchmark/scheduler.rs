//! `raylet microbenchmark --filter scheduler`: the scale simulation of the
//! scheduler crate, a thousand virtual nodes fed to the real placement code
//! on one thread, printed as figures.

use raylet::scheduler::simulation::{self, SimulationSize};

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
}
