//! The node manager service's error, which its clients get back variant
//! for variant (through `raylet_proto::service_error`); a control-plane
//! error passes through as it was, code and message.

use std::path::PathBuf;

use raylet_proto::WorkerId;
use raylet_proto::service_error::{ServiceError, to_status};
use serde::{Deserialize, Serialize};
use tonic::Code;

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum NodeManagerError {
    /// A lease session's first message was not `open`.
    #[error("a lease session must start with `open`")]
    LeaseSessionWithoutOpen,
    /// A worker session's first message was not `register`.
    #[error("a worker session must start with `register`")]
    WorkerSessionWithoutRegister,
    #[error("a job driver needs the job's spec")]
    JobSpecMissing,
    /// The owner's binary is not at its path on this node.
    #[error(
        "the worker binary {} is not on this node: {reason}; run the program on this node, or submit it as a job",
        path.display()
    )]
    BinaryMissing { path: PathBuf, reason: String },
    /// The file at the owner's path is another build than the owner runs.
    #[error(
        "the binary at {} has hash {actual}, but the caller runs a build with hash {expected}; \
         was it rebuilt while the program ran?",
        path.display()
    )]
    BinaryMismatch {
        path: PathBuf,
        actual: String,
        expected: String,
    },
    /// A worker registered that this node manager never started (or gave up).
    #[error("worker {0} was not started by this node manager")]
    UnknownWorker(WorkerId),
    /// A worker was to start for a session that has closed.
    #[error("lease session {0} is closed")]
    SessionClosed(u64),
    /// A worker process could not be started at all.
    #[error("starting a worker from {}: {reason}", binary.display())]
    LaunchFailed { binary: PathBuf, reason: String },
    /// Reading a worker's log failed before it could answer.
    #[error("reading a worker log failed: {0}")]
    LogReadFailed(String),
    /// A stack dump named a process that is not one of this node's workers.
    #[error("process {pid} is not a worker of node {node}; `raylet list tasks` shows the workers' pids")]
    NotAWorker { pid: u32, node: String },
    /// A control-plane error: a malformed id, or one from the job drivers
    /// or the worker logs.
    #[error(transparent)]
    ControlPlane(#[from] raylet_proto::Error),
}

impl ServiceError for NodeManagerError {
    const SERVICE: &'static str = "raylet.v1.NodeManagerService";

    fn code(&self) -> Code {
        match self {
            NodeManagerError::LeaseSessionWithoutOpen
            | NodeManagerError::WorkerSessionWithoutRegister
            | NodeManagerError::JobSpecMissing => Code::InvalidArgument,
            NodeManagerError::BinaryMissing { .. }
            | NodeManagerError::UnknownWorker(_)
            | NodeManagerError::NotAWorker { .. }
            | NodeManagerError::SessionClosed(_) => Code::NotFound,
            NodeManagerError::BinaryMismatch { .. } => Code::FailedPrecondition,
            NodeManagerError::LaunchFailed { .. } | NodeManagerError::LogReadFailed(_) => Code::Internal,
            NodeManagerError::ControlPlane(error) => error.code(),
        }
    }

    fn from_control_plane(error: raylet_proto::Error) -> Self {
        NodeManagerError::ControlPlane(error)
    }
}

/// A control-plane error travels as it always has: its code and its
/// message without the kind prefix; the node's own errors carry themselves.
impl From<NodeManagerError> for tonic::Status {
    fn from(error: NodeManagerError) -> Self {
        match error {
            NodeManagerError::ControlPlane(error) => error.into(),
            own => to_status(&own),
        }
    }
}

impl From<crate::worker_launcher::LaunchError> for NodeManagerError {
    fn from(error: crate::worker_launcher::LaunchError) -> Self {
        let reason = error.source.to_string();
        NodeManagerError::LaunchFailed {
            binary: error.binary,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use raylet_proto::service_error::from_status;
    use tonic::Status;

    use super::*;

    #[test]
    fn the_nodes_own_errors_keep_the_codes_and_messages_clients_know_and_come_back_as_themselves() {
        let worker = WorkerId::random();
        let cases = [
            (NodeManagerError::LeaseSessionWithoutOpen, Code::InvalidArgument),
            (NodeManagerError::UnknownWorker(worker), Code::NotFound),
            (NodeManagerError::SessionClosed(3), Code::NotFound),
            (
                NodeManagerError::BinaryMismatch {
                    path: "/bin/w".into(),
                    actual: "a".into(),
                    expected: "b".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                NodeManagerError::LaunchFailed {
                    binary: "/bin/w".into(),
                    reason: "permission denied".into(),
                },
                Code::Internal,
            ),
        ];
        for (error, code) in cases {
            let message = error.to_string();
            let status = Status::from(error);
            assert_eq!((status.code(), status.message()), (code, message.as_str()));
            let back: NodeManagerError = from_status(status.clone());
            assert_eq!(back.to_string(), message);
            let plain = raylet_proto::Error::from(status);
            assert_eq!(
                (plain.code(), plain.message()),
                (code, message.as_str()),
                "a plain client"
            );
        }
    }

    #[test]
    fn a_control_plane_error_travels_as_it_did_before() {
        let error = raylet_proto::Error::InvalidArgument("worker ids are 16 bytes".into());
        let status = Status::from(NodeManagerError::from(error.clone()));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "worker ids are 16 bytes");
        assert!(matches!(
            from_status::<NodeManagerError>(status),
            NodeManagerError::ControlPlane(back) if back == error
        ));
    }
}
