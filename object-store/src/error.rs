//! The object store's error type: what its service returns, and, through
//! `raylet_proto::service_error`, what its clients get back, variant for
//! variant.

use std::sync::Arc;

use raylet_proto::ObjectId;
use raylet_proto::service_error::{ServiceError, to_status};
use serde::{Deserialize, Serialize};
use tonic::Code;

#[derive(Clone, Debug, thiserror::Error, Serialize, Deserialize)]
pub enum StoreError {
    #[error("object {0} is already in the store")]
    AlreadyExists(ObjectId),
    #[error("object {0} is not in the store")]
    NotFound(ObjectId),
    #[error("object {0} is still being written")]
    NotSealed(ObjectId),
    /// No room now; room may come when objects are freed.
    #[error("{0}")]
    Full(String),
    /// No room ever: the object is larger than the store.
    #[error("{0}")]
    TooLarge(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    /// No source could send an object; `lost` when none of them holds it.
    #[error("cannot pull object {id}: {failures}")]
    PullFailed { id: ObjectId, failures: String, lost: bool },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[serde(with = "io_error_text")]
        source: Arc<std::io::Error>,
    },
    /// A control-plane error: the store was unreachable, or a call to
    /// another store failed.
    #[error(transparent)]
    Rpc(#[from] raylet_proto::Error),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
        let context = context.into();
        move |source| StoreError::Io {
            context,
            source: Arc::new(source),
        }
    }
}

impl ServiceError for StoreError {
    const SERVICE: &'static str = "raylet.v1.ObjectStoreService";

    fn code(&self) -> Code {
        match self {
            StoreError::AlreadyExists(_) => Code::AlreadyExists,
            StoreError::NotFound(_) | StoreError::PullFailed { lost: true, .. } => Code::NotFound,
            StoreError::NotSealed(_) => Code::FailedPrecondition,
            StoreError::Full(_) | StoreError::TooLarge(_) => Code::ResourceExhausted,
            StoreError::Invalid(_) => Code::InvalidArgument,
            StoreError::PullFailed { lost: false, .. } => Code::Unavailable,
            StoreError::Io { .. } => Code::Internal,
            StoreError::Rpc(error) => error.code(),
        }
    }

    fn from_control_plane(error: raylet_proto::Error) -> Self {
        StoreError::Rpc(error)
    }
}

/// The control-plane error a caller that is not a store client reports.
impl From<StoreError> for raylet_proto::Error {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Rpc(error) => error,
            other => tonic::Status::new(other.code(), other.to_string()).into(),
        }
    }
}

impl From<StoreError> for tonic::Status {
    fn from(error: StoreError) -> Self {
        to_status(&error)
    }
}

/// An I/O error travels as its text and comes back as an error of kind
/// `Other` with that text.
mod io_error_text {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(error: &Arc<std::io::Error>, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&error.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Arc<std::io::Error>, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(Arc::new(std::io::Error::other(text)))
    }
}
