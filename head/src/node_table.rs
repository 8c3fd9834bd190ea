//! The head's table of node incarnations: registration, heartbeats and
//! failure detection, with the alive nodes' resources kept for placement.
//! Time is passed in, so the logic is deterministic. Each node's latest
//! incarnation is written to the head's state store as it changes, and a
//! restarted head gives the recovered alive ones a heartbeat timeout to
//! show up again.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use raylet_proto::{JobId, Labels, NodeId, ResourceSet, Scheduling};
use tokio::sync::watch;

use prost::Message;
use raylet_cluster_status::{ClusterStatus, NodeState, NodeStats, NodeStatus, ResourceDemand, unix_ms};
use raylet_placement::{Choice, ClusterResources, LaunchableNodes, Placer, Request};
use raylet_proto::v1;

use super::state_store::{Committed, StateError, StateStore, Table};

/// How many dead incarnations are kept for `raylet status`.
const MAX_DEAD_RECORDS: usize = 1000;

/// What a node manager says about itself when it registers.
#[derive(Clone, Debug)]
pub struct Registration {
    pub node_id: NodeId,
    pub address: String,
    pub hostname: String,
    pub is_head_node: bool,
    pub total: ResourceSet,
    pub labels: Labels,
    /// Where its `/metrics` is served, if anywhere.
    pub metrics_address: Option<String>,
}

/// What a node manager reports in each heartbeat.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub node_id: NodeId,
    pub incarnation: u64,
    pub total: ResourceSet,
    pub available: ResourceSet,
    pub stats: NodeStats,
    pub demands: Vec<ResourceDemand>,
}

/// How the head answered a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    Accepted,
    /// The incarnation is dead or superseded; the node must register anew.
    MustReregister,
}

/// An alive node's address and resources, for spillback decisions.
#[derive(Clone, Debug)]
pub struct NodeResourcesView {
    pub node_id: NodeId,
    pub address: String,
    pub total: ResourceSet,
    pub available: ResourceSet,
    pub labels: Labels,
}

struct Entry {
    status: NodeStatus,
    last_heartbeat: Instant,
}

/// All incarnations of all nodes. At most one incarnation of a node is alive.
pub struct NodeTable {
    heartbeat_timeout: Duration,
    entries: Vec<Entry>,
    latest_incarnation: HashMap<NodeId, u64>,
    alive: ClusterResources,
    store: StateStore,
    /// Counts deaths: watchers wake on each and read [`NodeTable::latest_deaths`].
    deaths: watch::Sender<u64>,
    /// The node types an autoscaler may launch: work that fits one of them
    /// waits instead of failing as infeasible.
    launchable: LaunchableNodes,
    /// Jobs' drivers that wait for a node with room, with what they need:
    /// demand for the autoscaler, as `raylet status` lists it.
    waiting_drivers: BTreeMap<JobId, ResourceSet>,
}

impl NodeTable {
    pub fn new(heartbeat_timeout: Duration) -> Self {
        NodeTable {
            heartbeat_timeout,
            entries: Vec::new(),
            latest_incarnation: HashMap::new(),
            alive: ClusterResources::new(),
            store: StateStore::in_memory_only(),
            deaths: watch::channel(0).0,
            launchable: LaunchableNodes::default(),
            waiting_drivers: BTreeMap::new(),
        }
    }

    pub fn set_launchable(&mut self, launchable: LaunchableNodes) {
        self.launchable = launchable;
    }

    pub fn launchable(&self) -> &LaunchableNodes {
        &self.launchable
    }

    /// Records that `job`'s driver waits for room for `demand`, or, with
    /// `None`, that it no longer waits.
    pub fn set_waiting_driver(&mut self, job: JobId, demand: Option<&ResourceSet>) {
        match demand {
            Some(demand) => self.waiting_drivers.insert(job, demand.clone()),
            None => self.waiting_drivers.remove(&job),
        };
    }

    /// The table as `store` last saw it: the nodes that were alive count as
    /// alive, heard from `now`, and must heartbeat within the timeout.
    /// Changes from here on are written to `store`.
    pub fn recover(heartbeat_timeout: Duration, store: StateStore, now: Instant) -> Result<Self, StateError> {
        let mut table = NodeTable::new(heartbeat_timeout);
        for (_, bytes) in store.load(Table::Nodes)? {
            let record = v1::NodeRecord::decode(bytes.as_slice()).map_err(StateError::corrupt("a node record"))?;
            let status = NodeStatus::from_proto(record).map_err(StateError::corrupt("a node record"))?;
            table.latest_incarnation.insert(status.node_id, status.incarnation);
            if status.state == NodeState::Alive && status.draining.is_none() {
                let index = table
                    .alive
                    .upsert(status.node_id, &status.address, &status.labels, &status.total);
                table.alive.set_available(index, &status.available);
            }
            table.entries.push(Entry {
                status,
                last_heartbeat: now,
            });
        }
        table.store = store;
        Ok(table)
    }

