//! raylet-storage: where raylet's libraries keep files. A [`Storage`] is a
//! local directory or an object storage prefix (`s3://bucket/prefix`,
//! through the `object_store` crate); files are written whole (locally
//! under a temporary name, synced and renamed into place; in a bucket by
//! one PUT) and read whole or by ranges. Object storage calls run on a
//! small runtime of this crate's own, so that callers stay synchronous.

mod atomic_write;
mod error;
mod location;
mod runtime;
#[cfg(feature = "testing")]
pub mod testing;

pub use atomic_write::write_atomically;
pub use error::StorageError;
pub use location::{Storage, StorageOptions, is_url, open_file};
pub use runtime::run;
