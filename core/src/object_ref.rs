//! `ObjectRef<T>`: a typed reference to a value that a task returns or `put`
//! stores. Cloning is cheap; the value is fetched with `get`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::Duration;

use raylet_proto::ObjectId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::memory_store::MemoryStore;
use crate::{Result, current};

/// An object's id and the address of the process that owns it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawRef {
    pub id: ObjectId,
    pub owner: Arc<str>,
}

/// Keeps an owned object alive while a local handle to it exists.
struct LocalHandle {
    id: ObjectId,
    store: Weak<MemoryStore>,
}

impl Drop for LocalHandle {
    fn drop(&mut self) {
        if let Some(store) = self.store.upgrade() {
            store.release(self.id);
        }
    }
}

/// A reference to an object of any type.
#[derive(Clone)]
pub struct AnyObjectRef {
    raw: RawRef,
    handle: Option<Arc<LocalHandle>>,
}

impl AnyObjectRef {
    pub(crate) fn owned(raw: RawRef, store: &Arc<MemoryStore>) -> Self {
        let handle = LocalHandle {
            id: raw.id,
            store: Arc::downgrade(store),
        };
        AnyObjectRef {
            raw,
            handle: Some(Arc::new(handle)),
        }
    }

    pub(crate) fn borrowed(raw: RawRef) -> Self {
        AnyObjectRef { raw, handle: None }
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

    /// Marks that the reference leaves this process: its object is kept.
    fn escape(&self) {
        if let Some(store) = self.handle.as_ref().and_then(|h| h.store.upgrade()) {
            store.mark_escaped(self.raw.id);
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

#[derive(Serialize, Deserialize)]
struct WireRef {
    id: [u8; 16],
    owner: String,
}

impl<T> Serialize for ObjectRef<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.inner.escape();
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
        Ok(AnyObjectRef::borrowed(raw).typed())
    }
}
