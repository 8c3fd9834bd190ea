//! The one error type of raylet-serve. The proxy maps each variant to an
//! HTTP status (`proxy::errors`), so callers match variants, never text.

use std::time::Duration;

use crate::http_messages::HttpError;

/// What went wrong in deploying or in answering a request.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error("invalid serve configuration: {0}")]
    InvalidConfig(String),
    #[error("encoding {what}: {message}")]
    Encode { what: String, message: String },
    #[error("no deployment `{deployment}` in application `{app}` of this process's routing table")]
    UnknownDeployment { app: String, deployment: String },
    #[error("deployment `{deployment}` runs `{actual}`, not `{expected}`")]
    WrongDeploymentType {
        deployment: String,
        expected: String,
        actual: String,
    },
    #[error("replica {replica} failed to start: {message}")]
    ReplicaFailed { replica: String, message: String },
    #[error("deployment `{deployment}` has no replica left")]
    NoReplicas { deployment: String },
    #[error("every replica of `{deployment}` is at max_ongoing_requests and its queue is full")]
    BackPressure { deployment: String },
    #[error("bad request for `{deployment}`: {message}")]
    BadRequest { deployment: String, message: String },
    #[error("deployment `{deployment}` failed on replica {replica}: {message}")]
    User {
        deployment: String,
        replica: String,
        message: String,
    },
    /// User code answered with an [`HttpError`]: its status, content
    /// type and body. A deployment that returns this error answers with
    /// the same status.
    #[error("deployment `{deployment}` answered {error}")]
    Status { deployment: String, error: HttpError },
    #[error("replica {replica} of `{deployment}` died while answering: {message}")]
    ReplicaDied {
        deployment: String,
        replica: String,
        message: String,
    },
    #[error("the response of `{deployment}` does not decode: {message}")]
    BadResponse { deployment: String, message: String },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("application `{app}` failed to deploy: {message}")]
    DeployFailed { app: String, message: String },
    #[error("no Serve application `{0}`")]
    NoSuchApp(String),
    #[error(
        "Serve on this cluster runs another build of this binary ({detail}); one build serves at a \
         time, and applications {apps} still run on it: delete them first (`raylet serve delete APP`; \
         they stop serving), then deploy this build"
    )]
    OtherBuild { detail: String, apps: String },
    #[error("the Serve controller is not reachable: {0}")]
    ControllerGone(String),
    #[error("{waiting_for} did not happen within {after:?}")]
    WaitTimedOut { waiting_for: String, after: Duration },
    #[error("application `{app}` is not running after {after:?}: {}", why.join("; "))]
    NotRunning {
        app: String,
        after: Duration,
        /// What kept it, a line each, or where to look.
        why: Vec<String>,
    },
    #[error(
        "application `{app}` runs, but no HTTP proxy does: {problem}; it is started again after a back-off \
         (`raylet serve status` shows when)"
    )]
    NoProxy { app: String, problem: String },
    #[error("the HTTP proxy cannot serve: {0}")]
    Http(#[from] std::io::Error),
    #[error(transparent)]
    Cluster(#[from] raylet::Error),
}

/// `Result` with a [`ServeError`].
pub type Result<T, E = ServeError> = std::result::Result<T, E>;
