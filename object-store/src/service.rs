//! The store's gRPC service. Calls that may spill or restore run on a
//! blocking thread; a create that finds no room waits for frees up to its
//! timeout (backpressure), then fails with `ObjectStoreFull`. Objects move
//! between nodes' stores through [`crate::transfer`].

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::ObjectId;
use raylet_proto::peer_stream::{PeerSender, peer_of, peer_stream};
use raylet_proto::v1::object_store_service_server::ObjectStoreService;
use raylet_proto::v1::{
    CreateObjectRequest, DeleteObjectsReply, DeleteObjectsRequest, GetStoreStatsRequest, GetStoredObjectRequest,
    ObjectChunk, ObjectLocation, PullObjectReply, PullObjectRequest, ReadChunksRequest, SealObjectReply,
    SealObjectRequest, StoreSessionEvent, StoreSessionMessage, StoreStats, StoredObject, TransferTicket,
};
use tokio::sync::Notify;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::error::{Result, StoreError};
use crate::segment::Segment;
use crate::store::{ForgetSegment, Location, ObjectStore, StoreConfig, StoreUsage};
use crate::transfer::{ChunkRange, Pull, Transfers};

/// The longest a create waits for room.
const MAX_CREATE_WAIT: Duration = Duration::from_secs(600);
/// A waiting create looks again this often even without a wake-up.
const RECHECK: Duration = Duration::from_millis(200);

/// A node's store, shared by its service and its node manager.
pub struct SharedStore {
    store: Mutex<ObjectStore>,
    /// Signalled whenever memory or disk may have been freed.
    pub(crate) freed: Notify,
    identity: Segment,
    identity_bytes: [u8; 16],
    /// The session that objects pulled from peers are written under.
    pub(crate) pull_session: u64,
    pub(crate) transfers: Transfers,
    /// Bytes sent to peers through `ReadChunks`.
    pub(crate) served: AtomicU64,
    /// Bytes received from peers by pulls.
    pub(crate) pulled: AtomicU64,
}

