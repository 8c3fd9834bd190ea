//! Large values and the node's shared-memory store: writing them in place,
//! mapping stored values to read them (zero-copy for archives), and
//! deleting the stored copies of freed objects in batches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use raylet_object_store::{MappedObject, ObjectWriter, SameNodeStore, StoreClient, StoreError};
use raylet_proto::ObjectId;
use raylet_proto::v1::object_store_service_client::ObjectStoreServiceClient;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;
use raylet_proto::v1::{AddCopiesRequest, DeleteObjectsRequest, ObjectCopy};
use serde::de::DeserializeOwned;
use tokio::sync::{OnceCell, mpsc, oneshot};

use crate::context::Context;
use crate::objects::archived::{ArchivedRef, Checkable};
use crate::objects::memory_store::FreedObject;
use crate::objects::object_ref::handle::RawRef;
use crate::objects::owner::Owner;
use crate::shared_bytes::viewing;
use crate::submitter::{NotRebuilt, SubmitterEvent, SubmitterHandle};
use crate::value::{Body, Expected, Format, Outcome, StoredAt};
use crate::{Error, Result};

/// How long a node that stored an object gets to answer before the object
/// counts as lost with it.
const NODE_PATIENCE: Duration = Duration::from_secs(1);

/// This process's side of its node's shared-memory store: what writing,
/// reading and deleting stored values takes.
pub(crate) struct SharedObjects {
    /// The objects this process owns and borrows, with its context.
    owner: Arc<Owner>,
    /// The session with this node's store, opened on first use.
    session: OnceCell<Arc<StoreClient>>,
    /// How long a write waits for room in a full store.
    store_full_timeout: Duration,
    /// Lost objects are rebuilt, and freed ones forgotten, through it.
    submitter: SubmitterHandle,
}

impl SharedObjects {
    pub(crate) fn new(owner: Arc<Owner>, store_full_timeout: Duration, submitter: SubmitterHandle) -> Self {
        SharedObjects {
            owner,
            session: OnceCell::new(),
            store_full_timeout,
            submitter,
        }
    }

    fn ctx(&self) -> &Arc<Context> {
        &self.owner.ctx
    }

    /// Ends the session with the node's store, if one was opened.
    pub(crate) fn close(&self) {
        if let Some(store) = self.session.get() {
            store.close();
        }
    }

    /// This process's session with its node's store.
    async fn node_store(&self) -> Result<Arc<StoreClient>> {
        let client = self
            .session
            .get_or_try_init(|| async {
                let ctx = self.ctx();
                let channel = ctx.channel(&ctx.node_manager).await?;
                let same_node = SameNodeStore::new(&ctx.node_manager, ctx.token.clone());
                StoreClient::connect(channel, &ctx.address, Some(same_node))
                    .await
                    .map_err(store_error)
            })
            .await?;
        Ok(client.clone())
    }

    /// Writes a new object of `size` bytes into this node's store: `fill`
    /// writes it in place on this thread and says how many bytes it used.
    /// Blocks while the store makes room, up to the store-full timeout.
    /// Once this process has a session with the store, a create and seal
    /// that need nothing of the disk are made on this thread, through the
    /// store's same-node socket.
    pub(crate) fn write_object(
        self: &Arc<Self>,
        id: ObjectId,
        size: usize,
        owner: Arc<str>,
        fill: impl FnOnce(&mut [u8]) -> Result<usize>,
    ) -> Result<StoredAt> {
        if let Some(store) = self.session.get()
            && let Some(mut writer) = store.create_here(id, size as u64, &owner)
        {
            let written = fill(&mut writer);
            return self.seal_here(store.clone(), writer, written);
        }
        let objects = self.clone();
        let mut writer = self
            .ctx()
            .block_on(async move { objects.create_object(id, size, &owner).await })?;
        let written = fill(&mut writer);
        let objects = self.clone();
        self.ctx()
            .block_on(async move { objects.seal_object(writer, written).await })
    }

    /// [`SharedObjects::write_object`] for async callers.
    pub(crate) async fn write_object_async(
        self: &Arc<Self>,
        id: ObjectId,
        size: usize,
        owner: Arc<str>,
        fill: impl FnOnce(&mut [u8]) -> Result<usize>,
    ) -> Result<StoredAt> {
        let objects = self.clone();
        let created = self
            .ctx()
            .runtime
            .spawn(async move { objects.create_object(id, size, &owner).await });
        let mut writer = created.await.map_err(internal)??;
        let written = fill(&mut writer);
        let objects = self.clone();
        let sealed = self
            .ctx()
            .runtime
            .spawn(async move { objects.seal_object(writer, written).await });
        sealed.await.map_err(internal)?
    }

