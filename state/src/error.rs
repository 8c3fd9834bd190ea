//! What can go wrong reading the cluster's state.

use raylet_proto::{ActorId, TaskId};

/// A read of the cluster's state that failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The head or a node manager could not be reached, or refused the
    /// request (its token, its limits).
    #[error(transparent)]
    ControlPlane(#[from] raylet_proto::Error),
    /// The actor table could not be read.
    #[error(transparent)]
    Actors(#[from] raylet::Error),
    #[error("the cluster has no actor {0}")]
    NoActor(ActorId),
    #[error("actor {0} has not started on a worker yet")]
    ActorNotStarted(ActorId),
    #[error("no recorded attempt of task {0} reached a worker")]
    TaskNeverRan(TaskId),
    #[error("node {0} is not an alive node of the cluster")]
    NoAliveNode(raylet_proto::NodeId),
    /// A stack dump named a process that no node has as a worker.
    #[error("process {pid} is not a worker {place}; `raylet list tasks` shows the workers' pids")]
    NotAWorker { pid: u32, place: String },
    /// No alive node (or not the node named) has the worker's log file.
    #[error("no log file of {what} {place}")]
    NoLogFile { what: String, place: String },
}

/// What reads of the cluster's state return.
pub type Result<T, E = StateError> = std::result::Result<T, E>;
