//! The store's end: each call answered on a thread of its own beside the
//! node manager's gRPC port, or declined.

use std::net::SocketAddr;
use std::sync::Arc;

use raylet_common::auth::AuthToken;
use raylet_proto::ObjectId;
use raylet_proto::same_node_calls::CallServer;
use raylet_proto::v1::{
    DeleteObjectsReply, DeleteObjectsRequest, SealObjectReply, StoreCall, StoreCallReply, store_call, store_call_reply,
};

use crate::error::{Result, StoreError};
use crate::service::{SharedStore, location_to_proto};

impl SharedStore {
    /// Serves same-node calls beside the node manager's gRPC port
    /// `address` until the server returned is dropped; `None` (logged)
    /// when they take gRPC only, as with TLS.
    pub fn serve_same_node(self: &Arc<Self>, address: SocketAddr, token: AuthToken) -> Option<CallServer> {
        let store = self.clone();
        let answer = move |call: StoreCall| Ok(store.answer(call));
        CallServer::start(
            address,
            token,
            ("object store calls", "raylet-store-calls"),
            Box::new(answer),
        )
    }

    fn answer(&self, call: StoreCall) -> StoreCallReply {
        let reply = match call.call {
            Some(store_call::Call::Create(create)) => self.create_here(create),
            Some(store_call::Call::Seal(seal)) => self.seal_here(seal),
            Some(store_call::Call::Get(get)) => self.get_here(get),
            Some(store_call::Call::Delete(delete)) => self.delete_here(delete),
            None => Err(StoreError::Invalid("an empty store call".into())),
        };
        let reply = reply.unwrap_or_else(|error| store_call_reply::Reply::Declined(error.to_string()));
        StoreCallReply { reply: Some(reply) }
    }

    fn create_here(&self, create: raylet_proto::v1::CreateObjectRequest) -> Result<store_call_reply::Reply> {
        let id = object_id(&create.object_id)?;
        let mut store = self.lock_if_free().ok_or_else(busy)?;
        let location = store
            .create_in_memory(create.session_id, id, create.size, &create.owner_address)?
            .ok_or_else(|| StoreError::Full(format!("object {id} needs room made on disk")))?;
        Ok(store_call_reply::Reply::Location(location_to_proto(location)))
    }

    fn seal_here(&self, seal: raylet_proto::v1::SealObjectRequest) -> Result<store_call_reply::Reply> {
        let id = object_id(&seal.object_id)?;
        self.lock_if_free()
            .ok_or_else(busy)?
            .seal(seal.session_id, id, seal.size)?;
        Ok(store_call_reply::Reply::Sealed(SealObjectReply {}))
    }

    fn get_here(&self, get: raylet_proto::v1::GetStoredObjectRequest) -> Result<store_call_reply::Reply> {
        let id = object_id(&get.object_id)?;
        let location = self
            .lock_if_free()
            .ok_or_else(busy)?
            .get_in_memory(get.session_id, id)?
            .ok_or_else(|| StoreError::Invalid(format!("object {id} is on disk")))?;
        Ok(store_call_reply::Reply::Location(location_to_proto(location)))
    }
}

impl SharedStore {
    fn delete_here(&self, delete: DeleteObjectsRequest) -> Result<store_call_reply::Reply> {
        let ids = delete
            .object_ids
            .iter()
            .map(|id| object_id(id))
            .collect::<Result<Vec<_>>>()?;
        self.lock_if_free().ok_or_else(busy)?.delete(&ids);
        self.freed.notify_waiters();
        Ok(store_call_reply::Reply::Deleted(DeleteObjectsReply {}))
    }
}

fn object_id(wire: &[u8]) -> Result<ObjectId> {
    ObjectId::from_wire(wire).map_err(|error| StoreError::Invalid(error.to_string()))
}

fn busy() -> StoreError {
    StoreError::Invalid("the store is busy".into())
}