    async fn create_object(&self, id: ObjectId, size: usize, owner: &str) -> Result<ObjectWriter> {
        let store = self.node_store().await?;
        let created = store.create(id, size as u64, owner, self.store_full_timeout).await;
        match created {
            Err(StoreError::AlreadyExists(_)) => {
                store.delete(&[id]).await.map_err(store_error)?;
                store.create(id, size as u64, owner, self.store_full_timeout).await
            }
            other => other,
        }
        .map_err(store_error)
    }

    /// Seals what `fill` wrote on this thread through the same-node socket,
    /// else over gRPC; deletes the object when `fill` failed.
    fn seal_here(&self, store: Arc<StoreClient>, writer: ObjectWriter, written: Result<usize>) -> Result<StoredAt> {
        let stored = |written: usize| StoredAt::new(&self.ctx().node_manager, written as u64);
        let Ok(written) = written else {
            let id = writer.id();
            drop(writer);
            self.ctx()
                .block_on(async move { store.delete(&[id]).await.map_err(store_error) })?;
            return written.map(stored);
        };
        match store.seal_here(writer, written as u64) {
            Ok(()) => Ok(stored(written)),
            Err(unsealed) => {
                let sealed = self
                    .ctx()
                    .block_on(async move { store.seal_unsealed(unsealed).await.map_err(store_error) });
                sealed.map(|()| stored(written))
            }
        }
    }

    /// Seals what `fill` wrote, or deletes the object when it failed.
    async fn seal_object(&self, writer: ObjectWriter, written: Result<usize>) -> Result<StoredAt> {
        let store = self.node_store().await?;
        let id = writer.id();
        let written = match written {
            Ok(written) => written,
            Err(error) => {
                drop(writer);
                let _ = store.delete(&[id]).await;
                return Err(error);
            }
        };
        store.seal(writer, written as u64).await.map_err(store_error)?;
        Ok(StoredAt::new(&self.ctx().node_manager, written as u64))
    }

    /// Maps a stored object read-only; it stays pinned while mapped. An
    /// object in other nodes' stores is pulled into this node's store first,
    /// from every node that holds it. When none of them has it any more or
    /// answers, the object is lost.
    pub(crate) async fn map_object(&self, object: &RawRef, at: &StoredAt) -> Result<MappedObject> {
        let id = object.id;
        let store = self.node_store().await.map_err(|e| lost_with_node(id, at, e))?;
        if !at.holders().any(|holder| **holder == *self.ctx().node_manager) {
            self.pull(&store, object, at).await?;
        }
        match store.get(id).await {
            Ok(mapped) => Ok(mapped),
            Err(StoreError::NotFound(_)) => Err(Error::ObjectLost {
                object: id,
                reason: format!("the object store of node {} no longer has it", self.ctx().node_manager),
            }),
            Err(error) => {
                match raylet_proto::channel::connect(&self.ctx().node_manager, &self.ctx().token, NODE_PATIENCE).await {
                    Err(unreachable) => Err(lost_with_node(id, at, unreachable)),
                    Ok(_) => Err(store_error(error)),
                }
            }
        }
    }

    /// Maps an object in this node's store on this thread, through the
    /// store's same-node socket; `None` means take [`Self::map_object`].
    fn map_here(&self, id: ObjectId, at: &StoredAt) -> Option<MappedObject> {
        let store = self.session.get()?;
        let here = at.holders().any(|holder| **holder == *self.ctx().node_manager);
        here.then(|| store.get_here(id))?
    }

    /// Deletes objects from this node's store through its same-node socket,
    /// on a blocking thread; the ids come back when `node` is another node
    /// or the store declined, for gRPC.
    async fn delete_here(&self, node: &str, object_ids: Vec<Vec<u8>>) -> Option<Vec<Vec<u8>>> {
        let Some(store) = self.session.get().filter(|_| node == self.ctx().node_manager) else {
            return Some(object_ids);
        };
        let store = store.clone();
        match tokio::task::spawn_blocking(move || store.delete_here(object_ids)).await {
            Ok(deleted) => deleted.err(),
            Err(error) => {
                tracing::warn!(%error, "freed objects stay in the store: their delete was lost with its thread");
                None
            }
        }
    }

