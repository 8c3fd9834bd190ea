//! The error a failed task yields, and its form on the wire.

use std::fmt;

use raylet_proto::NodeId;
use raylet_proto::v1::{self, FailureKind};

/// Why a task failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskErrorKind {
    /// The function returned `Err`; the message is the error's.
    Application,
    /// The function panicked; the message is the panic's.
    Panic,
    /// The worker process died, on every attempt.
    WorkerCrashed,
    /// The node's out-of-memory monitor ended the worker, on every attempt.
    OutOfMemory,
    Cancelled,
    /// No node of the cluster can ever fit the requested resources.
    Infeasible,
    /// A hard scheduling constraint names what is not there, such as a
    /// node affinity to a dead node.
    Unschedulable,
    /// The worker binary has no function of that name.
    FunctionNotFound,
    /// The worker runs another build of the binary than the caller.
    BinaryMismatch,
    /// An argument could not be decoded or fetched.
    Argument,
    /// The process that owned an object is gone.
    OwnerDied,
    /// The actor's process died while the call was sent to it and the call
    /// was not retried; the message says why. Part of it may have run.
    ActorDied,
    /// The actor died (or its state could no longer be known) before the
    /// call was sent to it: nothing of the call ran, so sending it to
    /// another actor runs it once.
    ActorDiedBeforeSend,
    /// The actor's constructor failed; the message is its error.
    ActorCreationFailed,
}

/// A failed task, as its `ObjectRef` yields it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskError {
    pub kind: TaskErrorKind,
    pub function: String,
    pub message: String,
    pub node_id: Option<NodeId>,
    pub pid: u32,
    /// The attempt that failed last, from 0; above 0 means it was retried.
    pub attempt: u32,
}

impl TaskError {
    pub(crate) fn new(kind: TaskErrorKind, function: &str, message: impl Into<String>) -> Self {
        TaskError {
            kind,
            function: function.to_string(),
            message: message.into(),
            node_id: None,
            pid: 0,
            attempt: 0,
        }
    }

    pub(crate) fn from_proto(failure: v1::TaskFailure) -> Self {
        let kind = match failure.kind() {
            FailureKind::Application => TaskErrorKind::Application,
            FailureKind::Panic => TaskErrorKind::Panic,
            FailureKind::WorkerCrashed => TaskErrorKind::WorkerCrashed,
            FailureKind::OutOfMemory => TaskErrorKind::OutOfMemory,
            FailureKind::Cancelled => TaskErrorKind::Cancelled,
            FailureKind::Infeasible => TaskErrorKind::Infeasible,
            FailureKind::Unschedulable => TaskErrorKind::Unschedulable,
            FailureKind::FunctionNotFound => TaskErrorKind::FunctionNotFound,
            FailureKind::BinaryMismatch => TaskErrorKind::BinaryMismatch,
            FailureKind::OwnerDied => TaskErrorKind::OwnerDied,
            FailureKind::ActorDied => TaskErrorKind::ActorDied,
            FailureKind::ActorDiedBeforeSend => TaskErrorKind::ActorDiedBeforeSend,
            FailureKind::ActorCreationFailed => TaskErrorKind::ActorCreationFailed,
            FailureKind::Argument | FailureKind::Unspecified => TaskErrorKind::Argument,
        };
        TaskError {
            kind,
            function: failure.function,
            message: failure.message,
            node_id: NodeId::from_wire(&failure.node_id).ok(),
            pid: failure.pid,
            attempt: failure.attempt,
        }
    }

    pub(crate) fn to_proto(&self) -> v1::TaskFailure {
        let kind = match self.kind {
            TaskErrorKind::Application => FailureKind::Application,
            TaskErrorKind::Panic => FailureKind::Panic,
            TaskErrorKind::WorkerCrashed => FailureKind::WorkerCrashed,
            TaskErrorKind::OutOfMemory => FailureKind::OutOfMemory,
            TaskErrorKind::Cancelled => FailureKind::Cancelled,
            TaskErrorKind::Infeasible => FailureKind::Infeasible,
            TaskErrorKind::Unschedulable => FailureKind::Unschedulable,
            TaskErrorKind::FunctionNotFound => FailureKind::FunctionNotFound,
            TaskErrorKind::BinaryMismatch => FailureKind::BinaryMismatch,
            TaskErrorKind::Argument => FailureKind::Argument,
            TaskErrorKind::OwnerDied => FailureKind::OwnerDied,
            TaskErrorKind::ActorDied => FailureKind::ActorDied,
            TaskErrorKind::ActorDiedBeforeSend => FailureKind::ActorDiedBeforeSend,
            TaskErrorKind::ActorCreationFailed => FailureKind::ActorCreationFailed,
        };
        v1::TaskFailure {
            kind: kind as i32,
            message: self.message.clone(),
            function: self.function.clone(),
            node_id: self.node_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default(),
            pid: self.pid,
            attempt: self.attempt,
        }
    }

    /// Whether the call failed because its actor died, sent to it or not.
    pub fn is_actor_death(&self) -> bool {
        matches!(self.kind, TaskErrorKind::ActorDied | TaskErrorKind::ActorDiedBeforeSend)
    }

    /// Whether retrying on another worker may help.
    pub(crate) fn is_exception(&self) -> bool {
        matches!(self.kind, TaskErrorKind::Application | TaskErrorKind::Panic)
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            TaskErrorKind::Application => "returned an error",
            TaskErrorKind::Panic => "panicked",
            TaskErrorKind::WorkerCrashed => "lost its worker",
            TaskErrorKind::OutOfMemory => "ran out of memory (OOM)",
            TaskErrorKind::Cancelled => "was cancelled",
            TaskErrorKind::Infeasible => "cannot be scheduled",
            TaskErrorKind::Unschedulable => "cannot be scheduled where it must run",
            TaskErrorKind::FunctionNotFound => "is not registered in the worker",
            TaskErrorKind::BinaryMismatch => "was sent to another build of the binary",
            TaskErrorKind::Argument => "could not get its arguments",
            TaskErrorKind::OwnerDied => "lost the owner of an object",
            TaskErrorKind::ActorDied => "lost its actor, which died while it was sent",
            TaskErrorKind::ActorDiedBeforeSend => "was not sent: its actor died first",
            TaskErrorKind::ActorCreationFailed => "was not run: its actor's constructor failed",
        };
        write!(f, "task {} {what}", self.function)?;
        if let Some(node) = self.node_id {
            write!(f, " (node {}, pid {}", node.short(), self.pid)?;
            if self.attempt > 0 {
                write!(f, ", attempt {} after {} retries", self.attempt + 1, self.attempt)?;
            }
            write!(f, ")")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for TaskError {}