    /// Resolves once every change so far is on disk, or with the error
    /// that kept one off it.
    pub fn flushed(&self) -> Committed {
        self.store.flush()
    }

    /// How long a node may be silent before it is marked dead.
    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_timeout
    }

    /// Adds a new incarnation of the node. A still-alive older incarnation of
    /// the same node is marked dead: the two are never merged.
    pub fn register(&mut self, registration: Registration, now: Instant) -> u64 {
        let node_id = registration.node_id;
        let incarnation = self.latest_incarnation.get(&node_id).map_or(1, |i| i + 1);
        let reason = format!("superseded by incarnation {incarnation}");
        self.mark_dead_where(|s| s.node_id == node_id && s.state == NodeState::Alive, &reason);
        self.latest_incarnation.insert(node_id, incarnation);
        self.alive.upsert(
            node_id,
            &registration.address,
            &registration.labels,
            &registration.total,
        );
        let wall = unix_ms(SystemTime::now());
        let status = NodeStatus {
            node_id,
            incarnation,
            address: registration.address,
            hostname: registration.hostname,
            is_head_node: registration.is_head_node,
            state: NodeState::Alive,
            available: registration.total.clone(),
            total: registration.total,
            labels: registration.labels,
            metrics_address: registration.metrics_address,
            stats: NodeStats::default(),
            demands: Vec::new(),
            registered_unix_ms: wall,
            last_heartbeat_unix_ms: wall,
            died_unix_ms: None,
            death_reason: None,
            draining: None,
        };
        tracing::info!(%node_id, incarnation, address = %status.address, "node registered");
        self.save(&status);
        self.entries.push(Entry {
            status,
            last_heartbeat: now,
        });
        self.forget_oldest_dead();
        incarnation
    }

    /// Records a heartbeat of an alive incarnation.
    pub fn heartbeat(&mut self, heartbeat: Heartbeat, now: Instant) -> HeartbeatOutcome {
        let Some(entry) = alive_entry(&mut self.entries, heartbeat.node_id, heartbeat.incarnation) else {
            return HeartbeatOutcome::MustReregister;
        };
        entry.last_heartbeat = now;
        entry.status.last_heartbeat_unix_ms = unix_ms(SystemTime::now());
        entry.status.total = heartbeat.total;
        entry.status.available = heartbeat.available;
        entry.status.stats = heartbeat.stats;
        entry.status.demands = heartbeat.demands;
        let status = &entry.status;
        if status.draining.is_none() {
            let index = self
                .alive
                .upsert(status.node_id, &status.address, &status.labels, &status.total);
            self.alive.set_available(index, &status.available);
        }
        HeartbeatOutcome::Accepted
    }

    /// Takes the node's alive incarnation out of placement: nothing is
    /// placed or spilled there from now on. False when it is not alive.
    pub fn drain(&mut self, node_id: NodeId, reason: &str) -> bool {
        let Some(entry) = self
            .entries
            .iter_mut()
            .find(|e| e.status.node_id == node_id && e.status.state == NodeState::Alive)
        else {
            return false;
        };
        if entry.status.draining.is_none() {
            tracing::info!(%node_id, reason, "draining node");
        }
        entry.status.draining = Some(reason.to_string());
        self.alive.remove(node_id);
        let status = entry.status.clone();
        self.save(&status);
        true
    }

    /// Marks an incarnation dead because it said it is leaving.
    pub fn unregister(&mut self, node_id: NodeId, incarnation: u64, reason: &str) {
        let reason = format!("left the cluster: {reason}");
        self.mark_dead_where(
            |s| s.node_id == node_id && s.incarnation == incarnation && s.state == NodeState::Alive,
            &reason,
        );
    }

    /// Marks dead every alive node whose last heartbeat is older than the
    /// timeout, and returns how many it marked.
    pub fn detect_failures(&mut self, now: Instant) -> usize {
        let timeout = self.heartbeat_timeout;
        let mut marked = 0;
        for entry in &mut self.entries {
            let silence = now.saturating_duration_since(entry.last_heartbeat);
            if entry.status.state == NodeState::Alive && silence > timeout {
                let reason = format!(
                    "no heartbeat for {:.1}s (timeout {:.1}s)",
                    silence.as_secs_f64(),
                    timeout.as_secs_f64()
                );
                mark_dead(&mut entry.status, &reason);
                self.alive.remove(entry.status.node_id);
                save_latest(&self.store, &self.latest_incarnation, &entry.status);
                marked += 1;
            }
        }
        if marked > 0 {
            self.deaths.send_modify(|deaths| *deaths += 1);
        }
        marked
    }

    /// Wakes on every death from now on.
    pub fn watch_deaths(&self) -> watch::Receiver<u64> {
        self.deaths.subscribe()
    }

    /// The dead incarnations that are their node's latest, oldest first. An
    /// older one is left out: its node registered again since, fencing
    /// what the old one ran, and its address now belongs to the new one.
    pub fn latest_deaths(&self) -> Vec<NodeStatus> {
        let latest = |status: &NodeStatus| self.latest_incarnation.get(&status.node_id) == Some(&status.incarnation);
        let dead = self
            .entries
            .iter()
            .filter(|e| e.status.state == NodeState::Dead && latest(&e.status));
        dead.map(|e| e.status.clone()).collect()
    }

    /// Why this incarnation of the node is dead, or `None` while it is alive.
    pub fn death_of(&self, node_id: NodeId, incarnation: u64) -> Option<String> {
        let entry = self
            .entries
            .iter()
            .find(|e| e.status.node_id == node_id && e.status.incarnation == incarnation);
        match entry {
            Some(entry) if entry.status.state == NodeState::Alive => None,
            Some(entry) => Some(entry.status.death_reason.clone().unwrap_or_default()),
            None => Some("it is no longer known".into()),
        }
    }

    /// The alive nodes' resources as placement reads them; work placed
    /// here counts until the node's next heartbeat.
    pub fn placement_view(&mut self) -> &mut ClusterResources {
        &mut self.alive
    }

    /// Where `placer` puts work that needs `resources`, with no node
    /// preferred. A node chosen to run it now or later counts the demand
    /// until its next heartbeat.
    pub fn choose(&mut self, placer: &mut Placer, resources: &ResourceSet, scheduling: &Scheduling) -> Choice {
        let cluster = &mut self.alive;
        let demand = cluster.demand(resources);
        let request = Request {
            demand: &demand,
            scheduling,
            preferred: None,
        };
        let choice = placer.choose(cluster, &request);
        let choice = self
            .launchable
            .await_launch(choice, resources, &scheduling.label_selector);
        if let Choice::Run(index) | Choice::Queue(index) = choice {
            cluster.subtract(index, &demand);
        }
        choice
    }

    /// The resources of every alive node not being drained.
    pub fn alive_resources(&self) -> Vec<NodeResourcesView> {
        self.entries
            .iter()
            .filter(|e| e.status.state == NodeState::Alive && e.status.draining.is_none())
            .map(|e| NodeResourcesView {
                node_id: e.status.node_id,
                address: e.status.address.clone(),
                total: e.status.total.clone(),
                available: e.status.available.clone(),
                labels: e.status.labels.clone(),
            })
            .collect()
    }

    /// Every incarnation, alive ones first, each group oldest first.
    pub fn snapshot(&self) -> ClusterStatus {
        let mut nodes: Vec<NodeStatus> = self.entries.iter().map(|e| e.status.clone()).collect();
        nodes.sort_by_key(|n| (n.state != NodeState::Alive, n.registered_unix_ms));
        let waiting_drivers = self.waiting_drivers.iter().map(|(job, demand)| ResourceDemand {
            shape: demand.clone(),
            constraint: format!("driver of job {job}"),
            count: 1,
            infeasible: false,
            reason: String::new(),
            scheduling: Scheduling::default(),
            group: None,
        });
        ClusterStatus {
            now_unix_ms: unix_ms(SystemTime::now()),
            nodes,
            placement_groups: Vec::new(),
            waiting_drivers: waiting_drivers.collect(),
        }
    }

    fn mark_dead_where(&mut self, matches: impl Fn(&NodeStatus) -> bool, reason: &str) {
        let mut marked = false;
        for entry in &mut self.entries {
            if matches(&entry.status) {
                mark_dead(&mut entry.status, reason);
                self.alive.remove(entry.status.node_id);
                save_latest(&self.store, &self.latest_incarnation, &entry.status);
                marked = true;
            }
        }
        if marked {
            self.deaths.send_modify(|deaths| *deaths += 1);
        }
    }

    fn save(&self, status: &NodeStatus) {
        save_latest(&self.store, &self.latest_incarnation, status);
    }

    fn forget_oldest_dead(&mut self) {
        let dead = self
            .entries
            .iter()
            .filter(|e| e.status.state == NodeState::Dead)
            .count();
        if dead > MAX_DEAD_RECORDS {
            let oldest = self.entries.iter().position(|e| e.status.state == NodeState::Dead);
            if let Some(index) = oldest {
                self.entries.remove(index);
            }
        }
    }
}

