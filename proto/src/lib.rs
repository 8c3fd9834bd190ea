//! raylet's wire protocol: the generated gRPC services, task streams, ids, resource sets,
//! the shared error type, token authentication and channel set-up.

pub mod auth;
pub mod backoff;
pub mod binary_hash;
pub mod blob;
pub mod channel;
pub mod codec;
pub mod connection_admission;
pub mod error;
pub mod http_listener;
pub mod ids;
pub mod limits;
pub mod metrics;
pub mod peer_stream;
pub mod placement_group;
pub mod request_decoding;
pub mod resources;
pub mod scheduling;
pub mod server;
pub mod service_error;
pub mod task_stream;
pub mod tls;
pub mod worker_env;
pub mod worker_logs;

pub use backoff::Backoff;
pub use error::{Error, Result};
pub use ids::{ActorId, IdMap, IdSet, JobId, NodeId, ObjectId, PlacementGroupId, TaskId, WorkerId};
pub use placement_group::PlacementStrategy;
pub use resources::{Amount, ResourceSet};
pub use scheduling::{LabelSelector, Labels, Scheduling, SchedulingStrategy};

/// The version of the wire protocol. Peers that speak another version are
/// rejected with both versions named.
pub const PROTOCOL_VERSION: u32 = 1;

/// Generated protobuf messages and tonic services of package `raylet.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("raylet.v1");
}

/// Every `.proto` file compiled, as an encoded `FileDescriptorSet`: the
/// auth test lists every gRPC method from it, so none can be missed.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/raylet_descriptors.bin"));
