//! The cluster's resources as the placement policies read them: every alive
//! node's total and available amounts in dense arrays indexed by interned
//! resource names, with each node's utilization kept up to date and the
//! nodes kept ranked by their score, so that the default policy finds the
//! best nodes without scanning all of them.

use std::collections::{BTreeSet, HashMap};

use raylet_proto::placement_group::is_bundle_resource;
use raylet_proto::resources::{GPU, OBJECT_STORE_MEMORY};
use raylet_proto::{Amount, Labels, NodeId, ResourceSet};

use super::policy::SPREAD_THRESHOLD;

/// A node's position in a [`ClusterResources`]; stable until it is removed.
pub type NodeIndex = usize;

/// One alive node.
#[derive(Clone, Debug)]
pub struct NodeResources {
    pub node_id: NodeId,
    pub address: String,
    pub labels: Labels,
    total: Vec<i64>,
    available: Vec<i64>,
    /// The highest share in use of any resource that counts.
    utilization: f64,
    /// The node's key in the ranking, once ranked.
    rank: Option<Rank>,
}

/// A node's place in the ranking: its score (0 below the spread
/// threshold, else its utilization in millionths), then a salt from its id
/// so that equal scores are not ordered by when nodes joined.
type Rank = (u32, u32, NodeIndex);

fn rank_of(node: &NodeResources, index: NodeIndex) -> Rank {
    let score = match node.utilization < SPREAD_THRESHOLD {
        true => 0,
        false => (node.utilization * 1e6) as u32,
    };
    let id = node.node_id.as_bytes();
    (score, u32::from_le_bytes([id[0], id[1], id[2], id[3]]), index)
}

impl NodeResources {
    fn amount(amounts: &[i64], resource: usize) -> i64 {
        amounts.get(resource).copied().unwrap_or(0)
    }

    pub fn utilization(&self) -> f64 {
        self.utilization
    }
}

/// A demand resolved against a cluster's resource names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    amounts: Vec<(usize, i64)>,
    /// A name no node has: nothing can fit the demand.
    unknown: Option<String>,
    needs_gpu: bool,
}

impl Demand {
    pub fn needs_gpu(&self) -> bool {
        self.needs_gpu
    }

    /// The first resource that no node has, if any.
    pub fn unknown_resource(&self) -> Option<&str> {
        self.unknown.as_deref()
    }
}

/// Every alive node's resources and labels.
#[derive(Clone, Debug, Default)]
pub struct ClusterResources {
    names: Vec<String>,
    name_index: HashMap<String, usize>,
    /// Whether each resource counts toward a node's utilization: the object
    /// store does not.
    counts: Vec<bool>,
    nodes: Vec<NodeResources>,
    index_of: HashMap<NodeId, NodeIndex>,
    gpu: Option<usize>,
    ranked: BTreeSet<Rank>,
}

