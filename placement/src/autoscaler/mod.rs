//! The cluster autoscaler's decision: given the configured node types, the
//! cluster as the head sees it and the demand waiting for resources, which
//! nodes to launch, which to remove and what must wait. Pure and
//! synchronous: the head's loop calls [`Autoscaler::decide`] once a round
//! and carries the [`Plan`] out through a provider.
//!
//! A round, in order:
//! 1. Nodes launching longer than the join timeout are removed; their
//!    demand is planned again below (the caller backs their type off by
//!    listing it in [`ClusterView::backing_off`]).
//! 2. Every type below its min_count launches up to it.
//! 3. Placement groups, in the demand's order, one by one, each all or
//!    nothing: STRICT_PACK's bundles on one node, STRICT_SPREAD's each on a
//!    node of its own, PACK and SPREAD as they fit. A bundle goes on a node with
//!    room (running nodes with what they report free, launching nodes with
//!    their type's full resources) or on one node launched for it; when a
//!    launch is refused, the group's launches and placements are undone.
//! 4. Shapes, largest first (first fit decreasing): copies go on nodes
//!    with room, counted arithmetically (copies per node are the least over
//!    resources of free / need); the rest launches nodes. The type is the
//!    one a node's worth of the copies leaves least unused (the mean over
//!    its resources of the share left free, so a GPU node is not launched
//!    for CPU work when a CPU node fits); ties go to the type that holds
//!    more copies, then to the smaller type. As many full nodes as the
//!    limits allow launch at once; a remainder that fills less than a node
//!    chooses again, which picks a smaller type for it.
//! 5. Managed running nodes idle longer than their type's idle timeout,
//!    that no demand was packed onto, are removed while their type stays
//!    above min_count.
//!
//! Nothing launches beyond what the demand (or a min_count) needs, and
//! every launch counts against its type's max_count, `max_nodes` and
//! `max_launch_batch`; demand they stop is reported in [`Plan::unmet`]
//! with the limit that stopped it, and the next round, seeing this one's
//! nodes launching, goes on. Running nodes are tried before launching
//! ones and busy ones before idle ones, so that demand keeps an idle node
//! only where busy nodes have no room.
//!
//! Costs: the demand comes counted (each shape, and each kind of group,
//! once with how many wait), so a round costs by distinct entries, not by
//! pending tasks: linear in the nodes, the node types and the entries,
//! plus first fit's scans of the nodes with room. A node that can no
//! longer hold the least of the demand left is dropped as a scan meets it,
//! and a front of free amounts answers without a scan when no node has
//! room. Choosing a type scans the types once per launch decision: at most
//! `max_launch_batch` that launch, and one for each entry a limit stops.
//! [`simulation`] measures it: 100,000 pending tasks over 1,000 node types
//! and 500 nodes.

mod capacity;
mod cluster_view;
mod compat;
mod config;
mod demand;
mod dense;
mod idle;
mod items;
mod launches;
mod packing;
mod plan;
mod round;
pub mod simulation;
mod types;

#[cfg(test)]
mod tests;

pub use cluster_view::{ClusterView, NodeState, NodeView};
pub use config::{AutoscalerConfig, ConfigError, DEFAULT_LAUNCH_BATCH, NodeType};
pub use demand::{Demand, GroupDemand, ShapeDemand};
pub use plan::{DemandRef, Launch, Plan, Removal, RemovalCause, Unmet, UnmetReason};

use round::Round;
use types::TypeTable;

/// The autoscaler's checked configuration, with its node types in the
/// dense form rounds compute with.
pub struct Autoscaler {
    config: AutoscalerConfig,
    types: TypeTable,
}

impl Autoscaler {
    pub fn new(config: AutoscalerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let types = TypeTable::new(&config.node_types);
        Ok(Autoscaler { config, types })
    }

    pub fn config(&self) -> &AutoscalerConfig {
        &self.config
    }

    /// One round's decisions for `demand` on `cluster`.
    pub fn decide(&self, cluster: &ClusterView, demand: &Demand) -> Plan {
        let (mut removals, removed) = idle::not_joined(&self.config, cluster);
        let mut round = Round::new(self, cluster, demand, &removed);
        round.launch_minimums();
        round.pack();
        removals.extend(idle::idle_nodes(
            &self.config,
            &self.types,
            cluster,
            &removed,
            &round.live,
            |view| round.touched_view(view),
        ));
        round.into_plan(removals)
    }
}
