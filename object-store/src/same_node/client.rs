//! The client's end: connections to the node's store kept for reuse, and
//! the creates, seals and gets that a thread makes through them itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use raylet_common::auth::AuthToken;
use raylet_proto::ObjectId;
use raylet_proto::same_node_calls::CallConnection;
use raylet_proto::v1::{
    CreateObjectRequest, DeleteObjectsRequest, GetStoredObjectRequest, ObjectLocation, SealObjectRequest, StoreCall,
    StoreCallReply, store_call, store_call_reply,
};

use crate::client::{MappedObject, ObjectWriter, StoreClient, Unsealed};
use crate::segment::{map_readonly, map_writable, proc_path};

/// Idle connections kept; more are closed as they come back.
const MAX_IDLE: usize = 16;

/// How a client reaches its node's store on the same machine.
pub struct SameNodeStore {
    /// The node manager's gRPC address, which the socket stands beside.
    address: String,
    token: AuthToken,
    idle: Mutex<Vec<CallConnection>>,
    /// Set once the socket could not be opened: calls take gRPC from then on.
    unreachable: AtomicBool,
}

impl SameNodeStore {
    /// The store of the node manager at `address`, reached with `token`.
    pub fn new(address: &str, token: AuthToken) -> Self {
        SameNodeStore {
            address: address.to_string(),
            token,
            idle: Mutex::default(),
            unreachable: AtomicBool::new(false),
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<CallConnection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's answer to `call`; `None` when it is to be made over
    /// gRPC: declined, or the socket failed.
    fn call(&self, call: &StoreCall) -> Option<store_call_reply::Reply> {
        if self.unreachable.load(Ordering::Relaxed) {
            return None;
        }
        let popped = self.idle().pop();
        let mut connection = match popped {
            Some(connection) => connection,
            None => match CallConnection::open(&self.address, &self.token) {
                Ok(connection) => connection,
                Err(error) => {
                    tracing::debug!(store = %self.address, %error, "store calls take gRPC");
                    self.unreachable.store(true, Ordering::Relaxed);
                    return None;
                }
            },
        };
        let reply = connection.call::<StoreCallReply>(call);
        match reply {
            Ok(reply) => {
                let mut idle = self.idle();
                if idle.len() < MAX_IDLE {
                    idle.push(connection);
                }
                match reply.reply {
                    Some(store_call_reply::Reply::Declined(why)) => {
                        tracing::debug!(%why, "a same-node store call was declined; making it over gRPC");
                        None
                    }
                    answered => answered,
                }
            }
            Err(error) => {
                tracing::debug!(%error, "a same-node store call failed; making it over gRPC");
                None
            }
        }
    }
}

impl StoreClient {
    /// [`StoreClient::create`] made on this thread over the same-node
    /// socket, when the store has room at once; `None` means make it over
    /// gRPC.
    pub fn create_here(&self, id: ObjectId, size: u64, owner: &str) -> Option<ObjectWriter> {
        let create = CreateObjectRequest {
            session_id: self.session,
            object_id: id.as_bytes().to_vec(),
            size,
            owner_address: owner.to_string(),
            timeout_ms: 0,
        };
        let location = self.location(store_call::Call::Create(create))?;
        let segment = location.segment_id;
        let map = match self.written.take(segment, location.size) {
            Some(map) => map,
            None => map_writable(&proc_path(location.pid, location.fd), location.size).ok()?,
        };
        Some(ObjectWriter { id, segment, map })
    }

    /// [`StoreClient::seal`] made on this thread over the same-node socket;
    /// what is left to seal over gRPC ([`StoreClient::seal_unsealed`]) when
    /// the store declined.
    pub fn seal_here(&self, writer: ObjectWriter, written: u64) -> Result<(), Unsealed> {
        let id = writer.id;
        let unsealed = self.keep_or_unmap(writer, written);
        let seal = SealObjectRequest {
            session_id: self.session,
            object_id: id.as_bytes().to_vec(),
            size: written,
        };
        let sealed = self
            .same_node
            .as_ref()
            .and_then(|store| store.call(&wrapped(store_call::Call::Seal(seal))));
        match sealed {
            Some(store_call_reply::Reply::Sealed(_)) => Ok(()),
            _ => Err(unsealed),
        }
    }

    /// [`StoreClient::get`] made on this thread over the same-node socket,
    /// for an object in memory; `None` means make it over gRPC.
    pub fn get_here(&self, id: ObjectId) -> Option<MappedObject> {
        let get = GetStoredObjectRequest {
            session_id: self.session,
            object_id: id.as_bytes().to_vec(),
        };
        let location = self.location(store_call::Call::Get(get))?;
        let release = self.release_of(id);
        let map = map_readonly(&proc_path(location.pid, location.fd), location.size).ok()?;
        Some(MappedObject { map, _release: release })
    }

    /// [`StoreClient::delete`] made on this thread over the same-node
    /// socket; the ids come back when it is to be made over gRPC.
    pub fn delete_here(&self, object_ids: Vec<Vec<u8>>) -> Result<(), Vec<Vec<u8>>> {
        let Some(same_node) = &self.same_node else {
            return Err(object_ids);
        };
        let call = wrapped(store_call::Call::Delete(DeleteObjectsRequest { object_ids }));
        match (same_node.call(&call), call.call) {
            (Some(store_call_reply::Reply::Deleted(_)), _) => Ok(()),
            (_, Some(store_call::Call::Delete(delete))) => Err(delete.object_ids),
            _ => unreachable!("the call holds the delete"),
        }
    }

    fn location(&self, call: store_call::Call) -> Option<ObjectLocation> {
        match self.same_node.as_ref()?.call(&wrapped(call))? {
            store_call_reply::Reply::Location(location) => Some(location),
            _ => None,
        }
    }
}

/// `call` as the frame that carries it.
fn wrapped(call: store_call::Call) -> StoreCall {
    StoreCall { call: Some(call) }
}
