//! What a round decides: nodes to launch, nodes to remove, and the demand
//! left waiting, each with the reason the head logs and `raylet status`
//! shows.

use std::fmt;

use raylet_proto::NodeId;

use super::demand::Demand;

/// One round's decisions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// At most one entry per node type, in the order the round chose them.
    pub launches: Vec<Launch>,
    pub removals: Vec<Removal>,
    pub unmet: Vec<Unmet>,
    /// Tasks, actors and bundles that fit on nodes already running or
    /// launching, so that nothing launches for them.
    pub fits_existing: u64,
}

/// Ask the provider for `count` nodes of `node_type`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub node_type: String,
    pub count: u32,
    /// E.g. `3 x {CPU: 1} wait, 2 nodes of type cpu2 hold them`.
    pub reason: String,
}

/// Remove a node: drain it first if it joined, else terminate it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub node: NodeId,
    pub cause: RemovalCause,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemovalCause {
    /// Idle past its type's idle timeout and not needed: drain, then remove.
    Idle,
    /// Still launching past the join timeout: terminate; its demand is
    /// planned again in the same round.
    DidNotJoin,
}

/// Demand that no launch this round holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmet {
    pub demand: DemandRef,
    /// Tasks or actors of the shape, or groups.
    pub count: u64,
    pub reason: UnmetReason,
}

/// An entry of the round's [`Demand`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemandRef {
    Shape(usize),
    Group(usize),
}

/// Why demand waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnmetReason {
    /// No configured node type could ever hold it.
    NoTypeFits,
    /// Every type that fits is at its `max_count`; the first is named.
    TypeMax { node_type: String },
    /// The cluster is at `max_nodes`.
    MaxNodes,
    /// This round launched `max_launch_batch` nodes already; the next goes on.
    LaunchBatch,
    /// The types that fit are backing off after failed launches; the first
    /// is named.
    BackingOff { node_type: String },
}

impl Plan {
    /// Nodes this round launches, of every type.
    pub fn launch_count(&self) -> u32 {
        self.launches.iter().map(|launch| launch.count).sum()
    }

    /// Tasks, actors and groups left waiting.
    pub fn unmet_count(&self) -> u64 {
        self.unmet.iter().map(|unmet| unmet.count).sum()
    }
}

impl Unmet {
    /// E.g. `188 x {CPU: 1} wait: every node type that fits is at its max_count (first: 'cpu4')`.
    pub fn describe(&self, demand: &Demand) -> String {
        match self.demand {
            DemandRef::Shape(index) => format!(
                "{} x {} wait: {}",
                self.count,
                demand.shapes[index].describe(),
                self.reason
            ),
            DemandRef::Group(index) => {
                let group = &demand.groups[index];
                match group.count {
                    1 => format!("{} waits: {}", group.describe(), self.reason),
                    _ => format!("{} of {} wait: {}", self.count, group.describe(), self.reason),
                }
            }
        }
    }
}

impl fmt::Display for UnmetReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnmetReason::NoTypeFits => write!(f, "no node type can hold it"),
            UnmetReason::TypeMax { node_type } => write!(
                f,
                "every node type that fits is at its max_count (first: '{node_type}')"
            ),
            UnmetReason::MaxNodes => write!(f, "the cluster is at max_nodes"),
            UnmetReason::LaunchBatch => {
                write!(
                    f,
                    "this round launched max_launch_batch nodes already; the next round goes on"
                )
            }
            UnmetReason::BackingOff { node_type } => write!(
                f,
                "the node types that fit are backing off after failed launches (first: '{node_type}')"
            ),
        }
    }
}
