//! What the job service answers a refused or failed call with, and the
//! gRPC code of each answer.

use std::path::PathBuf;

use raylet_proto::JobId;
use tonic::Code;

use crate::state_store::StateError;
use crate::wire::{Coded, on_the_wire};

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("ask about at most {limit} blobs at once, not {count}")]
    TooManyBlobNames { count: usize, limit: usize },
    #[error("'{name}' is not a sha256")]
    NotSha256 { name: String },
    #[error("a fetch must name a blob")]
    NoBlobNamed,
    #[error("no binary with build hash {build_hash} was uploaded to the head")]
    UnknownBuildHash { build_hash: String },
    #[error("the head has no blob {sha256}")]
    UnknownBlob { sha256: String },
    #[error("a job needs a spec")]
    NoSpec,
    #[error("a job needs a binary")]
    NoBinary,
    #[error("a job may ship at most {limit} files, got {count}")]
    TooManyFiles { count: usize, limit: usize },
    #[error("the file {path} names no blob")]
    FileWithoutBlob { path: String },
    /// A shipped path is absolute, empty, too long, or climbs out.
    #[error("'{path}' must be a relative path inside the job's directory, without '..'")]
    PathOutside { path: String },
    #[error("the blob {sha256} was not uploaded; upload it before submitting")]
    BlobNotUploaded { sha256: String },
    #[error("job {job_id} was submitted before")]
    Exists { job_id: JobId },
    #[error("no job {job_id} was submitted to this cluster")]
    UnknownJob { job_id: JobId },
    #[error("job {job_id} is {status} and cannot be deleted until it ends: stop it first")]
    NotEnded { job_id: JobId, status: &'static str },
    /// The node that runs the driver did not take the stop signal.
    #[error("signalling the driver on the node at {address}: {}", .error.message())]
    SignalFailed {
        address: String,
        error: raylet_proto::Error,
    },
    /// A file of the head's: a blob, a job's output or their directories.
    #[error("{action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A field of the request does not decode, or a blob is not what its
    /// reference says.
    #[error("{}", .0.message())]
    Malformed(#[from] raylet_proto::Error),
    /// The change could not be written to the head's state.
    #[error(transparent)]
    State(#[from] StateError),
}

impl JobError {
    /// The error for an I/O `action` ("reading", "creating", ...) on `path`
    /// that failed.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> JobError {
        let path = path.into();
        move |source| JobError::Io { action, path, source }
    }
}

impl Coded for JobError {
    fn code(&self) -> Code {
        match self {
            JobError::TooManyBlobNames { .. }
            | JobError::NotSha256 { .. }
            | JobError::NoBlobNamed
            | JobError::NoSpec
            | JobError::NoBinary
            | JobError::TooManyFiles { .. }
            | JobError::FileWithoutBlob { .. }
            | JobError::PathOutside { .. } => Code::InvalidArgument,
            JobError::UnknownBuildHash { .. } | JobError::UnknownBlob { .. } | JobError::UnknownJob { .. } => {
                Code::NotFound
            }
            JobError::BlobNotUploaded { .. } | JobError::NotEnded { .. } => Code::FailedPrecondition,
            JobError::Exists { .. } => Code::AlreadyExists,
            JobError::SignalFailed { error, .. } | JobError::Malformed(error) => error.code(),
            JobError::Io { .. } => Code::Internal,
            JobError::State(error) => error.code(),
        }
    }
}

on_the_wire!(JobError);
