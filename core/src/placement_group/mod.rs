//! Placement groups from the user's side: bundles of resources that the head
//! reserves on nodes all at once (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD),
//! a handle to wait for them, remove them and run tasks and actors in them,
//! and the listing that `raylet list placement-groups` prints.

pub(crate) mod handle;
pub(crate) mod session;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::resources::{CPU, GPU, MEMORY};
use raylet_proto::v1::placement_group_call::Kind as CallKind;
use raylet_proto::v1::placement_group_service_client::PlacementGroupServiceClient;
use raylet_proto::v1::{
    self, CreatePlacementGroupRequest, ListPlacementGroupsRequest, PlacementGroupRecord, RemovePlacementGroupRequest,
};
use raylet_proto::{NodeId, PlacementGroupId, PlacementStrategy, ResourceSet};
use serde::Serialize;
use tokio::sync::watch;

use crate::placement_group::session::wait_for_group;
use crate::submitter::resources::Resources;
use crate::{Cluster, Error, Result};

use self::handle::Creation;
pub use self::handle::PlacementGroup;

/// How long the head may take to answer a connection.
const HEAD_PATIENCE: Duration = Duration::from_secs(5);
/// `ready()` asks the head again after this long, until the group settles.
const WAIT_SLICE: Duration = Duration::from_secs(600);

/// The resources of one bundle of a placement group.
#[derive(Clone, Debug, Default)]
pub struct Bundle(Resources);

impl Bundle {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn num_cpus(self, amount: f64) -> Self {
        self.resource(CPU, amount)
    }

    pub fn num_gpus(self, amount: f64) -> Self {
        self.resource(GPU, amount)
    }

    /// Bytes of memory.
    pub fn memory(self, bytes: f64) -> Self {
        self.resource(MEMORY, bytes)
    }

    /// Any resource by name, e.g. `resource("TPU", 1.0)`.
    pub fn resource(self, name: &str, amount: f64) -> Self {
        Bundle(self.0.with(name, amount))
    }

    /// The bundle's amounts, validated as placing it validates them: what
    /// a node's `available` resources must hold for it.
    pub fn to_resource_set(&self) -> Result<ResourceSet> {
        self.0.to_set()
    }
}

impl PlacementGroup {
    /// Waits until every bundle is reserved. Fails at once when the alive
    /// nodes can never hold the group, or when it was removed.
    pub fn ready(&self) -> Result<()> {
        self.wait(None)
    }

    /// [`PlacementGroup::ready`], giving up after `timeout`.
    pub fn ready_timeout(&self, timeout: Duration) -> Result<()> {
        self.wait(Some(timeout))
    }

    /// Removes the group. It returns once the head has marked the group
    /// removed; the bundles are freed, and the tasks and actors that run in
    /// them ended, right after.
    pub fn remove(&self) -> Result<()> {
        let core = crate::current()?.core().clone();
        let id = self.id;
        let creation = self.creation.clone();
        self.removed.store(true, Ordering::Release);
        core.clone().block_on(async move {
            let _ = created(creation).await;
            let request = RemovePlacementGroupRequest {
                placement_group_id: id.as_bytes().to_vec(),
            };
            core.placement_groups
                .call(core.ctx(), CallKind::Remove(request))
                .await?;
            Ok(())
        })
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let core = crate::current()?.core().clone();
        let id = self.id;
        let creation = self.creation.clone().filter(|_| !self.removed.load(Ordering::Acquire));
        core.clone().block_on(async move {
            match created(creation).await {
                Some(Ok(v1::PlacementGroupState::Created)) => return Ok(()),
                Some(Err(error)) => return Err(error.into()),
                _ => {}
            }
            let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
            loop {
                let slice = deadline.map_or(WAIT_SLICE, |d| d.saturating_duration_since(tokio::time::Instant::now()));
                let record = wait_for_group(core.ctx(), id, slice.min(WAIT_SLICE)).await?;
                let info = PlacementGroupInfo::from_record(record)?;
                match info.state {
                    PlacementGroupState::Created => return Ok(()),
                    PlacementGroupState::Infeasible => {
                        return Err(Error::PlacementGroupInfeasible {
                            group: id,
                            reason: info.reason,
                        });
                    }
                    PlacementGroupState::Removed => return Err(Error::PlacementGroupRemoved { group: id }),
                    _ if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) => {
                        return Err(Error::PlacementGroupTimeout {
                            group: id,
                            timeout: timeout.unwrap_or_default(),
                            reason: info.reason,
                        });
                    }
                    _ => {}
                }
            }
        })
    }
}

/// The head's answer to the creation this handle made, once it came.
async fn created(creation: Option<watch::Receiver<Option<Creation>>>) -> Option<Creation> {
    let mut creation = creation?;
    let answer = creation.wait_for(Option::is_some).await.ok()?;
    answer.clone()
}

