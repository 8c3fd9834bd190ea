//! Removing nodes. A node still launching past the join timeout is
//! terminated (before the round packs, so that its demand is planned
//! again). A managed running node idle longer than its type's idle
//! timeout, that the round's demand does not need, is drained and
//! removed, longest idle first, while its type stays above min_count.
//! Busy, draining and unmanaged nodes are never removed, nor nodes of a
//! type no longer configured (whose idle timeout and min_count are gone).

use std::time::Duration;

use super::cluster_view::{ClusterView, NodeState};
use super::config::AutoscalerConfig;
use super::plan::{Removal, RemovalCause};
use super::types::TypeTable;

/// The managed nodes launching past the join timeout, and for every node
/// of the view whether it is one of them.
pub(super) fn not_joined(config: &AutoscalerConfig, cluster: &ClusterView) -> (Vec<Removal>, Vec<bool>) {
    let mut removed = vec![false; cluster.nodes.len()];
    let mut removals = Vec::new();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let (NodeState::Launching { waited }, Some(node_type)) = (node.state, &node.node_type) else {
            continue;
        };
        if waited > config.join_timeout {
            removed[i] = true;
            removals.push(Removal {
                node: node.id,
                cause: RemovalCause::DidNotJoin,
                reason: format!(
                    "did not join in {} s (type {}, launched {} s ago)",
                    config.join_timeout.as_secs(),
                    node_type,
                    waited.as_secs()
                ),
            });
        }
    }
    (removals, removed)
}

/// The idle nodes to remove. `live[t]`: nodes of type `t` neither draining
/// nor removed; `needed(i)`: whether the round packed demand on node `i`.
pub(super) fn idle_nodes(
    config: &AutoscalerConfig,
    types: &TypeTable,
    cluster: &ClusterView,
    removed: &[bool],
    live: &[u32],
    needed: impl Fn(usize) -> bool,
) -> Vec<Removal> {
    let mut candidates: Vec<(Duration, usize, usize)> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|&(i, _)| !removed[i] && !needed(i))
        .filter_map(|(i, node)| {
            let t = types.index_of(node.node_type.as_deref()?)?;
            let idle = node.idle_for()?;
            (idle > config.node_types[t].idle_timeout).then_some((idle, i, t))
        })
        .collect();
    candidates.sort_by_key(|&(idle, i, _)| (std::cmp::Reverse(idle), i));
    let mut live = live.to_vec();
    let mut removals = Vec::new();
    for (idle, i, t) in candidates {
        let node_type = &config.node_types[t];
        if live[t] <= node_type.min_count {
            continue;
        }
        live[t] -= 1;
        removals.push(Removal {
            node: cluster.nodes[i].id,
            cause: RemovalCause::Idle,
            reason: format!(
                "idle for {} s, longer than type {}'s idle_timeout of {} s",
                idle.as_secs(),
                node_type.name,
                node_type.idle_timeout.as_secs()
            ),
        });
    }
    removals
}
