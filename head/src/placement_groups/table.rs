//! The head's table of placement groups: each group's bundles, strategy,
//! state and bundle locations, with a watch per group for those who wait
//! for it to be created. Every change is written to the head's state
//! store, from which a restarted head recovers the table.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use prost::Message;
use raylet_cluster_status::unix_ms;
use raylet_proto::{IdMap, NodeId, PlacementGroupId, PlacementStrategy, ResourceSet, v1};
use tokio::sync::watch;

use super::error::PlacementGroupError;
use crate::state_store::{Committed, StateError, StateStore, Table};

type Result<T, E = PlacementGroupError> = std::result::Result<T, E>;

/// How many removed groups are kept for `raylet list placement-groups`.
const MAX_REMOVED_RECORDS: usize = 10_000;

/// A group as its creator asked for it.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    pub id: PlacementGroupId,
    pub name: String,
    pub bundles: Vec<ResourceSet>,
    pub strategy: PlacementStrategy,
}

/// Where one bundle is reserved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleLocation {
    pub node_id: NodeId,
    /// The node manager's host:port.
    pub address: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Pending,
    Created,
    Rescheduling,
    Infeasible,
    Removed,
}

impl GroupState {
    /// Whether some bundles still need a node.
    pub fn is_unplaced(self) -> bool {
        matches!(
            self,
            GroupState::Pending | GroupState::Rescheduling | GroupState::Infeasible
        )
    }

    /// Whether waiting for the group is over: created, infeasible or removed.
    pub fn is_settled(self) -> bool {
        matches!(self, GroupState::Created | GroupState::Infeasible | GroupState::Removed)
    }
}

/// A group's current state.
#[derive(Clone, Debug)]
pub struct GroupRecord {
    pub spec: Arc<GroupSpec>,
    pub state: GroupState,
    /// One per bundle; `None` for a bundle that has no node yet.
    pub locations: Vec<Option<BundleLocation>>,
    /// Why it is pending, infeasible, rescheduling or removed.
    pub reason: String,
    pub created_unix_ms: u64,
}

impl GroupRecord {
    /// The record as the state store keeps it, with every placed bundle.
    fn to_stored(&self, seq: u64) -> v1::StoredPlacementGroup {
        let placed = self.locations.iter().enumerate().filter_map(|(index, location)| {
            let location = location.as_ref()?;
            Some(v1::PlacedBundle {
                index: index as u32,
                location: Some(v1::BundleLocation {
                    node_id: location.node_id.as_bytes().to_vec(),
                    address: location.address.clone(),
                }),
            })
        });
        v1::StoredPlacementGroup {
            record: Some(self.to_proto()),
            placed: placed.collect(),
            seq,
        }
    }

    /// A record the state store kept, and its creation order.
    fn from_stored(stored: v1::StoredPlacementGroup) -> raylet_proto::Result<(Self, u64)> {
        let record = stored.record.unwrap_or_default();
        let bundles = record
            .bundles
            .iter()
            .map(ResourceSet::from_proto)
            .collect::<raylet_proto::Result<Vec<_>>>()?;
        let mut locations = vec![None; bundles.len()];
        for placed in stored.placed {
            let location = placed.location.unwrap_or_default();
            if let Some(slot) = locations.get_mut(placed.index as usize) {
                *slot = Some(BundleLocation {
                    node_id: NodeId::from_wire(&location.node_id)?,
                    address: location.address,
                });
            }
        }
        let state = match record.state() {
            v1::PlacementGroupState::Created => GroupState::Created,
            v1::PlacementGroupState::Rescheduling => GroupState::Rescheduling,
            v1::PlacementGroupState::Infeasible => GroupState::Infeasible,
            v1::PlacementGroupState::Removed => GroupState::Removed,
            v1::PlacementGroupState::Pending | v1::PlacementGroupState::Unspecified => GroupState::Pending,
        };
        let spec = GroupSpec {
            id: PlacementGroupId::from_wire(&record.placement_group_id)?,
            strategy: PlacementStrategy::from_proto(record.strategy()),
            name: record.name,
            bundles,
        };
        let group = GroupRecord {
            spec: Arc::new(spec),
            state,
            locations,
            reason: record.reason,
            created_unix_ms: record.created_unix_ms,
        };
        Ok((group, stored.seq))
    }

