//! Placing placement groups: plan every bundle against the alive nodes,
//! reserve each on its node, commit only once all are reserved (else
//! release the ones that were), place again what a dead node held, and
//! release every bundle when the group is removed. Waiting groups are
//! planned one after another but reserved all at once; a reservation on a
//! node waits for the releases in flight there. The node managers are
//! reached through [`BundleNodes`], so a test can put virtual nodes there.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::join_all;
use raylet_cluster_status::{GroupShape, ResourceDemand};
use raylet_placement::{BundlePlan, plan_bundles};
use raylet_proto::{PlacementGroupId, ResourceSet, Scheduling};

use crate::state_store::{StateError, StateStore};

use super::error::{BundleCallError, PlacementGroupError};
use super::table::{BundleLocation, GroupRecord, GroupSpec, GroupState, GroupTable};
use crate::NodeTable;

type Result<T, E = PlacementGroupError> = std::result::Result<T, E>;

/// The node managers that hold bundles, as the group manager calls them.
pub trait BundleNodes: Send + Sync + 'static {
    /// Sets aside `bundles` on the node at `address`, all or none; with
    /// `commit`, also offers them at once (the node holds the whole group).
    fn reserve(
        &self,
        address: &str,
        group: PlacementGroupId,
        bundles: Vec<(u32, ResourceSet)>,
        commit: bool,
    ) -> impl Future<Output = Result<(), BundleCallError>> + Send;

    /// Offers reserved bundles to work in the group.
    fn commit(
        &self,
        address: &str,
        group: PlacementGroupId,
        indexes: Vec<u32>,
    ) -> impl Future<Output = Result<(), BundleCallError>> + Send;

    /// Frees the group's bundles with these indexes on the node (all of
    /// them when `indexes` is empty) and ends the work in them.
    fn release(
        &self,
        address: &str,
        group: PlacementGroupId,
        indexes: Vec<u32>,
    ) -> impl Future<Output = Result<(), BundleCallError>> + Send;
}

/// The head's placement groups and how they are placed.
pub struct GroupManager<N> {
    table: Arc<Mutex<GroupTable>>,
    nodes: Arc<Mutex<NodeTable>>,
    bundle_nodes: Arc<N>,
    /// One placement pass at a time: a group is never placed twice at once.
    placing: tokio::sync::Mutex<()>,
    /// Per node address: held shared by the releases in flight there, and
    /// taken alone before a reservation there, which so never overtakes a
    /// release of resources it may need.
    releases: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
}

/// New bundles of one group, by the address of their node.
type NodeBundles = BTreeMap<String, Vec<(u32, ResourceSet)>>;

/// Why a planned group's bundles were not placed; the group waits and is
/// planned again.
#[derive(Debug, thiserror::Error)]
enum NotPlaced {
    #[error("node {node} refused: {error}")]
    Refused { node: String, error: BundleCallError },
    #[error("node {node} failed to commit: {error}")]
    CommitFailed { node: String, error: BundleCallError },
}

/// What planning a group decided.
enum Planned {
    /// Nodes for the bundles that had none.
    New(Vec<(usize, BundleLocation)>),
    Wait(String),
    Infeasible(String),
}

fn bundles_by_node(new: &[(usize, BundleLocation)], spec: &GroupSpec) -> NodeBundles {
    let mut by_node = NodeBundles::new();
    for (index, location) in new {
        by_node
            .entry(location.address.clone())
            .or_default()
            .push((*index as u32, spec.bundles[*index].clone()));
    }
    by_node
}

impl<N: BundleNodes> GroupManager<N> {
    /// A manager whose groups are kept in memory only.
    pub fn new(nodes: Arc<Mutex<NodeTable>>, bundle_nodes: N) -> Self {
        Self::with_table(GroupTable::default(), nodes, bundle_nodes)
    }

    /// A manager of the groups `store` holds, which keeps every change there.
    pub fn recover(nodes: Arc<Mutex<NodeTable>>, bundle_nodes: N, store: StateStore) -> Result<Self, StateError> {
        Ok(Self::with_table(GroupTable::recover(store)?, nodes, bundle_nodes))
    }