    /// Copies an object from the nodes that hold it into this node's store,
    /// and tells its owner about the new copy.
    async fn pull(&self, store: &StoreClient, object: &RawRef, at: &StoredAt) -> Result<()> {
        let sources: Vec<String> = at.holders().map(|holder| holder.to_string()).collect();
        let pulled = store
            .pull(object.id, at.size, &object.owner, &sources, self.store_full_timeout)
            .await;
        match pulled {
            Ok(()) => {}
            Err(full @ (StoreError::Full(_) | StoreError::TooLarge(_))) => {
                return Err(Error::ObjectStoreFull(full.to_string()));
            }
            Err(failed) => return Err(lost_with_node(object.id, at, pull_failure(failed))),
        }
        self.record_copy(object).await;
        Ok(())
    }

    async fn record_copy(&self, object: &RawRef) {
        if *object.owner == *self.ctx().address {
            self.owner.store.add_copy(object.id, &self.ctx().node_manager);
            return;
        }
        let request = AddCopiesRequest {
            copies: vec![ObjectCopy {
                object_id: object.id.as_bytes().to_vec(),
                node_address: self.ctx().node_manager.clone(),
            }],
        };
        let sent = async {
            let channel = self.ctx().channel(&object.owner).await?;
            OwnerServiceClient::new(channel)
                .add_copies(request)
                .await
                .map_err(raylet_proto::Error::from)?;
            Ok::<_, Error>(())
        };
        if let Err(error) = sent.await {
            tracing::debug!(object = %object.id, %error, "cannot tell the owner about a copy");
        }
    }

    /// The bytes of a finished object's value, checked against what the
    /// reader expects. A stored value lost with its node is rebuilt when
    /// this process owns it: its task runs again and this waits for it.
    async fn value_bytes(&self, object: &RawRef, mut outcome: Outcome, expected: Expected) -> Result<ValueBytes> {
        let id = object.id;
        loop {
            let value = outcome?;
            value.check(id, expected)?;
            let at = match &value.body {
                Body::Inline(data) => return Ok(ValueBytes::Inline(data.clone())),
                Body::Stored(at) => at,
            };
            match self.map_object(object, at).await {
                Err(Error::ObjectLost { reason, .. }) if self.owner.store.try_get(id).is_ok() => {
                    outcome = self.rebuild(id, reason).await?;
                }
                mapped => return mapped.map(ValueBytes::Mapped),
            }
        }
    }

    fn value_bytes_blocking(
        self: &Arc<Self>,
        object: &RawRef,
        outcome: Outcome,
        expected: Expected,
    ) -> Result<ValueBytes> {
        if let Ok(value) = &outcome {
            match &value.body {
                Body::Inline(data) => {
                    value.check(object.id, expected)?;
                    return Ok(ValueBytes::Inline(data.clone()));
                }
                Body::Stored(at) => {
                    value.check(object.id, expected)?;
                    if let Some(mapped) = self.map_here(object.id, at) {
                        return Ok(ValueBytes::Mapped(mapped));
                    }
                }
            }
        }
        let (objects, object) = (self.clone(), object.clone());
        self.ctx()
            .block_on(async move { objects.value_bytes(&object, outcome, expected).await })
    }

    /// Asks the submitter to run the task that made a lost object again,
    /// then waits for its new outcome.
    async fn rebuild(&self, id: ObjectId, lost: String) -> Result<Outcome> {
        let (done, rebuilt) = oneshot::channel();
        let request = SubmitterEvent::Reconstruct { object: id, done };
        let unrecoverable = |why: NotRebuilt| Error::ObjectLost {
            object: id,
            reason: format!("{lost}, and {why}"),
        };
        self.submitter
            .send(request)
            .map_err(|_| unrecoverable(NotRebuilt::ShuttingDown))?;
        match rebuilt.await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => return Err(unrecoverable(why)),
            Err(_) => return Err(unrecoverable(NotRebuilt::ShuttingDown)),
        }
        tracing::info!(object = %id, %lost, "rebuilding a lost object by running its task again");
        Ok(self
            .owner
            .store
            .wait(id, None)
            .await?
            .expect("waiting without a deadline"))
    }

    /// The value of a finished object as a `T`, blocking this thread.
    pub(crate) fn decode_blocking<T: DeserializeOwned>(
        self: &Arc<Self>,
        object: &RawRef,
        outcome: Outcome,
    ) -> Result<T> {
        let bytes = self.value_bytes_blocking(object, outcome, Expected::of::<T>(Format::Postcard))?;
        let decoded = bytes.decode()?;
        if !self.owner.borrows.is_settled() {
            let borrows = self.owner.borrows.clone();
            self.ctx().block_on(async move { borrows.settled().await });
        }
        Ok(decoded)
    }

    /// The value of a finished object as a `T`, for async callers.
    pub(crate) async fn decode_async<T: DeserializeOwned>(&self, object: &RawRef, outcome: Outcome) -> Result<T> {
        let bytes = self
            .value_bytes(object, outcome, Expected::of::<T>(Format::Postcard))
            .await?;
        let decoded = bytes.decode()?;
        self.owner.borrows.settled().await;
        Ok(decoded)
    }

    /// A validated view of a finished object's archive.
    pub(crate) fn archived_blocking<T: rkyv::Archive>(
        self: &Arc<Self>,
        object: &RawRef,
        outcome: Outcome,
    ) -> Result<ArchivedRef<T>>
    where
        T::Archived: Checkable,
    {
        match self.value_bytes_blocking(object, outcome, Expected::of::<T>(Format::Archive))? {
            ValueBytes::Inline(data) => ArchivedRef::copied(&data),
            ValueBytes::Mapped(mapped) => ArchivedRef::mapped(mapped),
        }
    }
}

