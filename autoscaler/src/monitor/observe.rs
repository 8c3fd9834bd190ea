//! What one round of the autoscaler sees: the head's cluster status and the
//! provider's instances, matched by the instance label, become the
//! [`ClusterView`] and [`Demand`] its decision reads. Idle time, launch
//! times and drains are the [`Tracker`]'s, kept from round to round.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use raylet_cluster_status::{ClusterStatus, NodeStatus};
use raylet_placement::autoscaler::{
    AutoscalerConfig, ClusterView, Demand, GroupDemand, NodeState, NodeView, ShapeDemand,
};
use raylet_proto::resources::OBJECT_STORE_MEMORY;
use raylet_proto::{LabelSelector, NodeId, SchedulingStrategy};

use crate::provider::{INSTANCE_LABEL, Instance, InstanceId, InstanceState};

/// What the autoscaler remembers between rounds.
#[derive(Default)]
pub(crate) struct Tracker {
    /// When each instance was first seen (launched by this process, or
    /// found running when it started).
    pub(crate) first_seen: HashMap<InstanceId, Instant>,
    /// The id a launching instance goes by in the view until it joins.
    launching_ids: HashMap<InstanceId, NodeId>,
    /// Since when each idle node has run nothing.
    idle_since: HashMap<NodeId, Instant>,
    /// Nodes being drained, with their instance and when the drain began.
    pub(crate) draining: HashMap<NodeId, Drain>,
    /// Node types whose launches failed lately.
    pub(crate) backoff: BTreeMap<String, TypeBackoff>,
}

/// A node being drained before its instance is terminated.
#[derive(Clone, Debug)]
pub(crate) struct Drain {
    pub(crate) instance: InstanceId,
    pub(crate) node_type: String,
    pub(crate) since: Instant,
    pub(crate) reason: String,
}

/// Failed launches of one node type, and when it may launch again.
#[derive(Clone, Debug)]
pub(crate) struct TypeBackoff {
    pub(crate) failures: u32,
    pub(crate) until: Instant,
    pub(crate) last_error: String,
}

/// A managed node as a round sees it, for the report and for carrying out
/// removals.
#[derive(Clone, Debug)]
pub(crate) struct Managed {
    pub(crate) instance: InstanceId,
    pub(crate) node_type: String,
    /// The alive node it runs, once it joined.
    pub(crate) node: Option<NodeStatus>,
    /// The id it has in the view: its node's, or a stand-in while launching.
    pub(crate) view_id: NodeId,
}

/// One round's observation.
pub(crate) struct Observation {
    pub(crate) view: ClusterView,
    pub(crate) demand: Demand,
    pub(crate) managed: Vec<Managed>,
}

impl Tracker {
    /// Builds the round's view and demand from `status` and the provider's
    /// running `instances`.
    pub(crate) fn observe(
        &mut self,
        config: &AutoscalerConfig,
        status: &ClusterStatus,
        instances: &[Instance],
        now: Instant,
    ) -> Observation {
        let running: Vec<&Instance> = instances
            .iter()
            .filter(|instance| instance.state == InstanceState::Running)
            .collect();
        for instance in &running {
            self.first_seen.entry(instance.id.clone()).or_insert(now);
        }
        self.forget_gone(&running, status);
        let by_instance: HashMap<&str, &Instance> = running.iter().map(|i| (i.id.0.as_str(), *i)).collect();
        let mut view = ClusterView {
            nodes: Vec::new(),
            backing_off: self.backing_off(now),
        };
        let mut managed = Vec::new();
        for node in status.alive() {
            let instance = node
                .labels
                .get(INSTANCE_LABEL)
                .and_then(|id| by_instance.get(id.as_str()));
            view.nodes
                .push(self.node_view(node, instance.map(|i| i.node_type.clone()), now));
            if let Some(instance) = instance {
                managed.push(Managed {
                    instance: instance.id.clone(),
                    node_type: instance.node_type.clone(),
                    node: Some(node.clone()),
                    view_id: node.node_id,
                });
            }
        }
        let joined: Vec<InstanceId> = managed.iter().map(|m| m.instance.clone()).collect();
        for instance in running.iter().filter(|i| !joined.contains(&i.id)) {
            let Some(node_type) = config.node_types.iter().find(|t| t.name == instance.node_type) else {
                continue;
            };
            let id = *self
                .launching_ids
                .entry(instance.id.clone())
                .or_insert_with(NodeId::random);
            let waited = now.saturating_duration_since(self.first_seen[&instance.id]);
            view.nodes.push(NodeView {
                id,
                node_type: Some(node_type.name.clone()),
                total: node_type.resources.clone(),
                available: node_type.resources.clone(),
                labels: node_type.labels.clone(),
                state: NodeState::Launching { waited },
            });
            managed.push(Managed {
                instance: instance.id.clone(),
                node_type: instance.node_type.clone(),
                node: None,
                view_id: id,
            });
        }
        Observation {
            view,
            demand: demand_of(status),
            managed,
        }
    }

