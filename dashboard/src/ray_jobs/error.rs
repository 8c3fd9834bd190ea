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
    /// A field of the request is missing, unknown or of the wrong type.
    #[error("{0}")]
    BadRequest(String),
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
            | RayJobsError::BadRequest(_)
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
