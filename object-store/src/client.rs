//! The client side of a node's store, used by drivers and workers on that
//! node: create and fill an object, seal it, and map sealed objects
//! read-only. A mapping pins its object until it is dropped. The segments
//! a client wrote stay mapped until the store tells it to forget them, so
//! that writing a new object into a reused segment costs only the copy.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memmap2::{Mmap, MmapMut};
use raylet_proto::ObjectId;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::object_store_service_client::ObjectStoreServiceClient;
use raylet_proto::v1::{
    CreateObjectRequest, DeleteObjectsRequest, GetStoreStatsRequest, GetStoredObjectRequest, ObjectLocation,
    PullObjectRequest, SealObjectRequest, StoreSessionMessage, StoreStats,
};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::UnboundedReceiverStream;

use raylet_proto::service_error::from_status;

use crate::error::{Result, StoreError};
use crate::same_node::SameNodeStore;
use crate::segment::{map_readonly, map_writable, proc_path};

/// A session with the store of this process's node.
pub struct StoreClient {
    rpc: ObjectStoreServiceClient<AuthedChannel>,
    pub(crate) session: u64,
    releases: mpsc::UnboundedSender<StoreSessionMessage>,
    /// Ends the session even while mappings are left.
    closed: Arc<Notify>,
    pub(crate) written: Arc<WrittenSegments>,
    /// The store's same-node socket, for the calls a thread makes itself.
    pub(crate) same_node: Option<SameNodeStore>,
}

/// The segments this client wrote and still maps writable, by number,
/// until the store hands them to another session or drops them.
#[derive(Default)]
pub(crate) struct WrittenSegments(Mutex<HashMap<u64, MmapMut>>);

impl WrittenSegments {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, MmapMut>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mapping of `segment` if this client still has it, `size` long.
    pub(crate) fn take(&self, segment: u64, size: u64) -> Option<MmapMut> {
        self.lock().remove(&segment).filter(|map| map.len() as u64 == size)
    }

    fn forget(&self, segments: &[u64]) {
        let mut written = self.lock();
        for segment in segments {
            written.remove(segment);
        }
    }
}

impl StoreClient {
    /// Opens a session for the process at `owner_address`, which makes the
    /// calls it can through `same_node`. Fails when the store is on another
    /// machine, whose memory this process cannot map.
    pub async fn connect(
        channel: AuthedChannel,
        owner_address: &str,
        same_node: Option<SameNodeStore>,
    ) -> Result<Arc<StoreClient>> {
        let mut rpc = ObjectStoreServiceClient::new(channel);
        let (releases, outbound) = mpsc::unbounded_channel();
        let first = StoreSessionMessage {
            release: Vec::new(),
            owner_address: owner_address.to_string(),
        };
        let _ = releases.send(first);
        let closed = Arc::new(Notify::new());
        let session_stream = forward_until_closed(outbound, closed.clone());
        let reply = rpc.session(UnboundedReceiverStream::new(session_stream)).await;
        let mut inbound = reply.map_err(from_status::<StoreError>)?.into_inner();
        let opened = inbound
            .message()
            .await
            .map_err(from_status::<StoreError>)?
            .ok_or_else(|| StoreError::Invalid("the store ended the session at once".into()))?;
        check_same_machine(opened.identity_location.unwrap_or_default(), &opened.identity)?;
        let written = Arc::new(WrittenSegments::default());
        let forgetting = written.clone();
        tokio::spawn(async move {
            while let Ok(Some(event)) = inbound.message().await {
                forgetting.forget(&event.forget_segments);
            }
        });
        Ok(Arc::new(StoreClient {
            rpc,
            session: opened.session_id,
            releases,
            closed,
            written,
            same_node,
        }))
    }

    /// Ends the session: the store releases its pins and frees the objects
    /// this process owns. A server shuts down only once its sessions end.
    pub fn close(&self) {
        self.closed.notify_one();
    }

    /// Reserves `size` bytes for a new object, waiting up to `timeout` for
    /// room, and maps them for writing, unless this client still maps the
    /// segment that the store hands it.
    pub async fn create(&self, id: ObjectId, size: u64, owner: &str, timeout: Duration) -> Result<ObjectWriter> {
        let request = CreateObjectRequest {
            session_id: self.session,
            object_id: id.as_bytes().to_vec(),
            size,
            owner_address: owner.to_string(),
            timeout_ms: timeout.as_millis() as u64,
        };
        let location = self
            .rpc
            .clone()
            .create_object(request)
            .await
            .map_err(from_status::<StoreError>)?;
        let location = location.into_inner();
        let segment = location.segment_id;
        let map = match self.written.take(segment, location.size) {
            Some(map) => map,
            None => map_writable(&proc_path(location.pid, location.fd), location.size)
                .map_err(StoreError::io(format!("mapping new object {id}")))?,
        };
        Ok(ObjectWriter { id, segment, map })
    }

    /// Seals a written object at the first `written` bytes.
    pub async fn seal(&self, writer: ObjectWriter, written: u64) -> Result<()> {
        self.seal_unsealed(self.keep_or_unmap(writer, written)).await
    }

