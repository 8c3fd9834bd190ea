//! `ObjectRef<T>`: a typed reference to a value that a task returns or `put`
//! stores. Cloning is cheap; the value is fetched with `get`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::Duration;

use raylet_proto::{ObjectId, v1};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::archived::{ArchivedRef, Checkable};
use crate::borrows::Borrows;
use crate::core_worker::CoreWorker;
use crate::memory_store::MemoryStore;
use crate::{Result, current};

/// An object's id and the address of the process that owns it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawRef {
    pub id: ObjectId,
    pub owner: Arc<str>,
}

impl RawRef {
    pub(crate) fn to_proto(&self) -> v1::ObjectRefProto {
        v1::ObjectRefProto {
            object_id: self.id.as_bytes().to_vec(),
            owner_address: self.owner.to_string(),
        }
    }

    pub(crate) fn from_proto(proto: &v1::ObjectRefProto) -> raylet_proto::Result<Self> {
        Ok(RawRef {
            id: ObjectId::from_wire(&proto.object_id)?,
            owner: proto.owner_address.as_str().into(),
        })
    }
}

/// Keeps an object alive while it exists: a handle counted by the owner's
/// table, or a borrow counted by this process and registered with the owner.
enum Handle {
    Owned { id: ObjectId, store: Weak<MemoryStore> },
    Borrowed { id: ObjectId, borrows: Weak<Borrows> },
}

impl Drop for Handle {
    fn drop(&mut self) {
        match self {
            Handle::Owned { id, store } => {
                if let Some(store) = store.upgrade() {
                    store.remove_local_ref(*id);
                }
            }
            Handle::Borrowed { id, borrows } => {
                if let Some(borrows) = borrows.upgrade() {
                    borrows.drop_handle(*id);
                }
            }
        }
    }
}

/// A reference to an object of any type.
#[derive(Clone)]
pub struct AnyObjectRef {
    raw: RawRef,
    _handle: Option<Arc<Handle>>,
}

impl AnyObjectRef {
    /// A handle to an object of this process.
    pub(crate) fn owned(raw: RawRef, store: &Arc<MemoryStore>) -> Self {
        store.add_local_ref(raw.id);
        let handle = Handle::Owned {
            id: raw.id,
            store: Arc::downgrade(store),
        };
        AnyObjectRef {
            raw,
            _handle: Some(Arc::new(handle)),
        }
    }

    /// A handle that keeps the object alive in this process, whoever owns
    /// it; `preregistered` when the sender registered us with the owner.
    pub(crate) fn adopt(raw: RawRef, core: &CoreWorker, preregistered: bool) -> Self {
        if *raw.owner == *core.address {
            return AnyObjectRef::owned(raw, &core.store);
        }
        core.borrows.take(&raw, preregistered);
        let handle = Handle::Borrowed {
            id: raw.id,
            borrows: Arc::downgrade(&core.borrows),
        };
        AnyObjectRef {
            raw,
            _handle: Some(Arc::new(handle)),
        }
    }

    /// A reference that keeps nothing alive, to fetch an object that
    /// something else holds.
    pub(crate) fn unheld(raw: RawRef) -> Self {
        AnyObjectRef { raw, _handle: None }
    }

    pub fn id(&self) -> ObjectId {
        self.raw.id
    }

    /// The address of the process that owns the object.
    pub fn owner_address(&self) -> &str {
        &self.raw.owner
    }

    pub(crate) fn raw(&self) -> &RawRef {
        &self.raw
    }

    /// Views this reference as one to a `T`. Getting it checks the type.
    pub fn typed<T>(self) -> ObjectRef<T> {
        ObjectRef {
            inner: self,
            value: PhantomData,
        }
    }
}

impl fmt::Debug for AnyObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectRef({} @ {})", self.raw.id, self.raw.owner)
    }
}

/// A typed reference to a value produced by a task or stored by `put`.
pub struct ObjectRef<T> {
    inner: AnyObjectRef,
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for ObjectRef<T> {
    fn clone(&self) -> Self {
        ObjectRef {
            inner: self.inner.clone(),
            value: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ObjectRef<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl<T> PartialEq for ObjectRef<T> {
    fn eq(&self, other: &Self) -> bool {
        self.inner.raw == other.inner.raw
    }
}

impl<T> Eq for ObjectRef<T> {}

impl<T> ObjectRef<T> {
    pub fn id(&self) -> ObjectId {
        self.inner.id()
    }

    pub fn owner_address(&self) -> &str {
        self.inner.owner_address()
    }

    /// Forgets the type, e.g. to keep references of several types together.
    pub fn untyped(self) -> AnyObjectRef {
        self.inner
    }

    pub fn as_untyped(&self) -> &AnyObjectRef {
        &self.inner
    }

    pub(crate) fn raw(&self) -> AnyObjectRef {
        self.inner.clone()
    }
}

impl<T: DeserializeOwned> ObjectRef<T> {
    /// Waits for the value and returns it, or the task's error.
    pub fn get(&self) -> Result<T> {
        current()?.get(self)
    }

    /// Like `get`, but fails with `Error::GetTimeout` after `timeout`.
    pub fn get_timeout(&self, timeout: Duration) -> Result<T> {
        current()?.get_timeout(self, timeout)
    }

    /// Waits for the value without blocking a thread, for async code.
    pub async fn get_async(&self) -> Result<T> {
        current()?.get_async(self).await
    }
}

impl<T: rkyv::Archive> ObjectRef<T>
where
    T::Archived: Checkable,
{
    /// Waits for a value stored with `put_archived` (or returned by an
    /// `archived` task) and returns a view of its rkyv archive in place:
    /// on this node, straight from shared memory, without a copy. The
    /// bytes are validated with bytecheck first.
    pub fn get_archived(&self) -> Result<ArchivedRef<T>> {
        current()?.get_archived(self)
    }
}

#[derive(Serialize, Deserialize)]
struct WireRef {
    id: [u8; 16],
    owner: String,
}

impl<T> Serialize for ObjectRef<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::value::note_serialized(&self.inner);
        let wire = WireRef {
            id: *self.inner.raw.id.as_bytes(),
            owner: self.inner.raw.owner.to_string(),
        };
        wire.serialize(serializer)
    }
}

impl<'de, T> Deserialize<'de> for ObjectRef<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireRef::deserialize(deserializer)?;
        let id = ObjectId::from_wire(&wire.id).map_err(serde::de::Error::custom)?;
        let raw = RawRef {
            id,
            owner: wire.owner.into(),
        };
        let object = match current() {
            Ok(cluster) => AnyObjectRef::adopt(raw, cluster.core(), false),
            Err(_) => AnyObjectRef::unheld(raw),
        };
        Ok(object.typed())
    }
}
