//! What `raylet memory` shows: for each alive node, how much of its object
//! store is used and spilled, and the objects in it with their owners and
//! the processes that hold references to them.

use std::collections::HashMap;
use std::time::Duration;

use raylet_cluster_status::ClusterStatus;
use raylet_common::auth::AuthToken;
use raylet_proto::v1::object_store_service_client::ObjectStoreServiceClient;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;
use raylet_proto::v1::{DescribeObjectsRequest, GetStoreStatsRequest, StoreStats, StoredObject as Wire};
use raylet_proto::{NodeId, ObjectId};
use serde::Serialize;

use crate::Result;

/// How long to wait for a node or an owner that does not answer.
const PATIENCE: Duration = Duration::from_secs(2);

/// One node's object store.
#[derive(Clone, Debug, Serialize)]
pub struct NodeMemory {
    pub node_id: NodeId,
    pub address: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub spilled_bytes: u64,
    pub spill_limit_bytes: u64,
    /// Bytes this store sent to other nodes' stores, and pulled from them.
    pub served_bytes: u64,
    pub pulled_bytes: u64,
    pub objects: Vec<StoredObject>,
}

/// One object in a node's store.
#[derive(Clone, Debug, Serialize)]
pub struct StoredObject {
    pub id: ObjectId,
    pub size: u64,
    /// The owner service address of the process that owns it.
    pub owner: String,
    pub spilled: bool,
    pub sealed: bool,
    /// Mappings of it that readers hold now.
    pub readers: u32,
    /// Who refers to it, as its owner says; `None` when the owner did not answer.
    pub holders: Option<ObjectHolders>,
}

/// The references to an object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ObjectHolders {
    /// Handles in the owner's process.
    pub owner_handles: u32,
    /// Other processes holding references, by owner service address.
    pub borrowers: Vec<String>,
}

/// Asks the head at `head` for the alive nodes, each node's store for its
/// objects, and each owner for the references to its objects. A node that
/// does not answer (it may have died a moment ago) is left out.
pub async fn collect_memory(head: &str, token: &AuthToken) -> Result<Vec<NodeMemory>> {
    let status = ClusterStatus::fetch(head, token, PATIENCE).await?;
    let mut nodes = Vec::new();
    for node in status.alive() {
        let stats = match store_stats(&node.address, token).await {
            Ok(stats) => stats,
            Err(error) => {
                tracing::warn!(node = %node.address, %error, "a node's object store does not answer; leaving it out");
                continue;
            }
        };
        nodes.push(NodeMemory {
            node_id: node.node_id,
            address: node.address.clone(),
            capacity_bytes: stats.capacity_bytes,
            used_bytes: stats.used_bytes,
            spilled_bytes: stats.spilled_bytes,
            spill_limit_bytes: stats.spill_limit_bytes,
            served_bytes: stats.served_bytes,
            pulled_bytes: stats.pulled_bytes,
            objects: stats.objects.into_iter().filter_map(stored_object).collect(),
        });
    }
    add_holders(&mut nodes, token).await;
    Ok(nodes)
}

async fn store_stats(address: &str, token: &AuthToken) -> Result<StoreStats> {
    let channel = raylet_proto::channel::connect(address, token, PATIENCE).await?;
    let reply = ObjectStoreServiceClient::new(channel)
        .get_store_stats(GetStoreStatsRequest {})
        .await
        .map_err(raylet_proto::Error::from)?;
    Ok(reply.into_inner())
}

fn stored_object(object: Wire) -> Option<StoredObject> {
    Some(StoredObject {
        id: ObjectId::from_wire(&object.object_id).ok()?,
        size: object.size,
        owner: object.owner_address,
        spilled: object.spilled,
        sealed: object.sealed,
        readers: object.pins,
        holders: None,
    })
}

/// Fills in each object's holders with one call per owner.
async fn add_holders(nodes: &mut [NodeMemory], token: &AuthToken) {
    let mut by_owner: HashMap<String, Vec<ObjectId>> = HashMap::new();
    for object in nodes.iter().flat_map(|n| &n.objects) {
        by_owner.entry(object.owner.clone()).or_default().push(object.id);
    }
    let mut holders = HashMap::new();
    for (owner, ids) in by_owner {
        match describe(&owner, &ids, token).await {
            Ok(described) => holders.extend(described),
            Err(error) => tracing::debug!(%owner, %error, "the owner of stored objects does not answer"),
        }
    }
    for object in nodes.iter_mut().flat_map(|n| &mut n.objects) {
        object.holders = holders.get(&object.id).cloned();
    }
}

async fn describe(owner: &str, ids: &[ObjectId], token: &AuthToken) -> Result<HashMap<ObjectId, ObjectHolders>> {
    let channel = raylet_proto::channel::connect(owner, token, PATIENCE).await?;
    let request = DescribeObjectsRequest {
        object_ids: ids.iter().map(|id| id.as_bytes().to_vec()).collect(),
    };
    let reply = OwnerServiceClient::new(channel)
        .describe_objects(request)
        .await
        .map_err(raylet_proto::Error::from)?;
    Ok(reply
        .into_inner()
        .objects
        .into_iter()
        .filter(|o| o.known)
        .filter_map(|o| {
            let holders = ObjectHolders {
                owner_handles: o.owner_handles,
                borrowers: o.borrowers,
            };
            Some((ObjectId::from_wire(&o.object_id).ok()?, holders))
        })
        .collect())
}