impl Cluster {
    /// Asks the head to reserve `bundles` under `strategy`, all at once or
    /// not at all. Returns at once, as the request goes out;
    /// [`PlacementGroup::ready`] waits for the group.
    pub fn placement_group(&self, bundles: Vec<Bundle>, strategy: PlacementStrategy) -> Result<PlacementGroup> {
        let bundles = bundles
            .iter()
            .map(|b| b.0.to_set())
            .collect::<Result<Vec<ResourceSet>>>()?;
        raylet_proto::placement_group::check_bundles(&bundles)?;
        let id = PlacementGroupId::random();
        let (answer, creation) = watch::channel(None);
        let group = PlacementGroup {
            id,
            bundle_count: bundles.len() as u32,
            creation: Some(creation),
            removed: Arc::default(),
        };
        let request = CreatePlacementGroupRequest {
            placement_group_id: id.as_bytes().to_vec(),
            name: String::new(),
            bundles: bundles.iter().map(ResourceSet::to_proto).collect(),
            strategy: strategy.to_proto() as i32,
        };
        let core = self.core().clone();
        self.core().ctx().runtime.spawn(async move {
            let created = core.placement_groups.call(core.ctx(), CallKind::Create(request)).await;
            let state = created.map(|record| record.state()).map_err(cluster_error);
            answer.send_replace(Some(state));
        });
        Ok(group)
    }

    /// Every placement group of the cluster, removed ones included.
    pub fn list_placement_groups(&self) -> Result<Vec<PlacementGroupInfo>> {
        let core = self.core().clone();
        core.clone()
            .block_on(async move { list_placement_groups(&core.ctx().head_address, &core.ctx().token).await })
    }
}

/// The cluster error inside `error`, as the head's answers carry them.
fn cluster_error(error: Error) -> raylet_proto::Error {
    match error {
        Error::Cluster(error) => error,
        other => raylet_proto::Error::Internal(other.to_string()),
    }
}

/// Every placement group of the cluster whose head is at `head`.
pub async fn list_placement_groups(head: &str, token: &AuthToken) -> Result<Vec<PlacementGroupInfo>> {
    let channel = raylet_proto::channel::connect(head, token, HEAD_PATIENCE).await?;
    let reply = PlacementGroupServiceClient::new(channel)
        .list_placement_groups(ListPlacementGroupsRequest {})
        .await;
    let records = reply.map_err(raylet_proto::Error::from)?.into_inner().placement_groups;
    records.into_iter().map(PlacementGroupInfo::from_record).collect()
}

/// Where a placement group is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PlacementGroupState {
    Pending,
    Created,
    /// A node with bundles died; they are being placed again.
    Rescheduling,
    /// The alive nodes can never hold it; it is placed if nodes join that can.
    Infeasible,
    Removed,
}

impl std::fmt::Display for PlacementGroupState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PlacementGroupState::Pending => "PENDING",
            PlacementGroupState::Created => "CREATED",
            PlacementGroupState::Rescheduling => "RESCHEDULING",
            PlacementGroupState::Infeasible => "INFEASIBLE",
            PlacementGroupState::Removed => "REMOVED",
        })
    }
}

/// One placement group of the cluster.
#[derive(Clone, Debug, Serialize)]
pub struct PlacementGroupInfo {
    #[serde(serialize_with = "display")]
    pub id: PlacementGroupId,
    pub name: String,
    #[serde(serialize_with = "display")]
    pub strategy: PlacementStrategy,
    pub state: PlacementGroupState,
    pub bundles: Vec<ResourceSet>,
    /// The node of each bundle, while the group is created.
    #[serde(serialize_with = "display_all")]
    pub nodes: Vec<NodeId>,
    /// Why it is pending, infeasible, rescheduling or removed.
    pub reason: String,
}

impl PlacementGroupInfo {
    pub(crate) fn from_record(record: PlacementGroupRecord) -> Result<Self> {
        let state = match record.state() {
            v1::PlacementGroupState::Created => PlacementGroupState::Created,
            v1::PlacementGroupState::Rescheduling => PlacementGroupState::Rescheduling,
            v1::PlacementGroupState::Infeasible => PlacementGroupState::Infeasible,
            v1::PlacementGroupState::Removed => PlacementGroupState::Removed,
            v1::PlacementGroupState::Pending | v1::PlacementGroupState::Unspecified => PlacementGroupState::Pending,
        };
        Ok(PlacementGroupInfo {
            id: PlacementGroupId::from_wire(&record.placement_group_id)?,
            strategy: PlacementStrategy::from_proto(record.strategy()),
            state,
            bundles: record
                .bundles
                .iter()
                .map(ResourceSet::from_proto)
                .collect::<raylet_proto::Result<_>>()?,
            nodes: record
                .locations
                .iter()
                .map(|location| NodeId::from_wire(&location.node_id))
                .collect::<raylet_proto::Result<_>>()?,
            name: record.name,
            reason: record.reason,
        })
    }
}

fn display<T: std::fmt::Display, S: serde::Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

fn display_all<T: std::fmt::Display, S: serde::Serializer>(values: &[T], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(values.iter().map(ToString::to_string))
}