/// Writes the status when it is of the node's latest incarnation.
fn save_latest(store: &StateStore, latest: &HashMap<NodeId, u64>, status: &NodeStatus) {
    if latest.get(&status.node_id) == Some(&status.incarnation) {
        store.put(Table::Nodes, status.node_id.as_bytes(), &status.to_proto());
    }
}

fn alive_entry(entries: &mut [Entry], node_id: NodeId, incarnation: u64) -> Option<&mut Entry> {
    entries.iter_mut().find(|e| {
        e.status.node_id == node_id && e.status.incarnation == incarnation && e.status.state == NodeState::Alive
    })
}

fn mark_dead(status: &mut NodeStatus, reason: &str) {
    status.state = NodeState::Dead;
    status.died_unix_ms = Some(unix_ms(SystemTime::now()));
    status.death_reason = Some(reason.to_string());
    if reason.starts_with("left the cluster") {
        tracing::info!(node_id = %status.node_id, incarnation = status.incarnation, reason, "node left");
        return;
    }
    tracing::warn!(
        node_id = %status.node_id,
        incarnation = status.incarnation,
        address = %status.address,
        reason,
        "node marked dead"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use raylet_proto::Amount;
    use raylet_proto::resources::CPU;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn registration(node_id: NodeId) -> Registration {
        Registration {
            node_id,
            address: "127.0.0.1:1".into(),
            hostname: "host".into(),
            is_head_node: false,
            total: ResourceSet::new().with(CPU, Amount::whole(4)),
            labels: Labels::new(),
            metrics_address: None,
        }
    }

    fn heartbeat(node_id: NodeId, incarnation: u64) -> Heartbeat {
        Heartbeat {
            node_id,
            incarnation,
            total: ResourceSet::new().with(CPU, Amount::whole(4)),
            available: ResourceSet::new().with(CPU, Amount::whole(3)),
            stats: NodeStats::default(),
            demands: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_recovered_table_accepts_the_incarnations_it_knew_and_keeps_the_dead_dead() {
        let dir = tempfile::tempdir().unwrap();
        let (alive, left) = (NodeId::random(), NodeId::random());
        {
            let store = StateStore::open(dir.path()).unwrap();
            let mut table = NodeTable::recover(TIMEOUT, store.clone(), Instant::now()).unwrap();
            table.register(registration(alive), Instant::now());
            table.register(registration(alive), Instant::now());
            let incarnation = table.register(registration(left), Instant::now());
            table.unregister(left, incarnation, "done");
            store.flush().await.unwrap();
        }
        let store = crate::state_store::tests::reopen(dir.path()).await;
        let now = Instant::now();
        let mut table = NodeTable::recover(TIMEOUT, store, now).unwrap();
        assert_eq!(table.heartbeat(heartbeat(alive, 2), now), HeartbeatOutcome::Accepted);
        assert_eq!(
            table.heartbeat(heartbeat(left, 1), now),
            HeartbeatOutcome::MustReregister
        );
        assert_eq!(table.alive_resources().len(), 1);
        assert_eq!(table.register(registration(left), now), 2, "incarnations go on");
        assert_eq!(
            table.detect_failures(now + TIMEOUT * 2),
            2,
            "silent recovered nodes die"
        );
    }

    #[test]
    fn a_drained_node_stays_out_of_placement_while_it_heartbeats() {
        let mut table = NodeTable::new(TIMEOUT);
        let (kept, drained) = (NodeId::random(), NodeId::random());
        let now = Instant::now();
        table.register(registration(kept), now);
        table.register(registration(drained), now);
        assert!(table.drain(drained, "idle for 60s"));
        assert_eq!(table.heartbeat(heartbeat(drained, 1), now), HeartbeatOutcome::Accepted);
        let placed: Vec<NodeId> = table.alive_resources().iter().map(|n| n.node_id).collect();
        assert_eq!(placed, [kept]);
        assert_eq!(table.placement_view().len(), 1);
        let status = table.snapshot();
        let drained_status = status.nodes.iter().find(|n| n.node_id == drained).unwrap();
        assert_eq!(drained_status.draining.as_deref(), Some("idle for 60s"));
        assert_eq!(drained_status.state, NodeState::Alive);
        assert!(!table.drain(NodeId::random(), "unknown"));
    }

    #[test]
    fn heartbeats_keep_a_node_alive_and_update_its_resources() {
        let mut table = NodeTable::new(TIMEOUT);
        let start = Instant::now();
        let node = NodeId::random();
        assert_eq!(table.register(registration(node), start), 1);
        for second in 1..=20 {
            let now = start + Duration::from_secs(second);
            assert_eq!(table.heartbeat(heartbeat(node, 1), now), HeartbeatOutcome::Accepted);
            assert_eq!(table.detect_failures(now), 0);
        }
        let status = table.snapshot();
        assert_eq!(status.alive().count(), 1);
        assert_eq!(status.available().get(CPU), Amount::whole(3));
    }

    #[test]
    fn a_silent_node_is_marked_dead_only_after_the_timeout() {
        let mut table = NodeTable::new(TIMEOUT);
        let start = Instant::now();
        let node = NodeId::random();
        table.register(registration(node), start);
        assert_eq!(table.detect_failures(start + TIMEOUT), 0);
        assert_eq!(table.detect_failures(start + TIMEOUT + Duration::from_millis(1)), 1);
        let status = table.snapshot();
        assert_eq!(status.dead().count(), 1);
        assert!(status.nodes[0].death_reason.as_ref().unwrap().contains("no heartbeat"));
        assert!(status.total().is_empty(), "dead nodes add no resources");
    }

    #[test]
    fn a_node_that_comes_back_gets_a_new_incarnation_and_its_old_self_stays_dead() {
        let mut table = NodeTable::new(TIMEOUT);
        let start = Instant::now();
        let node = NodeId::random();
        table.register(registration(node), start);
        let later = start + TIMEOUT * 2;
        table.detect_failures(later);
        assert_eq!(
            table.heartbeat(heartbeat(node, 1), later),
            HeartbeatOutcome::MustReregister
        );
        assert_eq!(table.register(registration(node), later), 2);
        assert_eq!(table.heartbeat(heartbeat(node, 2), later), HeartbeatOutcome::Accepted);
        let status = table.snapshot();
        let incarnations: Vec<_> = status.nodes.iter().map(|n| (n.incarnation, n.state)).collect();
        assert_eq!(incarnations, [(2, NodeState::Alive), (1, NodeState::Dead)]);
    }

    #[test]
    fn registering_again_while_alive_supersedes_the_old_incarnation() {
        let mut table = NodeTable::new(TIMEOUT);
        let now = Instant::now();
        let node = NodeId::random();
        table.register(registration(node), now);
        table.register(registration(node), now);
        assert_eq!(
            table.heartbeat(heartbeat(node, 1), now),
            HeartbeatOutcome::MustReregister
        );
        let status = table.snapshot();
        assert_eq!(status.alive().count(), 1);
        let dead = status.dead().next().unwrap();
        assert_eq!(dead.death_reason.as_deref(), Some("superseded by incarnation 2"));
    }

    #[test]
    fn deaths_are_watched_and_listed_while_the_dead_incarnation_is_its_nodes_latest() {
        let mut table = NodeTable::new(TIMEOUT);
        let (gone, back) = (NodeId::random(), NodeId::random());
        let start = Instant::now();
        table.register(registration(gone), start);
        table.register(registration(back), start);
        let deaths = table.watch_deaths();
        assert_eq!(table.detect_failures(start + TIMEOUT * 2), 2);
        assert!(deaths.has_changed().unwrap(), "watchers wake on a death");
        table.register(registration(back), start + TIMEOUT * 2);
        let latest: Vec<(NodeId, u64)> = table
            .latest_deaths()
            .iter()
            .map(|n| (n.node_id, n.incarnation))
            .collect();
        assert_eq!(
            latest,
            [(gone, 1)],
            "incarnation 1 of the node that came back is left out"
        );
        assert_eq!(table.death_of(back, 2), None);
        assert!(table.death_of(back, 1).unwrap().contains("no heartbeat"));
    }

    #[test]
    fn unregistering_marks_the_node_dead_with_its_reason() {
        let mut table = NodeTable::new(TIMEOUT);
        let node = NodeId::random();
        table.register(registration(node), Instant::now());
        table.unregister(node, 1, "stopped by raylet stop");
        let status = table.snapshot();
        assert_eq!(status.alive().count(), 0);
        assert!(status.nodes[0].death_reason.as_ref().unwrap().contains("raylet stop"));
    }

    #[test]
    fn heartbeats_from_unknown_nodes_must_reregister() {
        let mut table = NodeTable::new(TIMEOUT);
        let outcome = table.heartbeat(heartbeat(NodeId::random(), 1), Instant::now());
        assert_eq!(outcome, HeartbeatOutcome::MustReregister);
    }
}
