//! Draining a node before its removal: the head takes it out of placement,
//! then, once nothing runs there, the objects its store holds are copied
//! to another node's store and their owners told of the new copies, so
//! that they stay readable after the node is gone.

use std::time::Duration;

use raylet_cluster_status::{ClusterStatus, NodeStatus};
use raylet_common::auth::AuthToken;
use raylet_proto::resources::OBJECT_STORE_MEMORY;
use raylet_proto::v1::object_store_service_client::ObjectStoreServiceClient;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;
use raylet_proto::v1::{
    AddCopiesRequest, DrainNodeRequest, GetStoreStatsRequest, ObjectCopy, PullObjectRequest, StoredObject,
};
use raylet_proto::{NodeId, ObjectId, Result};

use crate::provider::INSTANCE_LABEL;

/// How long one call to a node, a store or an owner may take to connect.
const PATIENCE: Duration = Duration::from_secs(5);
/// How long a pull may wait for room in the receiving store.
const PULL_ROOM_TIMEOUT: Duration = Duration::from_secs(30);

/// Asks the head to place nothing more on `node`.
pub(crate) async fn stop_placing(head: &str, token: &AuthToken, node: NodeId, reason: &str) -> Result<()> {
    let mut client = raylet_proto::channel::connect_head(head, token, PATIENCE).await?;
    client
        .drain_node(DrainNodeRequest {
            node_id: node.as_bytes().to_vec(),
            reason: reason.to_string(),
        })
        .await?;
    Ok(())
}

/// What moving a drained node's objects did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Moved {
    pub(crate) objects: usize,
    pub(crate) bytes: u64,
    /// Objects that could not be moved, with why.
    pub(crate) failed: Vec<String>,
}

/// Copies every sealed object in `node`'s store to another node that is
/// not being drained, and tells each owner.
pub(crate) async fn move_objects(
    status: &ClusterStatus,
    node: &NodeStatus,
    draining: &[NodeId],
    token: &AuthToken,
) -> Result<Moved> {
    let stats = store_objects(&node.address, token).await?;
    let sealed: Vec<StoredObject> = stats.into_iter().filter(|object| object.sealed).collect();
    let mut moved = Moved::default();
    if sealed.is_empty() {
        return Ok(moved);
    }
    let Some(target) = receiving_node(status, node.node_id, draining) else {
        moved.failed.push(format!(
            "{} objects stay: no other node is alive to take them",
            sealed.len()
        ));
        return Ok(moved);
    };
    for object in sealed {
        match copy_object(&object, &node.address, &target.address, token).await {
            Ok(()) => {
                moved.objects += 1;
                moved.bytes += object.size;
            }
            Err(error) => moved
                .failed
                .push(format!("{}: {error}", object_name(&object.object_id))),
        }
    }
    Ok(moved)
}

async fn store_objects(address: &str, token: &AuthToken) -> Result<Vec<StoredObject>> {
    let channel = raylet_proto::channel::connect(address, token, PATIENCE).await?;
    let stats = ObjectStoreServiceClient::new(channel)
        .get_store_stats(GetStoreStatsRequest {})
        .await?;
    Ok(stats.into_inner().objects)
}

/// The node that takes a leaving node's objects: one the autoscaler does
/// not manage (the head, nodes started by hand) if any, else a managed
/// one; among them the one with the most free object store memory. Never
/// `leaving` or a node being drained.
fn receiving_node<'a>(status: &'a ClusterStatus, leaving: NodeId, draining: &[NodeId]) -> Option<&'a NodeStatus> {
    let staying =
        |node: &&NodeStatus| node.node_id != leaving && node.draining.is_none() && !draining.contains(&node.node_id);
    status.alive().filter(staying).max_by_key(|node| {
        let unmanaged = !node.labels.contains_key(INSTANCE_LABEL);
        (unmanaged, node.available.get(OBJECT_STORE_MEMORY).raw())
    })
}

/// Pulls `object` from `source` into `target`'s store, then records the
/// copy with its owner.
async fn copy_object(object: &StoredObject, source: &str, target: &str, token: &AuthToken) -> Result<()> {
    let channel = raylet_proto::channel::connect(target, token, PATIENCE).await?;
    ObjectStoreServiceClient::new(channel)
        .pull_object(PullObjectRequest {
            object_id: object.object_id.clone(),
            size: object.size,
            owner_address: object.owner_address.clone(),
            sources: vec![source.to_string()],
            timeout_ms: PULL_ROOM_TIMEOUT.as_millis() as u64,
        })
        .await?;
    let owner = raylet_proto::channel::connect(&object.owner_address, token, PATIENCE).await?;
    OwnerServiceClient::new(owner)
        .add_copies(AddCopiesRequest {
            copies: vec![ObjectCopy {
                object_id: object.object_id.clone(),
                node_address: target.to_string(),
            }],
        })
        .await?;
    Ok(())
}

/// The object's id as raylet prints ids, or what is wrong with it.
fn object_name(wire: &[u8]) -> String {
    ObjectId::from_wire(wire).map_or_else(|e| format!("a malformed id ({e})"), |id| id.to_string())
}
