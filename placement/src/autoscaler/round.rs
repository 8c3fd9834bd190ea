//! One round's state, built from the cluster view and the demand: resource
//! names interned (types' first, then any a node adds), the nodes that are
//! capacity, counts against each limit, the demand resolved and checked
//! against the types, and the table of which selectors which labels meet.

use std::collections::HashMap;

use raylet_proto::Labels;

use super::Autoscaler;
use super::capacity::Capacity;
use super::cluster_view::{ClusterView, NodeState, NodeView};
use super::compat::{Compat, SelectorId, Selectors};
use super::config::AutoscalerConfig;
use super::demand::Demand;
use super::dense::{self, Names, Need};
use super::items::{self, GroupItem, ShapeItem};
use super::launches::{LaunchEvent, Limits};
use super::plan::Unmet;
use super::types::TypeTable;

pub(super) struct Round<'a> {
    pub config: &'a AutoscalerConfig,
    pub types: &'a TypeTable,
    pub demand: &'a Demand,
    pub stride: usize,
    /// Every type's resources, `stride` amounts each.
    pub type_rows: Vec<i64>,
    /// Whether each resource counts toward how well a node is used.
    pub counted: Vec<bool>,
    pub compat: Compat,
    pub capacity: Capacity,
    /// Where each node of the view is in `capacity`, if it is capacity.
    pub capacity_of_view: Vec<Option<usize>>,
    pub shapes: Vec<ShapeItem>,
    pub groups: Vec<GroupItem>,
    /// Nodes of each type neither draining nor removed.
    pub live: Vec<u32>,
    pub limits: Limits,
    pub backing_off: Vec<bool>,
    pub events: Vec<LaunchEvent>,
    pub unmet: Vec<Unmet>,
    pub fits_existing: u64,
}

/// The nodes of the view that count, with their types, label sets and
/// free resources.
struct Nodes<'a> {
    views: Vec<(usize, &'a NodeView, Option<usize>)>,
    label_set: Vec<usize>,
    label_sets: Vec<&'a Labels>,
    free: Vec<Free>,
}

/// What a node has free this round.
enum Free {
    /// What it reports; a node launching as a type no longer configured,
    /// its total.
    Own(Vec<(usize, i64)>),
    /// A launching node's type's full resources.
    OfType(usize),
}

impl<'a> Round<'a> {
    /// `removed[i]`: node `i` of the view is removed before the round packs.
    pub fn new(autoscaler: &'a Autoscaler, cluster: &'a ClusterView, demand: &'a Demand, removed: &[bool]) -> Self {
        let types = &autoscaler.types;
        let mut names = types.names().clone();
        let nodes = Nodes::new(types, cluster, removed, &mut names);
        let stride = names.len();
        let type_rows = types.rows(stride);
        let scale = scale(&type_rows, &nodes, stride);
        let mut selectors = Selectors::default();
        let mut shapes = items::shapes(demand, &names, &mut selectors);
        items::order_largest_first(&mut shapes, &scale);
        let groups = items::groups(demand, &names, &scale);
        let (capacity, capacity_of_view) = capacity(&nodes, stride, &type_rows, cluster.nodes.len());
        let mut round = Round {
            config: &autoscaler.config,
            types,
            demand,
            stride,
            counted: names.counted().to_vec(),
            compat: Compat::new(&selectors, &nodes.label_sets),
            capacity,
            capacity_of_view,
            shapes,
            groups,
            live: live_counts(types.len(), &nodes),
            limits: limits(&autoscaler.config, &nodes),
            backing_off: autoscaler
                .config
                .node_types
                .iter()
                .map(|t| cluster.backing_off.contains(&t.name))
                .collect(),
            type_rows,
            events: Vec::new(),
            unmet: Vec::new(),
            fits_existing: 0,
        };
        round.check_feasible();
        round
    }

    pub fn type_row(&self, node_type: usize) -> &[i64] {
        &self.type_rows[node_type * self.stride..(node_type + 1) * self.stride]
    }

    /// Whether some type, launched, could hold one copy of `need`.
    fn any_type_fits(&self, need: &Need, selector: SelectorId) -> bool {
        (0..self.types.len()).any(|t| {
            self.compat.allows(selector, self.types.label_set(t)) && dense::copies(self.type_row(t), need, 1) == 1
        })
    }

    fn check_feasible(&mut self) {
        for i in 0..self.shapes.len() {
            let shape = &self.shapes[i];
            let feasible = shape
                .need
                .as_ref()
                .is_some_and(|need| self.any_type_fits(need, shape.selector));
            self.shapes[i].feasible = feasible;
        }
        for i in 0..self.groups.len() {
            let bundles = &self.groups[i].bundles;
            let feasible = bundles
                .as_ref()
                .is_some_and(|bundles| bundles.iter().all(|bundle| self.any_type_fits(bundle, None)));
            self.groups[i].feasible = feasible;
        }
    }
}

