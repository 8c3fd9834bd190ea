//! What Ray's job API answers a refused or failed request with, and the
//! HTTP status of each answer, in one place. Ray's client prints the body
//! of any answer but 200 as it is, so each says what to do.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub(crate) enum RayJobsError {
    /// Ray's own wording, which its tools match.
    #[error("Job {0} does not exist")]
    UnknownJob(String),
    #[error("Job with submission_id {0} already exists. Please use a different submission_id.")]
    Exists(String),
    #[error("the job submission is not one raylet can read: {0}")]
    Unreadable(serde_json::Error),
    #[error("the entrypoint is empty: name a command to run")]
    EmptyEntrypoint,
    #[error("submission_id {id:?} must be 1 to {max} letters, digits, '_', '-' or '.'")]
    BadSubmissionId { id: String, max: usize },
    #[error("runtime_env.env_vars must map names to strings: {0}")]
    BadEnvVars(serde_json::Error),
    #[error("runtime_env.working_dir must be a string")]
    WorkingDirNotText,
    #[error("{name:?} is not a package name")]
    BadPackageName { name: String },
    #[error("the package did not arrive whole: {0}")]
    Incomplete(axum::Error),
    /// The head refused the call on the job's state (deleting one that
    /// has not ended), in its words.
    #[error("{0}")]
    HeadRefused(String),
    /// A field raylet cannot honour; refused rather than ignored.
    #[error("raylet cannot honour {field}: {why}")]
    Unsupported { field: String, why: &'static str },
    #[error(
        "the working_dir package {uri} is not on this head (a head keeps packages until it restarts \
         or needs their room): submit again and the client uploads it"
    )]
    PackageMissing { uri: String },
    #[error(
        "the working_dir package is over this head's limit of {limit} MiB: leave large files out \
         (runtime_env excludes, .gitignore) and read data from object storage instead"
    )]
    PackageTooLarge { limit: u64 },
    #[error("the working_dir package {name} is not a zip archive raylet can unpack: {why}")]
    BadPackage { name: String, why: String },
    #[error("asking the raylet head: {0}")]
    Head(raylet::Error),
    #[error("{action}: {source}")]
    Io { action: String, source: std::io::Error },
}

impl RayJobsError {
    /// The error for a failed I/O `action` ("writing the package", ...).
    pub(crate) fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> RayJobsError {
        let action = action.into();
        move |source| RayJobsError::Io { action, source }
    }

    fn status(&self) -> StatusCode {
        match self {
            RayJobsError::UnknownJob(_) => StatusCode::NOT_FOUND,
            RayJobsError::Exists(_)
            | RayJobsError::Unreadable(_)
            | RayJobsError::EmptyEntrypoint
            | RayJobsError::BadSubmissionId { .. }
            | RayJobsError::BadEnvVars(_)
            | RayJobsError::WorkingDirNotText
            | RayJobsError::BadPackageName { .. }
            | RayJobsError::Incomplete(_)
            | RayJobsError::HeadRefused(_)
            | RayJobsError::Unsupported { .. }
            | RayJobsError::PackageMissing { .. }
            | RayJobsError::BadPackage { .. } => StatusCode::BAD_REQUEST,
            RayJobsError::PackageTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RayJobsError::Head(_) => StatusCode::BAD_GATEWAY,
            RayJobsError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for RayJobsError {
    fn into_response(self) -> Response {
        (self.status(), self.to_string()).into_response()
    }
}
