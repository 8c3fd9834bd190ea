//! How many more workers the cluster has room for now: each alive node's
//! available resources, filled with workers' bundles (one per node for a
//! strict spread, one node's worth for a strict pack), as an elastic group
//! sizes its tries and decides to grow.

use raylet::Cluster;
use raylet::proto::resources::{Amount, CPU, GPU, MEMORY, ResourceSet};

use crate::{Placement, TrainError, WorkerResources};

/// The bundles of `resources` that the cluster's free resources hold now.
pub(super) fn free_workers(
    cluster: &Cluster,
    resources: &WorkerResources,
    placement: Placement,
) -> Result<usize, TrainError> {
    let demand = demand_of(resources)?;
    let status = cluster.status()?;
    let per_node: Vec<usize> = status
        .alive()
        .map(|node| {
            let mut available = node.available.clone();
            let mut fitted = 0;
            while available.try_subtract(&demand) {
                fitted += 1;
                if demand.is_empty() || placement == Placement::StrictSpread {
                    break;
                }
            }
            fitted
        })
        .collect();
    Ok(match placement {
        Placement::StrictPack => per_node.into_iter().max().unwrap_or(0),
        _ => per_node.into_iter().sum(),
    })
}

fn demand_of(resources: &WorkerResources) -> Result<ResourceSet, TrainError> {
    let standard = [
        (CPU, resources.num_cpus),
        (GPU, resources.num_gpus),
        (MEMORY, resources.memory),
    ];
    let custom = resources.custom.iter().map(|(name, amount)| (name.as_str(), *amount));
    let mut demand = ResourceSet::new();
    for (name, amount) in standard.into_iter().chain(custom).filter(|(_, amount)| *amount > 0.0) {
        let amount = Amount::parse(name, amount).map_err(|e| TrainError::InvalidConfig(e.to_string()))?;
        demand.set(name, amount);
    }
    Ok(demand)
}
