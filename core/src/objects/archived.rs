//! `ArchivedRef<T>`: a validated view of an object's rkyv archive, read in
//! place from the node's shared memory (or from a small aligned copy of an
//! inline value), so a reader never deserializes or copies a large value.

use std::fmt;
use std::ops::Deref;

use raylet_object_store::MappedObject;
pub use raylet_object_store::{Archivable, Checkable};
use rkyv::util::AlignedVec;

use crate::{Error, Result};

/// Where an archive's bytes are.
enum ArchiveBytes {
    Mapped(MappedObject),
    Copied(AlignedVec<64>),
}

impl ArchiveBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            ArchiveBytes::Mapped(mapped) => mapped,
            ArchiveBytes::Copied(copy) => copy,
        }
    }
}

/// The archived form of a `T`, checked once and then read in place. It
/// keeps the object's mapping (and so the object) alive while it exists.
pub struct ArchivedRef<T: rkyv::Archive> {
    archived: *const T::Archived,
    _bytes: ArchiveBytes,
}

// SAFETY: the guard hands out only shared references to `T::Archived`, whose
// bytes are immutable (a sealed mapping or an owned copy) and owned by the
// guard, so moving or sharing it across threads is as safe as sharing a
// `&T::Archived`.
unsafe impl<T: rkyv::Archive> Send for ArchivedRef<T> where T::Archived: Sync {}
// SAFETY: as above.
unsafe impl<T: rkyv::Archive> Sync for ArchivedRef<T> where T::Archived: Sync {}

impl<T: rkyv::Archive> ArchivedRef<T>
where
    T::Archived: Checkable,
{
    pub(crate) fn mapped(mapped: MappedObject) -> Result<Self> {
        Self::validate(ArchiveBytes::Mapped(mapped))
    }

    pub(crate) fn copied(bytes: &[u8]) -> Result<Self> {
        let mut copy = AlignedVec::<64>::with_capacity(bytes.len());
        copy.extend_from_slice(bytes);
        Self::validate(ArchiveBytes::Copied(copy))
    }

    fn validate(bytes: ArchiveBytes) -> Result<Self> {
        let archived = raylet_object_store::archive::access::<T::Archived>(bytes.as_slice())
            .map_err(|e| Error::Cluster(e.into()))?;
        Ok(ArchivedRef {
            archived: std::ptr::from_ref(archived),
            _bytes: bytes,
        })
    }
}

impl<T: rkyv::Archive> Deref for ArchivedRef<T> {
    type Target = T::Archived;

    fn deref(&self) -> &T::Archived {
        // SAFETY: `archived` points into `_bytes`, which this guard owns and
        // never changes: a mapping's pages stay put while it lives and an
        // `AlignedVec` is not moved by moving the guard. bytecheck validated
        // the archive when the guard was made.
        unsafe { &*self.archived }
    }
}

impl<T: rkyv::Archive> fmt::Debug for ArchivedRef<T>
where
    T::Archived: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}
