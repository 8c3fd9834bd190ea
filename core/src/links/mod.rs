//! The edges where a process reaches other processes to run its tasks: node
//! managers (lease sessions, worker exits), the head (node deaths, actor
//! records) and workers (task streams). `grpc.rs` crosses the network;
//! unit tests put the in-process virtual cluster of `virtual_cluster.rs` in
//! its place, so that leasing, retries, lineage and actor restarts run
//! without processes or sockets.
//!
//! Beside them, what reaching another process takes: `channels.rs` (one
//! authenticated gRPC channel per address), `head_retry.rs` (calls to the
//! head that wait out its restart) and `local_ip.rs` (the local address a
//! peer reaches this process on).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use raylet_proto::task_stream::StreamClosed;
use raylet_proto::v1::{
    ActorWatchEvent, LeaseSessionEvent, LeaseSessionRequest, TaskBatch, WatchActorRequest, WorkerEvents, WorkerExit,
};
use raylet_proto::{NodeId, WorkerId};
use tokio::sync::mpsc;

pub(crate) use self::grpc::grpc_links;

use crate::Result;

pub(crate) mod channels;
mod grpc;
pub(crate) mod head_retry;
pub(crate) mod local_ip;
#[cfg(test)]
pub(crate) mod virtual_cluster;

/// An answer from another process.
pub(crate) type Reply<T> = BoxFuture<'static, Result<T>>;
/// What another process sends until it ends the stream.
pub(crate) type Incoming<T> = BoxStream<'static, Result<T>>;

/// A node incarnation the head counts dead.
pub(crate) struct NodeDeath {
    pub(crate) node_id: NodeId,
    pub(crate) incarnation: u64,
    pub(crate) address: String,
    pub(crate) reason: String,
}

/// Reaching node managers for leases.
pub(crate) trait NodeManagerLink: Send + Sync {
    /// Opens a lease session with the node manager at `node`: `requests`
    /// go to it, its events come back.
    fn lease_session(
        &self,
        node: Arc<str>,
        requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
    ) -> Reply<Incoming<LeaseSessionEvent>>;

    /// How worker `worker` of the node manager at `node` exited.
    fn worker_exit(&self, node: Arc<str>, worker: WorkerId) -> Reply<WorkerExit>;
}

/// Reaching the head for what it knows of nodes and actors.
pub(crate) trait HeadLink: Send + Sync {
    /// The node incarnations the head counts dead: those it knows, then
    /// each new one.
    fn node_deaths(&self) -> Reply<Incoming<NodeDeath>>;

    /// Follows the actors `requests` name: each one's record now and at
    /// every change.
    fn watch_actors(&self, requests: mpsc::UnboundedReceiver<WatchActorRequest>) -> Reply<Incoming<ActorWatchEvent>>;
}

/// Where tasks for one worker go; a frame is sent from any thread.
pub(crate) trait TaskOutlet: Send + Sync {
    fn send(&self, batch: &TaskBatch) -> std::result::Result<(), StreamClosed>;
}

/// What a task stream's reader does with each batch of a worker's events,
/// then once with the stream's end: `Ok(None)`, or why it failed. It runs
/// where the stream is read (for a worker on this machine, the same-node
/// reader thread), so it must not block.
pub(crate) type EventHandler = raylet_proto::task_stream::EventHandler<WorkerEvents>;

/// Reaching a worker's task stream: tasks out, results to `events`.
pub(crate) trait WorkerLink: Send + Sync {
    fn task_stream(&self, address: String, events: EventHandler) -> Reply<Box<dyn TaskOutlet>>;
}

/// The links a process's core reaches the cluster through.
#[derive(Clone)]
pub(crate) struct Links {
    pub(crate) nodes: Arc<dyn NodeManagerLink>,
    pub(crate) head: Arc<dyn HeadLink>,
    pub(crate) workers: Arc<dyn WorkerLink>,
}