    /// The writer's mapping kept when the segment was written whole, from
    /// before the store may tell this client to forget it; one that the
    /// seal shrinks is unmapped first.
    pub(crate) fn keep_or_unmap(&self, writer: ObjectWriter, written: u64) -> Unsealed {
        let ObjectWriter { id, segment, map } = writer;
        if map.len() as u64 == written {
            self.written.lock().insert(segment, map);
        }
        Unsealed { id, segment, written }
    }

    /// Seals what [`Self::keep_or_unmap`] left, over gRPC.
    pub async fn seal_unsealed(&self, unsealed: Unsealed) -> Result<()> {
        let Unsealed { id, segment, written } = unsealed;
        let request = SealObjectRequest {
            session_id: self.session,
            object_id: id.as_bytes().to_vec(),
            size: written,
        };
        let sealed = self.rpc.clone().seal_object(request).await;
        if sealed.is_err() {
            self.written.forget(&[segment]);
        }
        sealed.map_err(from_status::<StoreError>)?;
        Ok(())
    }

    /// Maps a sealed object read-only; it stays pinned while mapped.
    pub async fn get(&self, id: ObjectId) -> Result<MappedObject> {
        let request = GetStoredObjectRequest {
            session_id: self.session,
            object_id: id.as_bytes().to_vec(),
        };
        let location = self
            .rpc
            .clone()
            .get_object(request)
            .await
            .map_err(from_status::<StoreError>)?;
        let location = location.into_inner();
        let mapped = map_readonly(&proc_path(location.pid, location.fd), location.size);
        let release = self.release_of(id);
        let map = mapped.map_err(StoreError::io(format!("mapping object {id}")))?;
        Ok(MappedObject { map, _release: release })
    }

    /// What tells the store, once dropped, that this client's mapping of
    /// `id` is gone.
    pub(crate) fn release_of(&self, id: ObjectId) -> Release {
        Release {
            id,
            releases: self.releases.clone(),
        }
    }

    /// Has this node's store fetch an object of `size` bytes from the
    /// stores of the node managers at `sources`, waiting up to `timeout` for
    /// room; returns once it is sealed here, for [`Self::get`] to map.
    pub async fn pull(
        &self,
        id: ObjectId,
        size: u64,
        owner: &str,
        sources: &[String],
        timeout: Duration,
    ) -> Result<()> {
        let request = PullObjectRequest {
            object_id: id.as_bytes().to_vec(),
            size,
            owner_address: owner.to_string(),
            sources: sources.to_vec(),
            timeout_ms: timeout.as_millis() as u64,
        };
        self.rpc
            .clone()
            .pull_object(request)
            .await
            .map_err(from_status::<StoreError>)?;
        Ok(())
    }

    pub async fn delete(&self, ids: &[ObjectId]) -> Result<()> {
        let request = DeleteObjectsRequest {
            object_ids: ids.iter().map(|id| id.as_bytes().to_vec()).collect(),
        };
        self.rpc
            .clone()
            .delete_objects(request)
            .await
            .map_err(from_status::<StoreError>)?;
        Ok(())
    }

    pub async fn stats(&self) -> Result<StoreStats> {
        let reply = self.rpc.clone().get_store_stats(GetStoreStatsRequest {}).await;
        Ok(reply.map_err(from_status::<StoreError>)?.into_inner())
    }
}

/// The session's outgoing messages, until `closed` is notified.
fn forward_until_closed(
    mut messages: mpsc::UnboundedReceiver<StoreSessionMessage>,
    closed: Arc<Notify>,
) -> mpsc::UnboundedReceiver<StoreSessionMessage> {
    let (forward, forwarded) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                message = messages.recv() => message,
                _ = closed.notified() => None,
            };
            let Some(message) = message else {
                return;
            };
            if forward.send(message).is_err() {
                return;
            }
        }
    });
    forwarded
}

fn check_same_machine(location: ObjectLocation, expected: &[u8]) -> Result<()> {
    let path = proc_path(location.pid, location.fd);
    match map_readonly(&path, location.size) {
        Ok(identity) if identity[..] == *expected => Ok(()),
        _ => Err(StoreError::Invalid(
            "the object store is on another machine: a driver must connect to a node manager on its own machine".into(),
        )),
    }
}

/// A new object's memory, mapped writable until it is sealed.
pub struct ObjectWriter {
    pub(crate) id: ObjectId,
    pub(crate) segment: u64,
    pub(crate) map: MmapMut,
}

impl ObjectWriter {
    pub fn id(&self) -> ObjectId {
        self.id
    }
}

impl Deref for ObjectWriter {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl DerefMut for ObjectWriter {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }
}

/// An object written and not sealed yet, its writer's mapping kept or gone.
pub struct Unsealed {
    id: ObjectId,
    segment: u64,
    written: u64,
}

/// A sealed object mapped read-only, page-aligned and immutable.
pub struct MappedObject {
    pub(crate) map: Mmap,
    pub(crate) _release: Release,
}

impl AsRef<[u8]> for MappedObject {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Deref for MappedObject {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

/// Tells the store that a mapping is gone, so the object may be spilled.
pub(crate) struct Release {
    id: ObjectId,
    releases: mpsc::UnboundedSender<StoreSessionMessage>,
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.releases.send(StoreSessionMessage {
            release: vec![self.id.as_bytes().to_vec()],
            owner_address: String::new(),
        });
    }
}
