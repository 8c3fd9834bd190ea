//! raylet's wire protocol: the generated gRPC services, task streams, ids,
//! resource sets, placement and scheduling types, blobs and channel set-up.
//! What every process needs beside the wire (authentication, TLS, limits,
//! the HTTP listener, metrics, backoff, the value codec, the worker's
//! start-up environment and the error type) is in raylet-common.

pub mod blob;
pub mod channel;
pub mod error;
pub mod ids;
pub mod local_socket;
pub mod owner_calls;
pub mod peer_stream;
pub mod placement_group;
pub mod request_decoding;
pub mod resources;
pub mod same_node_calls;
pub mod scheduling;
pub mod server;
pub mod service_error;
pub mod task_stream;
pub mod worker_logs;

pub use error::{Error, Result};
pub use ids::{ActorId, IdMap, IdSet, JobId, NodeId, ObjectId, PlacementGroupId, TaskId, WorkerId};
pub use placement_group::PlacementStrategy;
pub use resources::{Amount, ResourceSet};
pub use scheduling::{LabelSelector, Labels, Scheduling, SchedulingStrategy};

pub use raylet_common::PROTOCOL_VERSION;

/// Generated protobuf messages and tonic services of package `raylet.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("raylet.v1");
}

/// Every `.proto` file compiled, as an encoded `FileDescriptorSet`: the
/// auth test lists every gRPC method from it, so none can be missed.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/raylet_descriptors.bin"));
