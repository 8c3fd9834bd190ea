//! The cluster view that `raylet status` shows: nodes, their state and
//! resources, fetched from the head and decoded from its reply.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raylet_common::auth::AuthToken;
use raylet_proto::scheduling::{labels_from_proto, labels_to_proto};
use raylet_proto::v1;
use raylet_proto::{Labels, NodeId, PlacementStrategy, ResourceSet, Result, Scheduling};
use serde::Serialize;

/// Whether a node is part of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NodeState {
    Alive,
    Dead,
}

impl std::fmt::Display for NodeState {
    /// As the JSON form spells it: `ALIVE`, `DEAD`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeState::Alive => "ALIVE",
            NodeState::Dead => "DEAD",
        })
    }
}

/// Utilization of a machine: CPU and memory read with sysinfo, GPUs with
/// NVML.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeStats {
    pub cpu_percent: f64,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub gpus: Vec<GpuStats>,
}

/// One GPU of a node, as its driver reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuStats {
    /// The index CUDA gives it on its machine.
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub utilization_percent: f64,
    /// Why the driver could not read it, such as a GPU that fell off the bus.
    pub fault: Option<String>,
}

/// Work of one shape that waits for room, or that no node could ever fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResourceDemand {
    pub shape: ResourceSet,
    /// What else constrains it: a strategy, labels, a placement group.
    pub constraint: String,
    pub count: u64,
    pub infeasible: bool,
    /// Why it is infeasible.
    pub reason: String,
    /// The work's strategy and label selector, as the autoscaler reads it.
    #[serde(skip)]
    pub scheduling: Scheduling,
    /// A waiting placement group's bundles and strategy.
    #[serde(skip)]
    pub group: Option<GroupShape>,
}

/// The bundles a placement group still needs, and its strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupShape {
    pub bundles: Vec<ResourceSet>,
    pub strategy: PlacementStrategy,
}

impl ResourceDemand {
    pub fn from_proto(demand: &v1::ResourceDemand) -> Result<Self> {
        let group = match demand.bundles.is_empty() {
            true => None,
            false => Some(GroupShape {
                bundles: demand
                    .bundles
                    .iter()
                    .map(ResourceSet::from_proto)
                    .collect::<Result<_>>()?,
                strategy: PlacementStrategy::from_proto(demand.group_strategy()),
            }),
        };
        Ok(ResourceDemand {
            shape: ResourceSet::from_proto(&demand.shape.clone().unwrap_or_default())?,
            constraint: demand.constraint.clone(),
            count: demand.count,
            infeasible: demand.infeasible,
            reason: demand.reason.clone(),
            scheduling: Scheduling::from_proto(demand.scheduling.as_ref())?,
            group,
        })
    }

    pub fn to_proto(&self) -> v1::ResourceDemand {
        let (bundles, strategy) = match &self.group {
            Some(group) => (
                group.bundles.iter().map(ResourceSet::to_proto).collect(),
                group.strategy.to_proto(),
            ),
            None => (Vec::new(), v1::PlacementStrategy::default()),
        };
        v1::ResourceDemand {
            shape: Some(self.shape.to_proto()),
            constraint: self.constraint.clone(),
            count: self.count,
            infeasible: self.infeasible,
            reason: self.reason.clone(),
            scheduling: Some(self.scheduling.to_proto()),
            bundles,
            group_strategy: strategy as i32,
        }
    }
}

/// One incarnation of one node, as the head knows it.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    #[serde(serialize_with = "serialize_display")]
    pub node_id: NodeId,
    pub incarnation: u64,
    pub address: String,
    pub hostname: String,
    pub is_head_node: bool,
    pub state: NodeState,
    pub total: ResourceSet,
    pub available: ResourceSet,
    pub labels: Labels,
    /// Where the node serves Prometheus `/metrics`, if it does.
    pub metrics_address: Option<String>,
    pub stats: NodeStats,
    /// Lease requests waiting for room there, and those refused lately
    /// because no node could ever fit them.
    pub demands: Vec<ResourceDemand>,
    pub registered_unix_ms: u64,
    pub last_heartbeat_unix_ms: u64,
    pub died_unix_ms: Option<u64>,
    pub death_reason: Option<String>,
    /// Why the node is being drained: no work is placed there any more.
    pub draining: Option<String>,
}