impl ClusterResources {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, index: NodeIndex) -> &NodeResources {
        &self.nodes[index]
    }

    pub fn nodes(&self) -> &[NodeResources] {
        &self.nodes
    }

    pub fn index(&self, node_id: NodeId) -> Option<NodeIndex> {
        self.index_of.get(&node_id).copied()
    }

    /// Adds the node, or replaces what is known of it.
    pub fn upsert(&mut self, node_id: NodeId, address: &str, labels: &Labels, total: &ResourceSet) -> NodeIndex {
        let total = self.dense(total);
        let node = NodeResources {
            node_id,
            address: address.to_string(),
            labels: labels.clone(),
            available: total.clone(),
            total,
            utilization: 0.0,
            rank: None,
        };
        let index = match self.index_of.get(&node_id) {
            Some(&index) => {
                let old = std::mem::replace(&mut self.nodes[index], node);
                self.nodes[index].available = old.available;
                self.nodes[index].rank = old.rank;
                index
            }
            None => {
                self.nodes.push(node);
                self.index_of.insert(node_id, self.nodes.len() - 1);
                self.nodes.len() - 1
            }
        };
        self.refresh_utilization(index);
        index
    }

    /// Sets what the node has free, as it last reported.
    pub fn set_available(&mut self, index: NodeIndex, available: &ResourceSet) {
        self.nodes[index].available = self.dense(available);
        self.refresh_utilization(index);
    }

    /// Removes a node; the last node takes its index.
    pub fn remove(&mut self, node_id: NodeId) {
        let Some(index) = self.index_of.remove(&node_id) else {
            return;
        };
        let removed = self.nodes.swap_remove(index);
        if let Some(rank) = removed.rank {
            self.ranked.remove(&rank);
        }
        if let Some(moved) = self.nodes.get_mut(index) {
            self.index_of.insert(moved.node_id, index);
            if let Some(rank) = moved.rank.take() {
                self.ranked.remove(&rank);
            }
            self.refresh_utilization(index);
        }
    }

    /// Every node, best score first: the least utilized, with those below
    /// the spread threshold all counted as empty.
    pub fn ranked(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.ranked.iter().map(|&(_, _, index)| index)
    }

    /// Resolves `demand` to resource indices.
    pub fn demand(&self, demand: &ResourceSet) -> Demand {
        let mut resolved = Demand::default();
        for (name, amount) in demand.iter() {
            resolved.needs_gpu |= name == GPU;
            match self.name_index.get(name) {
                Some(&resource) => resolved.amounts.push((resource, amount.raw())),
                None if resolved.unknown.is_none() => resolved.unknown = Some(name.to_string()),
                None => {}
            }
        }
        resolved
    }

    /// Whether `demand` fits in what the node has free now.
    pub fn fits_now(&self, index: NodeIndex, demand: &Demand) -> bool {
        let node = &self.nodes[index];
        demand.unknown.is_none()
            && demand
                .amounts
                .iter()
                .all(|&(resource, amount)| NodeResources::amount(&node.available, resource) >= amount)
    }

    /// Whether `demand` could ever fit on the node.
    pub fn feasible(&self, index: NodeIndex, demand: &Demand) -> bool {
        let node = &self.nodes[index];
        demand.unknown.is_none()
            && demand
                .amounts
                .iter()
                .all(|&(resource, amount)| NodeResources::amount(&node.total, resource) >= amount)
    }

    /// Whether all of `demands` together fit in what the node has free now
    /// (`now`), or in its total.
    pub fn fits_together(&self, index: NodeIndex, demands: &[&Demand], now: bool) -> bool {
        let node = &self.nodes[index];
        let amounts = if now { &node.available } else { &node.total };
        let mut needed: Vec<(usize, i64)> = Vec::new();
        for demand in demands {
            if demand.unknown.is_some() {
                return false;
            }
            for &(resource, amount) in &demand.amounts {
                match needed.iter_mut().find(|(r, _)| *r == resource) {
                    Some((_, sum)) => *sum += amount,
                    None => needed.push((resource, amount)),
                }
            }
        }
        needed
            .iter()
            .all(|&(resource, amount)| NodeResources::amount(amounts, resource) >= amount)
    }

    /// Whether the node has GPUs at all.
    pub fn has_gpu(&self, index: NodeIndex) -> bool {
        self.gpu
            .is_some_and(|gpu| NodeResources::amount(&self.nodes[index].total, gpu) > 0)
    }

    /// Takes `demand` from the node's free resources: placed work counts
    /// until the node's next report says otherwise.
    pub fn subtract(&mut self, index: NodeIndex, demand: &Demand) {
        let node = &mut self.nodes[index];
        for &(resource, amount) in &demand.amounts {
            if let Some(free) = node.available.get_mut(resource) {
                *free = (*free - amount).max(0);
            }
        }
        self.refresh_utilization(index);
    }

    /// Gives `demand` back to the node's free resources, up to its total.
    pub fn add_back(&mut self, index: NodeIndex, demand: &Demand) {
        let node = &mut self.nodes[index];
        for &(resource, amount) in &demand.amounts {
            let total = NodeResources::amount(&node.total, resource);
            if let Some(free) = node.available.get_mut(resource) {
                *free = (*free + amount).min(total);
            }
        }
        self.refresh_utilization(index);
    }

    /// The largest amount of `resource` any node has, and that node's index.
    pub fn largest(&self, resource: usize, eligible: impl Fn(NodeIndex) -> bool) -> Option<(NodeIndex, i64)> {
        (0..self.nodes.len())
            .filter(|&index| eligible(index))
            .map(|index| (index, NodeResources::amount(&self.nodes[index].total, resource)))
            .max_by_key(|&(_, amount)| amount)
    }

    /// The demand's amounts by name, for messages.
    pub fn describe(&self, demand: &Demand) -> String {
        let parts: Vec<String> = demand
            .amounts
            .iter()
            .map(|&(resource, amount)| format!("{}: {}", self.names[resource], display(amount)))
            .collect();
        format!("{{{}}}", parts.join(", "))
    }

    /// The demand's amounts as (name, raw amount) pairs.
    pub fn demand_amounts<'a>(&'a self, demand: &'a Demand) -> impl Iterator<Item = (usize, &'a str, i64)> + 'a {
        demand
            .amounts
            .iter()
            .map(|&(resource, amount)| (resource, self.names[resource].as_str(), amount))
    }

    /// The node's total resources.
    pub fn total_of(&self, index: NodeIndex) -> ResourceSet {
        let mut total = ResourceSet::new();
        for (resource, &raw) in self.nodes[index].total.iter().enumerate() {
            total.set(&self.names[resource], Amount::from_raw(raw).unwrap_or_default());
        }
        total
    }

    /// The node's total resources, for messages.
    pub fn describe_total(&self, index: NodeIndex) -> String {
        let parts: Vec<String> = self.nodes[index]
            .total
            .iter()
            .enumerate()
            .filter(|&(_, &amount)| amount > 0)
            .map(|(resource, &amount)| format!("{}: {}", self.names[resource], display(amount)))
            .collect();
        format!("{{{}}}", parts.join(", "))
    }

    fn intern(&mut self, name: &str) -> usize {
        if let Some(&index) = self.name_index.get(name) {
            return index;
        }
        let index = self.names.len();
        self.names.push(name.to_string());
        self.name_index.insert(name.to_string(), index);
        self.counts.push(name != OBJECT_STORE_MEMORY);
        if name == GPU {
            self.gpu = Some(index);
        }
        index
    }

    /// The amounts of `set` by resource index. Placement group bundles'
    /// resources are left out: work in a bundle is sent to its node
    /// directly, and their names would only pile up here.
    fn dense(&mut self, set: &ResourceSet) -> Vec<i64> {
        let mut amounts = vec![0; self.names.len()];
        for (name, amount) in set.iter().filter(|(name, _)| !is_bundle_resource(name)) {
            let resource = self.intern(name);
            if amounts.len() <= resource {
                amounts.resize(resource + 1, 0);
            }
            amounts[resource] = amount.raw();
        }
        amounts
    }

    fn refresh_utilization(&mut self, index: NodeIndex) {
        let node = &mut self.nodes[index];
        let mut highest: f64 = 0.0;
        for (resource, &total) in node.total.iter().enumerate() {
            if total > 0 && self.counts[resource] {
                let free = NodeResources::amount(&node.available, resource);
                highest = highest.max(1.0 - free as f64 / total as f64);
            }
        }
        node.utilization = highest;
        let rank = rank_of(node, index);
        if node.rank != Some(rank) {
            if let Some(old) = node.rank.replace(rank) {
                self.ranked.remove(&old);
            }
            self.ranked.insert(rank);
        }
    }
}

