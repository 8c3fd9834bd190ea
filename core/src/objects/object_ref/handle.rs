//! References to objects and the handles that keep objects alive while a
//! reference exists; how a value is fetched is in `mod.rs`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use raylet_proto::{ObjectId, v1};

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

/// What counts an object's handles in this process: the owner's table for
/// its own objects, the borrow table for others'.
pub(crate) trait HandleCounter: Send + Sync {
    /// A handle to `id` was dropped.
    fn handle_dropped(&self, id: ObjectId);
}

/// Keeps an object alive while it exists: a handle counted by `counter`.
struct Handle {
    id: ObjectId,
    counter: Weak<dyn HandleCounter>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(counter) = self.counter.upgrade() {
            counter.handle_dropped(self.id);
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
    /// A reference counted by `counter`, which has counted it already.
    pub(crate) fn counted(raw: RawRef, counter: Weak<dyn HandleCounter>) -> Self {
        let handle = Handle { id: raw.id, counter };
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
    pub(super) inner: AnyObjectRef,
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
