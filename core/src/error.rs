//! The error type of the raylet crate.

use std::path::PathBuf;
use std::time::Duration;

use raylet_proto::{ObjectId, PlacementGroupId};

use crate::task_error::TaskError;

/// An error from raylet's user API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The task that makes the object failed.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The object holds a value of another type than the one asked for.
    #[error("object {object} holds a {actual}, not a {expected}")]
    WrongType {
        object: ObjectId,
        expected: String,
        actual: String,
    },
    /// The object holds a value in another format: `put` values are read
    /// with `get`, `put_archived` values with `get_archived`.
    #[error("object {object} cannot be read this way: {message}")]
    WrongFormat { object: ObjectId, message: String },
    /// The object store has no room, even after spilling, within the timeout.
    #[error("{0}")]
    ObjectStoreFull(String),
    /// The object was not ready in time.
    #[error("object {object} was not ready within {timeout:?}")]
    GetTimeout { object: ObjectId, timeout: Duration },
    /// The object's value is gone and cannot be rebuilt: its owner no
    /// longer has it, or the node that stored it died; the reason says which.
    #[error("object {object} is lost: {reason}")]
    ObjectLost { object: ObjectId, reason: String },
    /// The named actor is of another type than the one asked for.
    #[error("the actor named '{name}' is a {actual}, not a {expected}")]
    WrongActorType {
        name: String,
        expected: String,
        actual: String,
    },
    /// The alive nodes can never hold the placement group.
    #[error("placement group {group} is infeasible: {reason}")]
    PlacementGroupInfeasible { group: PlacementGroupId, reason: String },
    /// The placement group was removed.
    #[error("placement group {group} was removed")]
    PlacementGroupRemoved { group: PlacementGroupId },
    /// The placement group was not created in time.
    #[error("placement group {group} was not created within {timeout:?}: {reason}")]
    PlacementGroupTimeout {
        group: PlacementGroupId,
        timeout: Duration,
        reason: String,
    },
    /// `init` without an address in a build with no embedded cluster.
    #[error(
        "this build of raylet has no embedded cluster (the feature `embedded` is off): set RAYLET_ADDRESS, \
         or Config::address, to the head of a running cluster"
    )]
    NoEmbeddedCluster,
    /// No cluster is running in this process.
    #[error("no raylet cluster in this process: call raylet::init() first")]
    NotInitialized,
    /// The cluster answered with an error, or could not be reached.
    #[error(transparent)]
    Cluster(#[from] raylet_proto::Error),
    /// The session directory is missing, unreadable or corrupt.
    #[error("{} {message}", path.display())]
    Session { path: PathBuf, message: String },
}

/// Result with the raylet [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The object's owner does not have it: it was freed, or the owner restarted.
    pub(crate) fn not_owned(object: ObjectId) -> Self {
        Error::ObjectLost {
            object,
            reason: "its owner no longer has it".into(),
        }
    }

    pub(crate) fn session(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Session {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::Cluster(error.into())
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Error::Cluster(status.into())
    }
}

/// The text of a caught panic: its message, or a note that it had none.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        return text.to_string();
    }
    if let Some(text) = payload.downcast_ref::<String>() {
        return text.clone();
    }
    "a panic with a non-text payload".to_string()
}
