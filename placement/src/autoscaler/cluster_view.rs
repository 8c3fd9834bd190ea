//! What one round sees of the cluster: every node with its type, resources,
//! labels and state, and the node types whose launches are held back.

use std::collections::BTreeSet;
use std::time::Duration;

use raylet_proto::{Labels, NodeId, ResourceSet};

/// The cluster as the head knows it when a round starts.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
    /// Node types whose launches failed lately: the caller's backoff holds
    /// them back this round, and demand goes to other types that fit.
    pub backing_off: BTreeSet<String>,
}

/// One node, launched by the autoscaler or not.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub id: NodeId,
    /// The type the autoscaler launched it as. `None`: the head or a node
    /// started by hand, which counts as capacity but is never removed.
    pub node_type: Option<String>,
    pub total: ResourceSet,
    pub available: ResourceSet,
    pub labels: Labels,
    pub state: NodeState,
}

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// Asked of the provider, not yet joined; counts as its type's full
    /// resources, so that the demand it was launched for is not launched
    /// for again.
    Launching { waited: Duration },
    /// Joined; `idle_for` is how long it has run nothing, `None` while busy.
    Running { idle_for: Option<Duration> },
    /// Being drained before removal: neither capacity nor removable again.
    Draining,
}

impl NodeView {
    /// Whether the autoscaler manages the node (it may remove it).
    pub fn is_managed(&self) -> bool {
        self.node_type.is_some()
    }

    /// How long the node has been idle, if it is running and idle.
    pub fn idle_for(&self) -> Option<Duration> {
        match self.state {
            NodeState::Running { idle_for } => idle_for,
            _ => None,
        }
    }
}