/// A value's bytes: inline, or mapped from the node's store.
enum ValueBytes {
    Inline(Bytes),
    Mapped(MappedObject),
}

impl ValueBytes {
    /// The value as a `T`; the [`crate::SharedBytes`] in it view these bytes.
    fn decode<T: DeserializeOwned>(self) -> Result<T> {
        let source = match self {
            ValueBytes::Inline(data) => data,
            ValueBytes::Mapped(mapped) => Bytes::from_owner(mapped),
        };
        Ok(viewing(&source, raylet_common::codec::decode)?)
    }
}

/// Deletes the stored copies of freed objects: whatever queued up meanwhile
/// goes in one call per node.
pub(crate) async fn delete_freed(objects: Arc<SharedObjects>, mut freed: mpsc::UnboundedReceiver<FreedObject>) {
    while let Some(first) = freed.recv().await {
        let mut by_node: HashMap<Arc<str>, Vec<Vec<u8>>> = HashMap::new();
        let mut ids = Vec::new();
        let mut add = |(id, at): FreedObject| {
            for holder in at.holders() {
                by_node.entry(holder.clone()).or_default().push(id.as_bytes().to_vec());
            }
            ids.push(id);
        };
        add(first);
        while let Ok(next) = freed.try_recv() {
            add(next);
        }
        let _ = objects.submitter.send(SubmitterEvent::ForgetLineage(ids));
        for (node, object_ids) in by_node {
            let Some(object_ids) = objects.delete_here(&node, object_ids).await else {
                continue;
            };
            match delete_on(objects.ctx(), &node, object_ids).await {
                Ok(()) => {}
                Err(Error::Cluster(raylet_proto::Error::Unavailable(error))) => {
                    tracing::debug!(%node, %error, "a node is gone, and its store with it");
                }
                Err(error) => tracing::warn!(%node, %error, "cannot delete freed objects from a node's store"),
            }
        }
    }
}

async fn delete_on(ctx: &Context, node: &str, object_ids: Vec<Vec<u8>>) -> Result<()> {
    let channel = ctx.channel(node).await?;
    ObjectStoreServiceClient::new(channel)
        .delete_objects(DeleteObjectsRequest { object_ids })
        .await
        .map_err(raylet_proto::Error::from)?;
    Ok(())
}

/// The node that stored the object does not answer: the object is lost.
fn lost_with_node(id: ObjectId, at: &StoredAt, error: impl std::fmt::Display) -> Error {
    Error::ObjectLost {
        object: id,
        reason: format!("the node {} that stored it is unreachable ({error})", at.node),
    }
}

/// A store error as the user sees it: a full store is `ObjectStoreFull`.
pub(crate) fn store_error(error: StoreError) -> Error {
    match error {
        StoreError::Full(_) | StoreError::TooLarge(_) => Error::ObjectStoreFull(error.to_string()),
        other => Error::Cluster(other.into()),
    }
}

/// Why a pull failed, without the kind prefix of a control-plane error.
fn pull_failure(error: StoreError) -> String {
    match error {
        StoreError::Rpc(error) => error.message().to_string(),
        other => other.to_string(),
    }
}

fn internal(error: tokio::task::JoinError) -> Error {
    Error::Cluster(raylet_proto::Error::Internal(format!("a store call failed: {error}")))
}
