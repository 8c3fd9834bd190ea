//! raylet's per-node object store. Every object of [`INLINE_LIMIT`] bytes
//! or more lives in its own sealed memfd that the node manager owns and
//! processes on the node map read-only; least recently used objects spill
//! to disk when memory runs short. Values archived with rkyv are read in
//! place, checked by bytecheck first.

pub mod archive;
pub mod client;
pub mod error;
pub mod owner_watch;
pub mod same_node;
pub mod segment;
pub mod service;
pub mod spill;
pub mod store;
pub mod tensor;
pub mod transfer;

pub use archive::{Archivable, Checkable};
pub use client::{MappedObject, ObjectWriter, StoreClient, Unsealed};
pub use error::{Result, StoreError};
pub use same_node::SameNodeStore;
pub use service::{ObjectStoreServiceImpl, SharedStore};
pub use spill::{SpillDirectory, SpillTarget};
pub use store::{ObjectInfo, StoreConfig, StoreUsage, bytes};
pub use tensor::{ArchivedTensor, DType, Tensor};
pub use transfer::Pull;

/// Values smaller than this stay inline with their owner; larger ones go
/// to the shared-memory store.
pub const INLINE_LIMIT: usize = 100 * 1024;