    /// A joined node: draining, or running and idle for how long.
    fn node_view(&mut self, node: &NodeStatus, node_type: Option<String>, now: Instant) -> NodeView {
        let state = match self.draining.contains_key(&node.node_id) || node.draining.is_some() {
            true => NodeState::Draining,
            false => {
                let idle_for = match is_idle(node) {
                    true => Some(now.saturating_duration_since(*self.idle_since.entry(node.node_id).or_insert(now))),
                    false => {
                        self.idle_since.remove(&node.node_id);
                        None
                    }
                };
                NodeState::Running { idle_for }
            }
        };
        NodeView {
            id: node.node_id,
            node_type,
            total: node.total.clone(),
            available: node.available.clone(),
            labels: node.labels.clone(),
            state,
        }
    }

    /// Drops what is kept of instances and nodes that are gone.
    fn forget_gone(&mut self, running: &[&Instance], status: &ClusterStatus) {
        let listed = |id: &InstanceId| running.iter().any(|i| &i.id == id);
        self.first_seen.retain(|id, _| listed(id));
        self.launching_ids.retain(|id, _| listed(id));
        let alive: Vec<NodeId> = status.alive().map(|n| n.node_id).collect();
        self.idle_since.retain(|id, _| alive.contains(id));
    }

    fn backing_off(&self, now: Instant) -> std::collections::BTreeSet<String> {
        let held = self.backoff.iter().filter(|(_, backoff)| backoff.until > now);
        held.map(|(name, _)| name.clone()).collect()
    }

    /// Holds `node_type` back for longer after each failure: 5 s, 10 s, ...
    /// up to 5 minutes.
    pub(crate) fn launch_failed(&mut self, node_type: &str, error: String, now: Instant) -> Duration {
        let backoff = self.backoff.entry(node_type.to_string()).or_insert(TypeBackoff {
            failures: 0,
            until: now,
            last_error: String::new(),
        });
        backoff.failures += 1;
        let delay = BACKOFF_START
            .saturating_mul(1 << (backoff.failures - 1).min(10))
            .min(BACKOFF_MAX);
        backoff.until = now + delay;
        backoff.last_error = error;
        delay
    }

    /// A node of `node_type` joined: its launches work again.
    pub(crate) fn joined(&mut self, node_type: &str) {
        self.backoff.remove(node_type);
    }

    /// How long `node` has been idle, if it is.
    pub(crate) fn idle_for(&self, node: NodeId, now: Instant) -> Option<Duration> {
        self.idle_since
            .get(&node)
            .map(|since| now.saturating_duration_since(*since))
    }
}

const BACKOFF_START: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Whether the node runs nothing: every resource but object store memory
/// is free, and no work waits there.
pub(crate) fn is_idle(node: &NodeStatus) -> bool {
    let all_free = node
        .total
        .iter()
        .filter(|(name, _)| *name != OBJECT_STORE_MEMORY)
        .all(|(name, amount)| node.available.get(name) == amount);
    all_free && node.demands.iter().all(|demand| demand.infeasible)
}

/// The work waiting for room: tasks, actors and jobs' drivers by shape and
/// label selector, and placement groups. Work refused as infeasible has failed
/// already, and work inside a placement group or pinned to one node waits
/// for its group or node, not for a launch.
pub(crate) fn demand_of(status: &ClusterStatus) -> Demand {
    let mut shapes: Vec<ShapeDemand> = Vec::new();
    let queued = status.alive().flat_map(|node| &node.demands);
    let waiting = queued.chain(&status.waiting_drivers).filter(|d| !d.infeasible);
    for demand in waiting {
        let Some(selector) = launchable_selector(&demand.scheduling.strategy, &demand.scheduling.label_selector) else {
            continue;
        };
        match shapes
            .iter_mut()
            .find(|s| s.resources == demand.shape && s.selector == selector)
        {
            Some(shape) => shape.count += demand.count,
            None => shapes.push(ShapeDemand {
                resources: demand.shape.clone(),
                selector,
                count: demand.count,
            }),
        }
    }
    let groups = status
        .placement_groups
        .iter()
        .filter(|demand| !demand.infeasible)
        .filter_map(|demand| {
            let group = demand.group.as_ref()?;
            Some(GroupDemand {
                name: demand.constraint.clone(),
                bundles: group.bundles.clone(),
                strategy: group.strategy,
                count: 1,
            })
        })
        .collect();
    Demand { shapes, groups }
}

/// The selector of work a launch could serve; `None` for work in a
/// placement group or held to one node.
fn launchable_selector(strategy: &SchedulingStrategy, selector: &LabelSelector) -> Option<LabelSelector> {
    match strategy {
        SchedulingStrategy::PlacementGroup { .. } | SchedulingStrategy::NodeAffinity { soft: false, .. } => None,
        _ => Some(selector.clone()),
    }
}