/// Every node the head knows, alive and dead.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterStatus {
    pub now_unix_ms: u64,
    pub nodes: Vec<NodeStatus>,
    /// Placement groups that wait for room or can never be placed.
    pub placement_groups: Vec<ResourceDemand>,
    /// Jobs' drivers that wait for a node with room.
    pub waiting_drivers: Vec<ResourceDemand>,
}

impl ClusterStatus {
    pub fn alive(&self) -> impl Iterator<Item = &NodeStatus> {
        self.nodes.iter().filter(|n| n.state == NodeState::Alive)
    }

    pub fn dead(&self) -> impl Iterator<Item = &NodeStatus> {
        self.nodes.iter().filter(|n| n.state == NodeState::Dead)
    }

    /// Resources of all alive nodes added up.
    pub fn total(&self) -> ResourceSet {
        sum(self.alive().map(|n| &n.total))
    }

    /// How many times the alive nodes can hold `request` (resource name,
    /// amount), counted node by node; `usize::MAX` when it asks for nothing.
    pub fn fitting(&self, request: &[(String, f64)]) -> usize {
        let asked: Vec<&(String, f64)> = request.iter().filter(|(_, amount)| *amount > 0.0).collect();
        if asked.is_empty() {
            return usize::MAX;
        }
        self.alive()
            .map(|node| {
                asked
                    .iter()
                    .map(|(name, amount)| (node.total.get(name).as_f64() / amount + 1e-9).floor() as usize)
                    .min()
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Available resources of all alive nodes added up.
    pub fn available(&self) -> ResourceSet {
        sum(self.alive().map(|n| &n.available))
    }

    /// The demands of every alive node, those of one shape and constraint
    /// added up, then the placement groups' and the waiting drivers'.
    pub fn demands(&self) -> Vec<ResourceDemand> {
        let mut merged: Vec<ResourceDemand> = Vec::new();
        for demand in self.alive().flat_map(|node| &node.demands) {
            let same = merged.iter_mut().find(|d| {
                d.shape == demand.shape && d.constraint == demand.constraint && d.infeasible == demand.infeasible
            });
            match same {
                Some(existing) => existing.count += demand.count,
                None => merged.push(demand.clone()),
            }
        }
        merged.extend(self.placement_groups.iter().cloned());
        merged.extend(self.waiting_drivers.iter().cloned());
        merged
    }

    /// Asks the head at `head` for the cluster's nodes, retrying the
    /// connection for up to `patience`.
    pub async fn fetch(head: &str, token: &AuthToken, patience: Duration) -> Result<Self> {
        let mut client = raylet_proto::channel::connect_head(head, token, patience).await?;
        let reply = client.get_cluster_status(v1::GetClusterStatusRequest {}).await?;
        ClusterStatus::from_proto(reply.into_inner())
    }

    pub fn from_proto(status: v1::ClusterStatus) -> Result<Self> {
        let nodes = status.nodes.into_iter().map(NodeStatus::from_proto);
        Ok(ClusterStatus {
            now_unix_ms: status.now_unix_ms,
            nodes: nodes.collect::<Result<_>>()?,
            placement_groups: status
                .placement_groups
                .iter()
                .map(ResourceDemand::from_proto)
                .collect::<Result<_>>()?,
            waiting_drivers: status
                .waiting_drivers
                .iter()
                .map(ResourceDemand::from_proto)
                .collect::<Result<_>>()?,
        })
    }

    pub fn to_proto(&self) -> v1::ClusterStatus {
        v1::ClusterStatus {
            nodes: self.nodes.iter().map(NodeStatus::to_proto).collect(),
            now_unix_ms: self.now_unix_ms,
            protocol_version: raylet_proto::PROTOCOL_VERSION,
            placement_groups: self.placement_groups.iter().map(ResourceDemand::to_proto).collect(),
            waiting_drivers: self.waiting_drivers.iter().map(ResourceDemand::to_proto).collect(),
        }
    }
}

fn sum<'a>(sets: impl Iterator<Item = &'a ResourceSet>) -> ResourceSet {
    let mut total = ResourceSet::new();
    sets.for_each(|set| total.add(set));
    total
}

impl NodeStatus {
    pub fn from_proto(node: v1::NodeRecord) -> Result<Self> {
        let state = match node.state() {
            v1::NodeState::Alive => NodeState::Alive,
            _ => NodeState::Dead,
        };
        Ok(NodeStatus {
            node_id: NodeId::from_wire(&node.node_id)?,
            incarnation: node.incarnation,
            address: node.address,
            hostname: node.hostname,
            is_head_node: node.is_head_node,
            state,
            total: ResourceSet::from_proto(&node.total.unwrap_or_default())?,
            available: ResourceSet::from_proto(&node.available.unwrap_or_default())?,
            labels: labels_from_proto(&node.labels)?,
            metrics_address: (!node.metrics_address.is_empty()).then_some(node.metrics_address),
            demands: node
                .demands
                .iter()
                .map(ResourceDemand::from_proto)
                .collect::<Result<_>>()?,
            stats: NodeStats::from_proto(node.stats.unwrap_or_default()),
            registered_unix_ms: node.registered_unix_ms,
            last_heartbeat_unix_ms: node.last_heartbeat_unix_ms,
            died_unix_ms: (node.died_unix_ms > 0).then_some(node.died_unix_ms),
            death_reason: (!node.death_reason.is_empty()).then_some(node.death_reason),
            draining: (!node.draining.is_empty()).then_some(node.draining),
        })
    }

    pub fn to_proto(&self) -> v1::NodeRecord {
        let state = match self.state {
            NodeState::Alive => v1::NodeState::Alive,
            NodeState::Dead => v1::NodeState::Dead,
        };
        v1::NodeRecord {
            node_id: self.node_id.as_bytes().to_vec(),
            incarnation: self.incarnation,
            address: self.address.clone(),
            hostname: self.hostname.clone(),
            is_head_node: self.is_head_node,
            state: state as i32,
            total: Some(self.total.to_proto()),
            available: Some(self.available.to_proto()),
            stats: Some(self.stats.to_proto()),
            registered_unix_ms: self.registered_unix_ms,
            last_heartbeat_unix_ms: self.last_heartbeat_unix_ms,
            died_unix_ms: self.died_unix_ms.unwrap_or(0),
            death_reason: self.death_reason.clone().unwrap_or_default(),
            labels: labels_to_proto(&self.labels),
            demands: self.demands.iter().map(ResourceDemand::to_proto).collect(),
            metrics_address: self.metrics_address.clone().unwrap_or_default(),
            draining: self.draining.clone().unwrap_or_default(),
        }
    }
}

impl NodeStats {
    pub fn from_proto(stats: v1::NodeStats) -> Self {
        NodeStats {
            cpu_percent: stats.cpu_percent,
            memory_used_bytes: stats.memory_used_bytes,
            memory_total_bytes: stats.memory_total_bytes,
            gpus: stats.gpus.into_iter().map(GpuStats::from_proto).collect(),
        }
    }

    pub fn to_proto(&self) -> v1::NodeStats {
        v1::NodeStats {
            cpu_percent: self.cpu_percent,
            memory_used_bytes: self.memory_used_bytes,
            memory_total_bytes: self.memory_total_bytes,
            gpus: self.gpus.iter().map(GpuStats::to_proto).collect(),
        }
    }
}

impl GpuStats {
    pub fn from_proto(gpu: v1::GpuStats) -> Self {
        GpuStats {
            index: gpu.index,
            name: gpu.name,
            uuid: gpu.uuid,
            memory_total_bytes: gpu.memory_total_bytes,
            memory_used_bytes: gpu.memory_used_bytes,
            utilization_percent: gpu.utilization_percent,
            fault: Some(gpu.fault).filter(|fault| !fault.is_empty()),
        }
    }

    pub fn to_proto(&self) -> v1::GpuStats {
        v1::GpuStats {
            index: self.index,
            name: self.name.clone(),
            uuid: self.uuid.clone(),
            memory_total_bytes: self.memory_total_bytes,
            memory_used_bytes: self.memory_used_bytes,
            utilization_percent: self.utilization_percent,
            fault: self.fault.clone().unwrap_or_default(),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
}

fn serialize_display<T: std::fmt::Display, S: serde::Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}