/// A raw amount as the resource sets show it, e.g. "0.25".
pub(crate) fn display(raw: i64) -> String {
    Amount::from_raw(raw.max(0)).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use raylet_proto::resources::CPU;

    use super::*;

    fn set(cpus: f64, gpus: f64) -> ResourceSet {
        ResourceSet::new()
            .with(CPU, Amount::parse(CPU, cpus).unwrap())
            .with(GPU, Amount::parse(GPU, gpus).unwrap())
    }

    #[test]
    fn placed_work_counts_until_the_next_report_and_utilization_follows() {
        let mut cluster = ClusterResources::new();
        let node = cluster.upsert(NodeId::random(), "a:1", &Labels::new(), &set(4.0, 2.0));
        let demand = cluster.demand(&set(2.0, 0.5));
        assert!(cluster.fits_now(node, &demand));
        cluster.subtract(node, &demand);
        cluster.subtract(node, &demand);
        assert!(!cluster.fits_now(node, &demand));
        assert!(cluster.feasible(node, &demand));
        assert_eq!(cluster.node(node).utilization(), 1.0);
        cluster.set_available(node, &set(3.0, 2.0));
        assert_eq!(cluster.node(node).utilization(), 0.25);
    }

    #[test]
    fn a_resource_no_node_has_makes_the_demand_unfit_everywhere() {
        let mut cluster = ClusterResources::new();
        let node = cluster.upsert(NodeId::random(), "a:1", &Labels::new(), &set(4.0, 0.0));
        let demand = cluster.demand(&ResourceSet::new().with("TPU", Amount::whole(1)));
        assert_eq!(demand.unknown_resource(), Some("TPU"));
        assert!(!cluster.feasible(node, &demand));
    }

    #[test]
    fn removing_a_node_keeps_the_others_found_by_id() {
        let mut cluster = ClusterResources::new();
        let ids: Vec<NodeId> = (0..3).map(|_| NodeId::random()).collect();
        for id in &ids {
            cluster.upsert(*id, "x:1", &Labels::new(), &set(1.0, 0.0));
        }
        cluster.remove(ids[0]);
        assert_eq!(cluster.len(), 2);
        assert_eq!(cluster.index(ids[0]), None);
        for id in &ids[1..] {
            assert_eq!(cluster.node(cluster.index(*id).unwrap()).node_id, *id);
        }
    }
}
