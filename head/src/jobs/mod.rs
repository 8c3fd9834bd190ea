//! The head's jobs: the blobs they ship (binaries and files, by sha256), a
//! record and the output of each job, kept on disk, and the manager that
//! runs each job's driver on a node.

mod blobs;
mod error;
mod manager;
mod service;
mod table;

pub use blobs::BlobStore;
pub use error::JobError;
pub use manager::JobManager;
pub(crate) use service::JobServiceImpl;
pub use table::is_ended;