    pub fn to_proto(&self) -> v1::PlacementGroupRecord {
        let state = match self.state {
            GroupState::Pending => v1::PlacementGroupState::Pending,
            GroupState::Created => v1::PlacementGroupState::Created,
            GroupState::Rescheduling => v1::PlacementGroupState::Rescheduling,
            GroupState::Infeasible => v1::PlacementGroupState::Infeasible,
            GroupState::Removed => v1::PlacementGroupState::Removed,
        };
        let locations = match self.state {
            GroupState::Created => self
                .locations
                .iter()
                .flatten()
                .map(|location| v1::BundleLocation {
                    node_id: location.node_id.as_bytes().to_vec(),
                    address: location.address.clone(),
                })
                .collect(),
            _ => Vec::new(),
        };
        v1::PlacementGroupRecord {
            placement_group_id: self.spec.id.as_bytes().to_vec(),
            name: self.spec.name.clone(),
            bundles: self.spec.bundles.iter().map(ResourceSet::to_proto).collect(),
            strategy: self.spec.strategy.to_proto() as i32,
            state: state as i32,
            locations,
            reason: self.reason.clone(),
            created_unix_ms: self.created_unix_ms,
        }
    }
}

/// Every group, with the removed ones kept for a while.
#[derive(Default)]
pub struct GroupTable {
    groups: IdMap<PlacementGroupId, (u64, watch::Sender<GroupRecord>)>,
    next_seq: u64,
    /// The groups that wait for nodes, by creation order.
    unplaced: BTreeSet<(u64, PlacementGroupId)>,
    removed: VecDeque<PlacementGroupId>,
    store: StateStore,
}

impl GroupTable {
    /// The table as `store` holds it.
    pub fn recover(store: StateStore) -> Result<Self, StateError> {
        let mut stored = Vec::new();
        for (key, value) in store.load(Table::PlacementGroups)? {
            let record = || format!("placement group {key:02x?}");
            let group = v1::StoredPlacementGroup::decode(value.as_slice()).map_err(StateError::corrupt(record()))?;
            stored.push(GroupRecord::from_stored(group).map_err(StateError::corrupt(record()))?);
        }
        stored.sort_by_key(|(_, seq)| *seq);
        let mut table = GroupTable {
            store,
            ..GroupTable::default()
        };
        for (record, seq) in stored {
            let id = record.spec.id;
            table.next_seq = table.next_seq.max(seq);
            match record.state {
                GroupState::Removed => table.removed.push_back(id),
                state if state.is_unplaced() => {
                    table.unplaced.insert((seq, id));
                }
                _ => {}
            }
            table.groups.insert(id, (seq, watch::channel(record).0));
        }
        Ok(table)
    }

    /// Writes the group to the state store, behind the caller.
    fn persist(&self, id: PlacementGroupId) {
        if let Some((seq, group)) = self.groups.get(&id) {
            let stored = group.borrow().to_stored(*seq);
            self.store.put(Table::PlacementGroups, id.as_bytes(), &stored);
        }
    }

    /// Resolves once every change so far is on disk, or with the error
    /// that kept one off it.
    pub fn flushed(&self) -> Committed {
        self.store.flush()
    }

    /// Adds a pending group; its id must be new.
    pub fn create(&mut self, spec: GroupSpec) -> Result<()> {
        if self.groups.contains_key(&spec.id) {
            return Err(PlacementGroupError::Exists { group_id: spec.id });
        }
        let record = GroupRecord {
            locations: vec![None; spec.bundles.len()],
            spec: Arc::new(spec),
            state: GroupState::Pending,
            reason: "not placed yet".into(),
            created_unix_ms: unix_ms(SystemTime::now()),
        };
        self.next_seq += 1;
        self.unplaced.insert((self.next_seq, record.spec.id));
        let id = record.spec.id;
        self.groups.insert(id, (self.next_seq, watch::channel(record).0));
        self.persist(id);
        Ok(())
    }

    pub fn record(&self, id: PlacementGroupId) -> Result<GroupRecord> {
        self.groups
            .get(&id)
            .map(|(_, group)| group.borrow().clone())
            .ok_or(PlacementGroupError::UnknownGroup { group_id: id })
    }

    pub fn watch(&self, id: PlacementGroupId) -> Result<watch::Receiver<GroupRecord>> {
        self.groups
            .get(&id)
            .map(|(_, group)| group.subscribe())
            .ok_or(PlacementGroupError::UnknownGroup { group_id: id })
    }

    /// Changes a group's record and tells those who watch it.
    pub fn update(&mut self, id: PlacementGroupId, change: impl FnOnce(&mut GroupRecord)) {
        let Some((seq, group)) = self.groups.get(&id) else {
            return;
        };
        group.send_modify(change);
        match group.borrow().state.is_unplaced() {
            true => self.unplaced.insert((*seq, id)),
            false => self.unplaced.remove(&(*seq, id)),
        };
        self.persist(id);
    }

