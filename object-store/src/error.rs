//! The object store's error type and its mapping onto the wire error.

use raylet_proto::ObjectId;

#[derive(Debug, thiserror::Error)]
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
    Io { context: String, source: std::io::Error },
    #[error(transparent)]
    Rpc(#[from] raylet_proto::Error),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
        let context = context.into();
        move |source| StoreError::Io { context, source }
    }
}

impl From<StoreError> for raylet_proto::Error {
    fn from(error: StoreError) -> Self {
        let message = error.to_string();
        match error {
            StoreError::AlreadyExists(_) => raylet_proto::Error::AlreadyExists(message),
            StoreError::NotFound(_) => raylet_proto::Error::NotFound(message),
            StoreError::NotSealed(_) => raylet_proto::Error::FailedPrecondition(message),
            StoreError::Full(_) | StoreError::TooLarge(_) => raylet_proto::Error::ResourceExhausted(message),
            StoreError::Invalid(_) => raylet_proto::Error::InvalidArgument(message),
            StoreError::PullFailed { lost: true, .. } => raylet_proto::Error::NotFound(message),
            StoreError::PullFailed { lost: false, .. } => raylet_proto::Error::Unavailable(message),
            StoreError::Io { .. } => raylet_proto::Error::Internal(message),
            StoreError::Rpc(error) => error,
        }
    }
}

impl From<StoreError> for tonic::Status {
    fn from(error: StoreError) -> Self {
        raylet_proto::Error::from(error).into()
    }
}
