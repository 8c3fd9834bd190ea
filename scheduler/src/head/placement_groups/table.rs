//! The head's table of placement groups: each group's bundles, strategy,
//! state and bundle locations, with a watch per group for those who wait
//! for it to be created.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use raylet_proto::{Error, IdMap, NodeId, PlacementGroupId, PlacementStrategy, ResourceSet, Result, v1};
use tokio::sync::watch;

use crate::status::unix_ms;

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
}

impl GroupTable {
    /// Adds a pending group; its id must be new.
    pub fn create(&mut self, spec: GroupSpec) -> Result<()> {
        if self.groups.contains_key(&spec.id) {
            return Err(Error::AlreadyExists(format!(
                "placement group {} exists already",
                spec.id
            )));
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
        self.groups
            .insert(record.spec.id, (self.next_seq, watch::channel(record).0));
        Ok(())
    }

    pub fn record(&self, id: PlacementGroupId) -> Result<GroupRecord> {
        self.groups
            .get(&id)
            .map(|(_, group)| group.borrow().clone())
            .ok_or_else(|| Error::NotFound(format!("placement group {id} does not exist")))
    }

    pub fn watch(&self, id: PlacementGroupId) -> Result<watch::Receiver<GroupRecord>> {
        self.groups
            .get(&id)
            .map(|(_, group)| group.subscribe())
            .ok_or_else(|| Error::NotFound(format!("placement group {id} does not exist")))
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
        }
        Ok(record.locations)
    }

    /// Every record, in creation order.
    pub fn records(&self) -> Vec<GroupRecord> {
        let mut groups: Vec<&(u64, watch::Sender<GroupRecord>)> = self.groups.values().collect();
        groups.sort_by_key(|(seq, _)| *seq);
        groups.into_iter().map(|(_, group)| group.borrow().clone()).collect()
    }
}
