//! How many more workers the cluster has room for now: each alive node's
//! available resources, filled with workers' bundles (one per node for a
//! strict spread, one node's worth for a strict pack), as an elastic group
//! sizes its tries and decides to grow.

use raylet::{Bundle, Cluster};

use crate::{Placement, TrainError};

/// How many `bundle`s the cluster's free resources hold now.
pub(super) fn free_workers(cluster: &Cluster, bundle: &Bundle, placement: Placement) -> Result<usize, TrainError> {
    let demand = bundle.to_resource_set()?;
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
