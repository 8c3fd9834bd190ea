//! The autoscaler's configuration: the node types it may launch (resources,
//! labels, how many, how long one may sit idle) and its limits, as read
//! from YAML, checked once before the first round.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use raylet_proto::{Amount, Labels, ResourceSet};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How long a node may sit idle before it is removed, unless its type says.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a launched node has to join the cluster before it is terminated.
const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The most nodes launched in one round, so that a burst of demand does not
/// become a launch storm: the next round sees them launching and goes on.
pub const DEFAULT_LAUNCH_BATCH: u32 = 10;

/// A kind of node the provider can launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeType {
    pub name: String,
    /// What one node of this type offers, e.g. `{CPU: 8, memory: 34359738368}`.
    #[serde(deserialize_with = "resource_map")]
    pub resources: ResourceSet,
    #[serde(default)]
    pub labels: Labels,
    /// Kept running even without demand.
    #[serde(default)]
    pub min_count: u32,
    pub max_count: u32,
    #[serde(rename = "idle_timeout_s", with = "seconds", default = "default_idle_timeout")]
    pub idle_timeout: Duration,
}

/// The node types and the limits on the nodes the autoscaler manages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalerConfig {
    pub node_types: Vec<NodeType>,
    /// The most managed nodes at once, of all types together.
    pub max_nodes: u32,
    /// The most nodes launched in one round.
    #[serde(default = "default_launch_batch")]
    pub max_launch_batch: u32,
    /// A node still launching after this long is terminated and its demand
    /// planned again.
    #[serde(rename = "join_timeout_s", with = "seconds", default = "default_join_timeout")]
    pub join_timeout: Duration,
}

/// A configuration the autoscaler refuses to run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("node type {index} has an empty name")]
    EmptyName { index: usize },
    #[error("node type '{0}' is defined twice")]
    DuplicateType(String),
    #[error("node type '{0}' declares no resources: nothing could ever run on it")]
    NoResources(String),
    #[error("node type '{node_type}' has min_count {min} above its max_count {max}")]
    MinAboveMax { node_type: String, min: u32, max: u32 },
    #[error("the node types' min_count add up to {total}, above max_nodes {max_nodes}")]
    MinimumsAboveMaxNodes { total: u64, max_nodes: u32 },
    #[error("max_launch_batch must be at least 1")]
    NoLaunchBatch,
}

impl AutoscalerConfig {
    /// A configuration with the default launch batch and join timeout.
    pub fn new(node_types: Vec<NodeType>, max_nodes: u32) -> Self {
        AutoscalerConfig {
            node_types,
            max_nodes,
            max_launch_batch: DEFAULT_LAUNCH_BATCH,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
        }
    }

    /// Checks every rule a round relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut names = BTreeSet::new();
        for (index, node_type) in self.node_types.iter().enumerate() {
            if node_type.name.is_empty() {
                return Err(ConfigError::EmptyName { index });
            }
            if !names.insert(node_type.name.as_str()) {
                return Err(ConfigError::DuplicateType(node_type.name.clone()));
            }
            node_type.validate()?;
        }
        let total: u64 = self.node_types.iter().map(|t| u64::from(t.min_count)).sum();
        if total > u64::from(self.max_nodes) {
            return Err(ConfigError::MinimumsAboveMaxNodes {
                total,
                max_nodes: self.max_nodes,
            });
        }
        if self.max_launch_batch == 0 {
            return Err(ConfigError::NoLaunchBatch);
        }
        Ok(())
    }
}

impl NodeType {
    /// A type with no labels, no minimum and the default idle timeout.
    pub fn new(name: &str, resources: ResourceSet, max_count: u32) -> Self {
        NodeType {
            name: name.to_string(),
            resources,
            labels: Labels::new(),
            min_count: 0,
            max_count,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.resources.is_empty() {
            return Err(ConfigError::NoResources(self.name.clone()));
        }
        if self.min_count > self.max_count {
            return Err(ConfigError::MinAboveMax {
                node_type: self.name.clone(),
                min: self.min_count,
                max: self.max_count,
            });
        }
        Ok(())
    }
}

fn default_idle_timeout() -> Duration {
    DEFAULT_IDLE_TIMEOUT
}

fn default_join_timeout() -> Duration {
    DEFAULT_JOIN_TIMEOUT
}

fn default_launch_batch() -> u32 {
    DEFAULT_LAUNCH_BATCH
}

/// Reads resources as a map of name to amount, e.g. `{CPU: 8, GPU: 0.5}`.
fn resource_map<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ResourceSet, D::Error> {
    let amounts = BTreeMap::<String, f64>::deserialize(deserializer)?;
    let mut resources = ResourceSet::new();
    for (name, value) in amounts {
        let amount = Amount::parse(&name, value).map_err(serde::de::Error::custom)?;
        resources.set(&name, amount);
    }
    Ok(resources)
}

/// Durations as a number of seconds, e.g. `idle_timeout_s: 300`.
mod seconds {
    use super::*;

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(duration.as_secs_f64())
    }

    /// The longest duration a setting may have, as the CLI's: ten years.
    const MAX_SECONDS: f64 = 10.0 * 31_557_600.0;

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let seconds = f64::deserialize(deserializer)?;
        match Duration::try_from_secs_f64(seconds) {
            Ok(duration) if seconds <= MAX_SECONDS => Ok(duration),
            _ => Err(serde::de::Error::custom(format!(
                "{seconds} is not a number of seconds from 0 to {MAX_SECONDS} (ten years)"
            ))),
        }
    }
}