impl SharedStore {
    /// A store with `config`; `token` authenticates it to the stores of
    /// other nodes that it pulls objects from.
    pub fn new(config: StoreConfig, token: AuthToken) -> Result<Arc<Self>> {
        let identity_bytes: [u8; 16] = rand_bytes();
        let identity = Segment::sealed_with("raylet-store-identity", &identity_bytes)
            .map_err(StoreError::io("creating the store identity"))?;
        let mut store = ObjectStore::new(config);
        let pull_session = store.open_session("", None);
        Ok(Arc::new(SharedStore {
            store: Mutex::new(store),
            freed: Notify::new(),
            identity,
            identity_bytes,
            pull_session,
            transfers: Transfers::new(token),
            served: AtomicU64::new(0),
            pulled: AtomicU64::new(0),
        }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ObjectStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store when nobody holds it, as an async caller may take it: a
    /// holder may be spilling or restoring, which takes long.
    pub(crate) fn lock_if_free(&self) -> Option<MutexGuard<'_, ObjectStore>> {
        match self.store.try_lock() {
            Ok(store) => Some(store),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    pub fn usage(&self) -> StoreUsage {
        let mut usage = self.lock().usage();
        usage.served = self.served.load(Ordering::Relaxed);
        usage.pulled = self.pulled.load(Ordering::Relaxed);
        usage
    }

    /// Frees objects and wakes creates that wait for room.
    pub fn delete(&self, ids: &[ObjectId]) {
        self.lock().delete(ids);
        self.freed.notify_waiters();
    }

    /// Frees the objects that `owner` owns, once it is gone; returns how many.
    pub(crate) fn delete_owned_by(&self, owner: &str) -> usize {
        let count = self.lock().delete_owned_by(owner);
        self.freed.notify_waiters();
        count
    }

    /// Reserves room for a new object written under `session`, waiting up
    /// to `wait` for frees when the store is full. A create runs on a
    /// blocking thread only when it has to spill, or the store is busy.
    pub(crate) async fn create(
        self: &Arc<Self>,
        session: u64,
        id: ObjectId,
        size: u64,
        owner: &str,
        wait: Duration,
    ) -> Result<Location> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_CREATE_WAIT);
        if let Some(mut store) = self.lock_if_free()
            && let Some(location) = store.create_in_memory(session, id, size, owner)?
        {
            return Ok(location);
        }
        let owner: Arc<str> = owner.into();
        loop {
            let freed = self.freed.notified();
            let store = self.clone();
            let owner = owner.clone();
            let attempt = tokio::task::spawn_blocking(move || store.lock().create(session, id, size, &owner));
            match join(attempt).await {
                Err(StoreError::Full(message)) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(object = %id, %message, "waiting for room");
                    let _ = tokio::time::timeout(RECHECK, freed).await;
                }
                other => return other,
            }
        }
    }

    /// Pins an object for `session`, on a blocking thread only when it has
    /// to be restored from disk, or the store is busy.
    async fn get(self: &Arc<Self>, session: u64, id: ObjectId) -> Result<Location> {
        if let Some(mut store) = self.lock_if_free()
            && let Some(location) = store.get_in_memory(session, id)?
        {
            return Ok(location);
        }
        let store = self.clone();
        join(tokio::task::spawn_blocking(move || store.lock().get(session, id))).await
    }

    fn close_session(&self, session: u64) {
        self.lock().close_session(session);
        self.freed.notify_waiters();
    }
}

pub(crate) async fn join<T>(task: tokio::task::JoinHandle<Result<T>>) -> Result<T> {
    task.await
        .map_err(|e| StoreError::Invalid(format!("a store call failed: {e}")))?
}

fn rand_bytes() -> [u8; 16] {
    *raylet_proto::ObjectId::random().as_bytes()
}

pub(crate) fn location_to_proto(location: Location) -> ObjectLocation {
    ObjectLocation {
        pid: location.pid,
        fd: location.fd,
        size: location.size,
        segment_id: location.segment,
    }
}

/// Tells a session's client, through its event stream, to unmap a segment.
fn forget_segment(events: PeerSender<StoreSessionEvent>) -> ForgetSegment {
    Box::new(move |segment| {
        let _ = events.send(Ok(StoreSessionEvent {
            forget_segments: vec![segment],
            ..StoreSessionEvent::default()
        }));
    })
}

/// Serves [`ObjectStoreService`] from a node's store.
pub struct ObjectStoreServiceImpl {
    pub store: Arc<SharedStore>,
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl ObjectStoreService for ObjectStoreServiceImpl {
    type SessionStream = EventStream<StoreSessionEvent>;
    type ReadChunksStream = EventStream<ObjectChunk>;

    async fn session(
        &self,
        request: Request<Streaming<StoreSessionMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (events, receiver) = peer_stream("store session events", peer_of(&request));
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("a store session must start with the owner's address"))?;
        let forget = forget_segment(events.clone());
        let session = self.store.lock().open_session(&first.owner_address, Some(forget));
        let identity = &self.store.identity;
        let _ = events.send(Ok(StoreSessionEvent {
            session_id: session,
            identity_location: Some(ObjectLocation {
                pid: std::process::id(),
                fd: identity.raw_fd(),
                size: identity.size(),
                segment_id: identity.id(),
            }),
            identity: self.store.identity_bytes.to_vec(),
            forget_segments: Vec::new(),
        }));
        let store = self.store.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let mut locked = store.lock();
                for id in message.release.iter().filter_map(|id| ObjectId::from_wire(id).ok()) {
                    locked.release(session, id);
                }
                drop(locked);
                store.freed.notify_waiters();
            }
            store.close_session(session);
            drop(events);
        });
        Ok(Response::new(Box::pin(receiver)))
    }

    async fn create_object(&self, request: Request<CreateObjectRequest>) -> Result<Response<ObjectLocation>, Status> {
        let request = request.into_inner();
        let id = ObjectId::from_wire(&request.object_id)?;
        let wait = Duration::from_millis(request.timeout_ms);
        let location = self
            .store
            .create(request.session_id, id, request.size, &request.owner_address, wait)
            .await?;
        Ok(Response::new(location_to_proto(location)))
    }

    async fn seal_object(&self, request: Request<SealObjectRequest>) -> Result<Response<SealObjectReply>, Status> {
        let request = request.into_inner();
        let id = ObjectId::from_wire(&request.object_id)?;
        self.store.lock().seal(request.session_id, id, request.size)?;
        Ok(Response::new(SealObjectReply {}))
    }

    async fn get_object(&self, request: Request<GetStoredObjectRequest>) -> Result<Response<ObjectLocation>, Status> {
        let request = request.into_inner();
        let id = ObjectId::from_wire(&request.object_id)?;
        let location = self.store.get(request.session_id, id).await?;
        Ok(Response::new(location_to_proto(location)))
    }

    async fn delete_objects(
        &self,
        request: Request<DeleteObjectsRequest>,
    ) -> Result<Response<DeleteObjectsReply>, Status> {
        let ids = request
            .into_inner()
            .object_ids
            .iter()
            .map(|id| ObjectId::from_wire(id))
            .collect::<raylet_proto::Result<Vec<_>>>()?;
        self.store.delete(&ids);
        Ok(Response::new(DeleteObjectsReply {}))
    }

    async fn get_store_stats(&self, _request: Request<GetStoreStatsRequest>) -> Result<Response<StoreStats>, Status> {
        Ok(Response::new(usage_to_proto(self.store.usage())))
    }

    async fn read_chunks(
        &self,
        request: Request<ReadChunksRequest>,
    ) -> Result<Response<Self::ReadChunksStream>, Status> {
        let range = ChunkRange::from_proto(request.into_inner())?;
        let chunks = self.store.read(range).await?;
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks).map(Ok))))
    }

    async fn open_transfer(&self, request: Request<ReadChunksRequest>) -> Result<Response<TransferTicket>, Status> {
        let range = ChunkRange::from_proto(request.into_inner())?;
        match self.store.open_transfer(range).await? {
            Some(ticket) => Ok(Response::new(ticket)),
            None => Err(Status::unimplemented(
                "this store serves no transfer port; read through ReadChunks",
            )),
        }
    }

    async fn pull_object(&self, request: Request<PullObjectRequest>) -> Result<Response<PullObjectReply>, Status> {
        let pull = Pull::from_proto(request.into_inner())?;
        self.store.pull(pull).await?;
        Ok(Response::new(PullObjectReply {}))
    }
}

fn usage_to_proto(usage: StoreUsage) -> StoreStats {
    StoreStats {
        capacity_bytes: usage.capacity,
        used_bytes: usage.used,
        spilled_bytes: usage.spilled,
        spill_limit_bytes: usage.spill_limit,
        objects: usage
            .objects
            .into_iter()
            .map(|object| StoredObject {
                object_id: object.id.as_bytes().to_vec(),
                size: object.size,
                owner_address: object.owner,
                spilled: object.spilled,
                sealed: object.sealed,
                pins: object.pins,
            })
            .collect(),
        served_bytes: usage.served,
        pulled_bytes: usage.pulled,
    }
}
