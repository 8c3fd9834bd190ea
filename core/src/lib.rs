//! raylet: a Ray-like distributed runtime for ML workloads.
//!
//! ```ignore
//! use raylet::prelude::*;
//!
//! #[raylet::remote]
//! fn square(x: u64) -> u64 { x * x }
//!
//! fn main() -> raylet::Result<()> {
//!     let cluster = raylet::init()?;
//!     let refs: Vec<ObjectRef<u64>> =
//!         (0..100).map(|x| square::remote(&cluster, x)).collect::<raylet::Result<_>>()?;
//!     println!("{}", cluster.get_all(&refs)?.iter().sum::<u64>());
//!     Ok(())
//! }
//! ```
//!
//! `raylet::init()` starts an embedded head and node in this process, or
//! joins the cluster at `RAYLET_ADDRESS`. Workers are this same binary,
//! started again: a hook that runs before `main` turns them into workers.

mod actor;
mod cluster;
mod context;
mod core_worker;
pub mod error;
mod generator;
mod interner;
mod job;
mod links;
mod objects;
mod observability;
mod placement_group;
mod registry;
mod shared_bytes;
mod submitter;
mod task_error;
mod value;
mod worker;

pub use actor::{Actor, ActorBuilder, ActorHandle, ActorInfo, ActorOptions, ActorState, list_actors};
pub use cluster::config::Config;
pub use cluster::kv::{KvNamespace, dashboard_entries};
pub use cluster::session;
pub use cluster::{Cluster, current, init, init_with};
pub use error::{Error, Result};
pub use generator::{DEFAULT_BACKPRESSURE, ObjectRefStream};
pub use job::{DEFAULT_STOP_GRACE, Job, JobClient, JobHandle, JobInfo, JobOutput, JobStatus, Submitted};
pub use links::local_ip::local_ip_towards;
pub use objects::archived::{Archivable, ArchivedRef, Checkable};
pub use objects::object_ref::handle::{AnyObjectRef, ObjectRef};
pub use observability::memory::{NodeMemory, ObjectHolders, StoredObject, collect_memory};
pub use observability::metrics;
pub use observability::timeline;
pub use placement_group::handle::PlacementGroup;
pub use placement_group::{Bundle, PlacementGroupInfo, PlacementGroupState, list_placement_groups};
pub use raylet_cluster_status as status;
pub use raylet_common::tls::TlsFiles;
pub use raylet_macros::{actor, remote};
#[cfg(feature = "embedded")]
pub use raylet_node::{FakeGpus, GpuDetector};
pub use raylet_object_store::{ArchivedTensor, DType, INLINE_LIMIT, Tensor};
/// The error a call to the cluster's services answers with: the
/// `Error::Cluster` of [`Error`].
pub use raylet_proto::Error as ClusterError;
pub use raylet_proto::{
    ActorId, Amount, JobId, LabelSelector, Labels, NodeId, ObjectId, PlacementGroupId, PlacementStrategy, ResourceSet,
    SchedulingStrategy, TaskId, WorkerId,
};
pub use registry::{EntryKind, RegistryError, find_registered};
pub use rkyv;
pub use shared_bytes::SharedBytes;
pub use submitter::task::{Arg, IntoArg, TaskOptions};
pub use task_error::{TaskError, TaskErrorKind};
pub use worker::gpu_ids;

/// The names of the resources every node has: `CPU`, `GPU`, `memory`,
/// `object_store_memory` (custom resources are any other name).
pub mod resource_names {
    pub use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
}

/// The value codec (serde with postcard) that every value crossing a
/// process boundary goes through: task arguments, results, `put` objects.
pub mod codec {
    pub use raylet_common::codec::{decode, encode, encode_into, encoded_len};
    pub use raylet_proto::Error;
}

/// What the `#[raylet::remote]` and `#[raylet::actor]` expansions refer
/// to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::actor::instance::*;
    pub use crate::registry::*;
    pub use crate::value::EncodedValue;
}

/// The names most programs need, `Result` and `Error` among them
/// (`Result<T>` is `Result<T, raylet::Error>`; a second parameter names
/// another error type, so `Result<T, E>` keeps working after the import).
pub mod prelude {
    pub use crate::{
        ActorHandle, Bundle, Cluster, Config, Error, ObjectRef, ObjectRefStream, PlacementGroup, PlacementStrategy,
        Result, SchedulingStrategy, TaskError, TaskErrorKind, Tensor,
    };
}