    /// The groups that wait for nodes, oldest first.
    pub fn unplaced(&self) -> Vec<PlacementGroupId> {
        self.unplaced.iter().map(|(_, id)| *id).collect()
    }

    /// The groups with every bundle placed.
    pub fn created(&self) -> Vec<GroupRecord> {
        let groups = self.groups.values().map(|(_, group)| group.borrow());
        groups
            .filter(|record| record.state == GroupState::Created)
            .map(|record| record.clone())
            .collect()
    }

    /// Marks the group removed and returns where its bundles were.
    pub fn remove(&mut self, id: PlacementGroupId, reason: &str) -> Result<Vec<Option<BundleLocation>>> {
        let record = self.record(id)?;
        if record.state == GroupState::Removed {
            return Ok(Vec::new());
        }
        self.update(id, |record| {
            record.state = GroupState::Removed;
            record.reason = reason.to_string();
        });
        self.removed.push_back(id);
        if self.removed.len() > MAX_REMOVED_RECORDS
            && let Some(oldest) = self.removed.pop_front()
        {
            self.groups.remove(&oldest);
            self.store.delete(Table::PlacementGroups, oldest.as_bytes());
        }
        Ok(record.locations)
    }

    /// A removed group's bundles are freed on their nodes.
    pub fn released(&mut self, id: PlacementGroupId) {
        let removed = self.record(id).is_ok_and(|record| record.state == GroupState::Removed);
        if removed {
            self.update(id, |record| {
                record.locations.iter_mut().for_each(|location| *location = None)
            });
        }
    }

    /// Every record, in creation order.
    pub fn records(&self) -> Vec<GroupRecord> {
        let mut groups: Vec<&(u64, watch::Sender<GroupRecord>)> = self.groups.values().collect();
        groups.sort_by_key(|(seq, _)| *seq);
        groups.into_iter().map(|(_, group)| group.borrow().clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use raylet_proto::resources::CPU;
    use raylet_proto::{Amount, PlacementGroupId};

    use super::*;
    use crate::state_store::tests::reopen;

    fn spec(bundles: usize) -> GroupSpec {
        GroupSpec {
            id: PlacementGroupId::random(),
            name: String::new(),
            bundles: vec![ResourceSet::new().with(CPU, Amount::whole(1)); bundles],
            strategy: PlacementStrategy::Spread,
        }
    }

    fn location(port: u16) -> BundleLocation {
        BundleLocation {
            node_id: NodeId::random(),
            address: format!("10.0.0.1:{port}"),
        }
    }

    #[tokio::test]
    async fn a_recovered_table_has_every_group_with_its_bundles_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let (created, rescheduling, removed) = (spec(2), spec(2), spec(1));
        let (first, second, third) = (location(1), location(2), location(3));
        {
            let mut table = GroupTable::recover(StateStore::open(dir.path()).unwrap()).unwrap();
            for group in [&created, &rescheduling, &removed] {
                table.create(group.clone()).unwrap();
            }
            table.update(created.id, |record| {
                record.state = GroupState::Created;
                record.locations = vec![Some(first.clone()), Some(second.clone())];
            });
            table.update(rescheduling.id, |record| {
                record.state = GroupState::Rescheduling;
                record.locations = vec![None, Some(second.clone())];
            });
            table.update(removed.id, |record| record.locations = vec![Some(third.clone())]);
            table.remove(removed.id, "removed by its owner").unwrap();
            table.flushed().await.unwrap();
        }
        let mut table = GroupTable::recover(reopen(dir.path()).await).unwrap();
        let states: Vec<(PlacementGroupId, GroupState)> =
            table.records().iter().map(|r| (r.spec.id, r.state)).collect();
        assert_eq!(
            states,
            [
                (created.id, GroupState::Created),
                (rescheduling.id, GroupState::Rescheduling),
                (removed.id, GroupState::Removed)
            ],
            "in creation order"
        );
        let record = table.record(created.id).unwrap();
        assert_eq!(record.locations, [Some(first), Some(second.clone())]);
        assert_eq!(record.spec.bundles, created.bundles);
        assert_eq!(record.spec.strategy, PlacementStrategy::Spread);
        assert_eq!(table.record(rescheduling.id).unwrap().locations, [None, Some(second)]);
        assert_eq!(
            table.unplaced(),
            [rescheduling.id],
            "the group with a bundle to place is placed again"
        );
        assert_eq!(
            table.record(removed.id).unwrap().locations,
            [Some(third)],
            "a removed group keeps its bundles' nodes until they are freed"
        );
        table.released(removed.id);
        assert_eq!(table.record(removed.id).unwrap().locations, [None]);
    }
}