impl<'a> Nodes<'a> {
    /// The view's nodes that are not removed, label sets numbered after
    /// the types' own, resources interned into `names`.
    fn new(types: &'a TypeTable, cluster: &'a ClusterView, removed: &[bool], names: &mut Names) -> Self {
        let mut label_sets: Vec<&Labels> = types.label_sets().iter().collect();
        let mut index: HashMap<&Labels, usize> = HashMap::new();
        let mut own_label_set = |labels: &'a Labels| {
            *index.entry(labels).or_insert_with(|| {
                label_sets.push(labels);
                label_sets.len() - 1
            })
        };
        let (mut views, mut label_set, mut free) = (Vec::new(), Vec::new(), Vec::new());
        for (i, node) in cluster.nodes.iter().enumerate().filter(|&(i, _)| !removed[i]) {
            let node_type = node.node_type.as_deref().and_then(|name| types.index_of(name));
            let (labels, amounts) = match (node.state, node_type) {
                (NodeState::Launching { .. }, Some(t)) => (types.label_set(t), Free::OfType(t)),
                (NodeState::Launching { .. }, None) => {
                    (own_label_set(&node.labels), Free::Own(names.amounts(&node.total)))
                }
                _ => (own_label_set(&node.labels), Free::Own(names.amounts(&node.available))),
            };
            views.push((i, node, node_type));
            label_set.push(labels);
            free.push(amounts);
        }
        Nodes {
            views,
            label_set,
            label_sets,
            free,
        }
    }
}

/// The capacity of the nodes that count: busy running nodes first, then
/// idle managed ones, then launching ones; draining nodes are none.
fn capacity(nodes: &Nodes, stride: usize, type_rows: &[i64], view_len: usize) -> (Capacity, Vec<Option<usize>>) {
    let mut capacity = Capacity::new(stride);
    let mut capacity_of_view = vec![None; view_len];
    let mut row = vec![0; stride];
    for pass in 0..3 {
        for (n, &(i, node, _)) in nodes.views.iter().enumerate() {
            let node_pass = match (node.state, node.is_managed() && node.idle_for().is_some()) {
                (NodeState::Draining, _) => continue,
                (NodeState::Running { .. }, false) => 0,
                (NodeState::Running { .. }, true) => 1,
                (NodeState::Launching { .. }, _) => 2,
            };
            if node_pass != pass {
                continue;
            }
            match &nodes.free[n] {
                Free::Own(amounts) => {
                    row.fill(0);
                    amounts.iter().for_each(|&(resource, amount)| row[resource] = amount);
                }
                Free::OfType(t) => row.copy_from_slice(&type_rows[t * stride..(t + 1) * stride]),
            }
            capacity_of_view[i] = Some(capacity.add_existing(&row, nodes.label_set[n]));
        }
    }
    (capacity, capacity_of_view)
}

fn live_counts(type_count: usize, nodes: &Nodes) -> Vec<u32> {
    let mut live = vec![0; type_count];
    for &(_, node, node_type) in &nodes.views {
        if let (Some(t), false) = (node_type, node.state == NodeState::Draining) {
            live[t] += 1;
        }
    }
    live
}

/// Headroom under each type's max_count (draining nodes still count),
/// under max_nodes, and the launch batch.
fn limits(config: &AutoscalerConfig, nodes: &Nodes) -> Limits {
    let mut present = vec![0u32; config.node_types.len()];
    let mut managed = 0u32;
    for &(_, node, node_type) in &nodes.views {
        if let Some(t) = node_type {
            present[t] += 1;
        }
        managed += u32::from(node.is_managed());
    }
    let per_type = config
        .node_types
        .iter()
        .zip(present)
        .map(|(t, present)| t.max_count.saturating_sub(present))
        .collect();
    Limits::new(
        per_type,
        config.max_nodes.saturating_sub(managed),
        config.max_launch_batch,
    )
}

/// The largest amount of each resource any type has, or any node has
/// free, at least 1.
fn scale(type_rows: &[i64], nodes: &Nodes, stride: usize) -> Vec<f64> {
    let mut largest = vec![1i64; stride];
    for row in type_rows.chunks_exact(stride.max(1)) {
        for (most, &amount) in largest.iter_mut().zip(row) {
            *most = (*most).max(amount);
        }
    }
    for free in &nodes.free {
        if let Free::Own(amounts) = free {
            for &(resource, amount) in amounts {
                largest[resource] = largest[resource].max(amount);
            }
        }
    }
    largest.into_iter().map(|amount| amount as f64).collect()
}
