//! `ObjectRef<T>`: a typed reference to a value that a task returns or `put`
//! stores. Cloning is cheap; the value is fetched with `get`, from the
//! process's cluster. The references themselves are in `handle.rs`.

use std::time::Duration;

use raylet_proto::ObjectId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use self::handle::{AnyObjectRef, ObjectRef, RawRef};
use crate::objects::archived::{ArchivedRef, Checkable};
use crate::{Result, current};

pub(crate) mod handle;

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
            id: *self.inner.id().as_bytes(),
            owner: self.inner.owner_address().to_string(),
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
            Ok(cluster) => cluster.core().owner.adopt(raw, false),
            Err(_) => AnyObjectRef::unheld(raw),
        };
        Ok(object.typed())
    }
}