    fn with_table(table: GroupTable, nodes: Arc<Mutex<NodeTable>>, bundle_nodes: N) -> Self {
        GroupManager {
            table: Arc::new(Mutex::new(table)),
            nodes,
            bundle_nodes: Arc::new(bundle_nodes),
            placing: tokio::sync::Mutex::new(()),
            releases: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> MutexGuard<'_, GroupTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn nodes(&self) -> MutexGuard<'_, NodeTable> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a group and tries to place it (and any older waiting
    /// group) at once; returns its record after that attempt, once that is
    /// on disk. A group created again (its caller lost the answer when the
    /// head restarted) is answered with its record.
    pub async fn create(&self, spec: GroupSpec) -> Result<GroupRecord> {
        let id = spec.id;
        if self.table().record(id).is_err() {
            self.table().create(spec)?;
            self.place_waiting().await;
        }
        let flushed = self.table().flushed();
        flushed.await?;
        self.table().record(id)
    }

    /// Frees what a head that went down while it placed or removed groups
    /// may have left reserved: the bundles of removed groups that were not
    /// freed yet, and those the recovered table has no node for, on every
    /// alive node. Runs before the restarted head places anything.
    pub async fn release_unrecorded_reservations(&self) {
        self.release_removed().await;
        let unplaced: Vec<(PlacementGroupId, Vec<u32>)> = {
            let table = self.table();
            let records = table.unplaced().into_iter().filter_map(|id| table.record(id).ok());
            records
                .map(|record| {
                    let indexes = (0..record.locations.len() as u32)
                        .filter(|&i| record.locations[i as usize].is_none())
                        .collect();
                    (record.spec.id, indexes)
                })
                .collect()
        };
        if unplaced.is_empty() {
            return;
        }
        let addresses: Vec<String> = self.nodes().alive_resources().into_iter().map(|n| n.address).collect();
        let releases = unplaced.iter().flat_map(|(id, indexes)| {
            addresses
                .iter()
                .map(|address| self.bundle_nodes.release(address, *id, indexes.clone()))
        });
        join_all(releases).await;
    }

    pub fn record(&self, id: PlacementGroupId) -> Result<GroupRecord> {
        self.table().record(id)
    }

    pub fn records(&self) -> Vec<GroupRecord> {
        self.table().records()
    }

    /// The groups that wait for room or can never be placed, as demands.
    pub fn demands(&self) -> Vec<ResourceDemand> {
        let table = self.table();
        let waiting = table.unplaced().into_iter().filter_map(|id| table.record(id).ok());
        waiting
            .map(|record| {
                let unplaced: Vec<ResourceSet> = (record.spec.bundles.iter().zip(&record.locations))
                    .filter(|(_, location)| location.is_none())
                    .map(|(bundle, _)| bundle.clone())
                    .collect();
                let mut shape = ResourceSet::new();
                unplaced.iter().for_each(|bundle| shape.add(bundle));
                ResourceDemand {
                    shape,
                    constraint: format!(
                        "placement group {} ({}, {} bundles)",
                        record.spec.id.short(),
                        record.spec.strategy,
                        record.spec.bundles.len()
                    ),
                    count: 1,
                    infeasible: record.state == GroupState::Infeasible,
                    reason: record.reason.clone(),
                    scheduling: Scheduling::default(),
                    group: Some(GroupShape {
                        bundles: unplaced,
                        strategy: record.spec.strategy,
                    }),
                }
            })
            .collect()
    }

    /// The group's record once it is created, infeasible or removed, or
    /// when `timeout` passes.
    pub async fn wait(&self, id: PlacementGroupId, timeout: Duration) -> Result<GroupRecord> {
        let mut watcher = self.table().watch(id)?;
        let settled = watcher.wait_for(|record| record.state.is_settled());
        let _ = tokio::time::timeout(timeout, settled).await;
        let record = watcher.borrow().clone();
        Ok(record)
    }

    /// The group once it is created or removed: what work in it waits for.
    pub async fn wait_placed(&self, id: PlacementGroupId) -> Result<GroupRecord> {
        let mut watcher = self.table().watch(id)?;
        let placed = watcher
            .wait_for(|record| matches!(record.state, GroupState::Created | GroupState::Removed))
            .await
            .map(|record| record.clone());
        placed.or_else(|_| self.record(id))
    }

    /// Marks the group removed and returns its record with the work that
    /// frees its bundles on every node that holds them (which ends what
    /// runs in them); run that work, or spawn it. The group keeps its
    /// bundles' nodes until that work is done, so that a head restarted
    /// before then frees them.
    pub async fn remove(
        &self,
        id: PlacementGroupId,
    ) -> Result<(GroupRecord, impl Future<Output = ()> + Send + 'static)> {
        let record = self.table().record(id)?;
        let locations = self.table().remove(id, "removed by its owner")?;
        let placed = record.spec.bundles.iter().zip(&locations);
        self.give_back_to_view(placed.filter_map(|(bundle, location)| Some((bundle, location.as_ref()?))));
        let addresses: BTreeSet<String> = locations.into_iter().flatten().map(|l| l.address).collect();
        let release = self.release_on(id, addresses).await;
        let table = self.table.clone();
        let release = async move {
            release.await;
            table.lock().unwrap_or_else(|p| p.into_inner()).released(id);
        };
        let flushed = self.table().flushed();
        flushed.await?;
        Ok((self.table().record(id)?, release))
    }

    /// Frees the bundles of the removed groups that still hold some.
    async fn release_removed(&self) {
        let removed: Vec<(PlacementGroupId, BTreeSet<String>)> = {
            let table = self.table();
            let records = table.records().into_iter();
            records
                .filter(|record| record.state == GroupState::Removed)
                .map(|record| {
                    let addresses = record.locations.into_iter().flatten().map(|l| l.address).collect();
                    (record.spec.id, addresses)
                })
                .filter(|(_, addresses): &(_, BTreeSet<String>)| !addresses.is_empty())
                .collect()
        };
        let releases = removed.into_iter().map(|(id, addresses)| async move {
            self.release_on(id, addresses).await.await;
            self.table().released(id);
        });
        join_all(releases).await;
    }

    /// The release of the group on `addresses`, already counted as in
    /// flight there.
    async fn release_on(
        &self,
        id: PlacementGroupId,
        addresses: BTreeSet<String>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut in_flight = Vec::with_capacity(addresses.len());
        for address in &addresses {
            in_flight.push(self.release_lock(address).read_owned().await);
        }
        let nodes = self.bundle_nodes.clone();
        async move {
            let released = join_all(addresses.iter().map(|address| nodes.release(address, id, Vec::new()))).await;
            for (address, result) in addresses.iter().zip(released) {
                if let Err(error) = result {
                    tracing::debug!(%id, %address, %error, "releasing bundles failed; the node may be gone");
                }
            }
            drop(in_flight);
        }
    }

    fn release_lock(&self, address: &str) -> Arc<tokio::sync::RwLock<()>> {
        let mut releases = self.releases.lock().unwrap_or_else(|p| p.into_inner());
        releases.entry(address.to_string()).or_default().clone()
    }

    /// One pass: bundles on nodes that died need a node again, then every
    /// waiting group, oldest first, is placed if it can be.
    pub async fn reconcile_and_place(&self) {
        self.forget_dead_nodes();
        self.place_waiting().await;
    }

    /// Plans every waiting group, oldest first, then reserves the planned
    /// ones all at once.
    async fn place_waiting(&self) {
        let _placing = self.placing.lock().await;
        let waiting = self.table().unplaced();
        let mut planned = Vec::new();
        for id in waiting {
            let record = self.table().record(id);
            let Ok(record) = record else {
                continue;
            };
            match self.plan(&record) {
                Planned::New(new) => planned.push((record, new)),
                Planned::Wait(reason) => self.still_waiting(id, record.state, reason),
                Planned::Infeasible(reason) => self.infeasible(&record, reason),
            }
        }
        let attempts = planned
            .iter()
            .map(|(record, new)| self.reserve_and_commit(record.spec.id, bundles_by_node(new, &record.spec)));
        let results = join_all(attempts).await;
        for ((record, new), result) in planned.into_iter().zip(results) {
            match result {
                Ok(()) => self.placed(&record, new).await,
                Err(not_placed) => {
                    self.give_back_new(&record, &new);
                    self.still_waiting(record.spec.id, record.state, not_placed.to_string());
                }
            }
        }
    }

    /// Records the new bundles' nodes, unless the group was removed while
    /// they were reserved: then they are released again.
    async fn placed(&self, record: &GroupRecord, new: Vec<(usize, BundleLocation)>) {
        let id = record.spec.id;
        let removed = {
            let mut table = self.table();
            let removed = table.record(id).is_ok_and(|now| now.state == GroupState::Removed);
            if !removed {
                table.update(id, |record| {
                    for (index, location) in &new {
                        record.locations[*index] = Some(location.clone());
                    }
                    record.state = GroupState::Created;
                    record.reason.clear();
                });
            }
            removed
        };
        if removed {
            self.give_back_new(record, &new);
            let addresses = new.into_iter().map(|(_, location)| location.address).collect();
            self.release_on(id, addresses).await.await;
        }
    }

    fn infeasible(&self, record: &GroupRecord, reason: String) {
        let state = match record.state {
            GroupState::Rescheduling => GroupState::Rescheduling,
            _ => GroupState::Infeasible,
        };
        self.table().update(record.spec.id, |record| {
            record.state = state;
            record.reason = format!("infeasible: {reason}");
        });
    }

    /// Marks the bundles on nodes no longer alive as unplaced.
    fn forget_dead_nodes(&self) {
        let created = self.table().created();
        let with_losses: Vec<(GroupRecord, Vec<usize>)> = {
            let mut nodes = self.nodes();
            let view = nodes.placement_view();
            let gone =
                |location: &Option<BundleLocation>| location.as_ref().is_some_and(|l| view.index(l.node_id).is_none());
            created
                .into_iter()
                .filter_map(|record| {
                    let lost: Vec<usize> = (0..record.locations.len())
                        .filter(|&i| gone(&record.locations[i]))
                        .collect();
                    (!lost.is_empty()).then_some((record, lost))
                })
                .collect()
        };
        for (record, lost) in with_losses {
            let dead: Vec<String> = lost
                .iter()
                .filter_map(|&i| record.locations[i].as_ref().map(|l| l.node_id.short()))
                .collect();
            tracing::warn!(group = %record.spec.id, bundles = ?lost, "placement group bundles lost with their node; placing them again");
            self.table().update(record.spec.id, |record| {
                lost.iter().for_each(|&i| record.locations[i] = None);
                record.state = GroupState::Rescheduling;
                record.reason = format!("bundles {lost:?} were lost with node {}", dead.join(", "));
            });
        }
    }

    /// Plans the group against the head's view; the bundles it places anew
    /// count against their nodes from now on.
    fn plan(&self, record: &GroupRecord) -> Planned {
        let mut nodes = self.nodes();
        let view = nodes.placement_view();
        let demands: Vec<_> = record.spec.bundles.iter().map(|bundle| view.demand(bundle)).collect();
        let placed: Vec<_> = record
            .locations
            .iter()
            .map(|location| location.as_ref().and_then(|l| view.index(l.node_id)))
            .collect();
        match plan_bundles(view, &demands, &placed, record.spec.strategy) {
            BundlePlan::Placed(assigned) => {
                let mut new = Vec::new();
                for (bundle, &node) in assigned
                    .iter()
                    .enumerate()
                    .filter(|(bundle, _)| placed[*bundle].is_none())
                {
                    view.subtract(node, &demands[bundle]);
                    let location = BundleLocation {
                        node_id: view.node(node).node_id,
                        address: view.node(node).address.clone(),
                    };
                    new.push((bundle, location));
                }
                Planned::New(new)
            }
            BundlePlan::Wait(reason) => Planned::Wait(reason),
            BundlePlan::Infeasible(reason) => {
                let unplaced: Vec<ResourceSet> = (record.spec.bundles.iter().zip(&placed))
                    .filter(|(_, node)| node.is_none())
                    .map(|(bundle, _)| bundle.clone())
                    .collect();
                match nodes.launchable().fits_group(&unplaced, record.spec.strategy) {
                    true => Planned::Wait(format!(
                        "waiting for the autoscaler to launch nodes for its bundles (no alive node fits: {reason})"
                    )),
                    false => Planned::Infeasible(reason),
                }
            }
        }
    }

    fn still_waiting(&self, id: PlacementGroupId, state: GroupState, reason: String) {
        let state = match state {
            GroupState::Rescheduling => GroupState::Rescheduling,
            _ => GroupState::Pending,
        };
        self.table().update(id, |record| {
            record.state = state;
            record.reason = reason;
        });
    }

    /// Reserves every new bundle, then commits them all; releases the
    /// reserved ones if any node refuses, so no part of the group is held.
    async fn reserve_and_commit(&self, id: PlacementGroupId, by_node: NodeBundles) -> Result<(), NotPlaced> {
        let by_node = &by_node;
        let single_node = by_node.len() == 1;
        let reserves = by_node.iter().map(|(address, bundles)| async move {
            drop(self.release_lock(address).write().await);
            self.bundle_nodes
                .reserve(address, id, bundles.clone(), single_node)
                .await
        });
        let reserved = join_all(reserves).await;
        let refusal = by_node.keys().zip(&reserved).find_map(|(address, result)| {
            let error = result.as_ref().err()?.clone();
            Some(NotPlaced::Refused {
                node: address.clone(),
                error,
            })
        });
        if let Some(refusal) = refusal {
            self.release_new(id, by_node, &reserved).await;
            return Err(refusal);
        }
        if single_node {
            return Ok(());
        }
        let commits = by_node.iter().map(|(address, bundles)| {
            let indexes = bundles.iter().map(|(index, _)| *index).collect();
            self.bundle_nodes.commit(address, id, indexes)
        });
        let committed = join_all(commits).await;
        let failure = by_node.keys().zip(&committed).find_map(|(address, result)| {
            let error = result.as_ref().err()?.clone();
            Some(NotPlaced::CommitFailed {
                node: address.clone(),
                error,
            })
        });
        if let Some(failure) = failure {
            let all_ok: Vec<Result<(), BundleCallError>> = by_node.keys().map(|_| Ok(())).collect();
            self.release_new(id, by_node, &all_ok).await;
            return Err(failure);
        }
        Ok(())
    }

    /// Puts the bundles the last plan placed back into the head's view.
    fn give_back_new(&self, record: &GroupRecord, new: &[(usize, BundleLocation)]) {
        self.give_back_to_view(
            new.iter()
                .map(|(index, location)| (&record.spec.bundles[*index], location)),
        );
    }

    /// Releases the new bundles on the nodes whose reservation succeeded;
    /// bundles the group already held there stay.
    async fn release_new(&self, id: PlacementGroupId, by_node: &NodeBundles, reserved: &[Result<(), BundleCallError>]) {
        let releases =
            by_node
                .iter()
                .zip(reserved)
                .filter(|(_, result)| result.is_ok())
                .map(|((address, bundles), _)| {
                    let indexes = bundles.iter().map(|(index, _)| *index).collect();
                    self.bundle_nodes.release(address, id, indexes)
                });
        join_all(releases).await;
    }

    /// Puts `bundles` back into the head's view of free resources on their
    /// nodes, until the nodes' next heartbeats.
    fn give_back_to_view<'a>(&self, bundles: impl IntoIterator<Item = (&'a ResourceSet, &'a BundleLocation)>) {
        let mut nodes = self.nodes();
        let view = nodes.placement_view();
        for (bundle, location) in bundles {
            if let Some(index) = view.index(location.node_id) {
                let demand = view.demand(bundle);
                view.add_back(index, &demand);
            }
        }
    }
}
