//! What `raylet memory` shows: for each alive node, how much of its object
//! store is used and spilled, and the objects in it.

use raylet_proto::v1::GetStoreStatsRequest;
use raylet_proto::v1::object_store_service_client::ObjectStoreServiceClient;
use raylet_proto::{NodeId, ObjectId};
use raylet_scheduler::status::ClusterStatus;

use crate::Result;
use crate::core_worker::CoreWorker;

/// One node's object store.
#[derive(Clone, Debug)]
pub struct NodeMemory {
    pub node_id: NodeId,
    pub address: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub spilled_bytes: u64,
    pub spill_limit_bytes: u64,
    pub objects: Vec<StoredObject>,
}

/// One object in a node's store.
#[derive(Clone, Debug)]
pub struct StoredObject {
    pub id: ObjectId,
    pub size: u64,
    /// The owner service address of the process that owns it.
    pub owner: String,
    pub spilled: bool,
    pub sealed: bool,
    /// Mappings of it that readers hold now.
    pub readers: u32,
}

/// Asks the store of every alive node for its usage.
pub(crate) async fn collect(core: &CoreWorker, status: &ClusterStatus) -> Result<Vec<NodeMemory>> {
    let mut nodes = Vec::new();
    for node in status.alive() {
        let channel = core.channel(&node.address).await?;
        let stats = ObjectStoreServiceClient::new(channel)
            .get_store_stats(GetStoreStatsRequest {})
            .await
            .map_err(raylet_proto::Error::from)?
            .into_inner();
        let objects = stats
            .objects
            .into_iter()
            .filter_map(|object| {
                Some(StoredObject {
                    id: ObjectId::from_wire(&object.object_id).ok()?,
                    size: object.size,
                    owner: object.owner_address,
                    spilled: object.spilled,
                    sealed: object.sealed,
                    readers: object.pins,
                })
            })
            .collect();
        nodes.push(NodeMemory {
            node_id: node.node_id,
            address: node.address.clone(),
            capacity_bytes: stats.capacity_bytes,
            used_bytes: stats.used_bytes,
            spilled_bytes: stats.spilled_bytes,
            spill_limit_bytes: stats.spill_limit_bytes,
            objects,
        });
    }
    Ok(nodes)
}
