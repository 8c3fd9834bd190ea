//! The owner service's error, which its clients get back variant for
//! variant (through `raylet_proto::service_error`).

use raylet_proto::ObjectId;
use raylet_proto::service_error::{ServiceError, to_status};
use serde::{Deserialize, Serialize};
use tonic::Code;

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub(crate) enum OwnerError {
    /// The process does not own the object, or no longer tracks it.
    #[error("object {0} is not owned here")]
    NotOwned(ObjectId),
    /// A control-plane error: a malformed request, or an unreachable owner.
    #[error(transparent)]
    ControlPlane(#[from] raylet_proto::Error),
}

impl ServiceError for OwnerError {
    const SERVICE: &'static str = "raylet.v1.OwnerService";

    fn code(&self) -> Code {
        match self {
            OwnerError::NotOwned(_) => Code::NotFound,
            OwnerError::ControlPlane(error) => error.code(),
        }
    }

    fn from_control_plane(error: raylet_proto::Error) -> Self {
        OwnerError::ControlPlane(error)
    }
}

impl From<OwnerError> for tonic::Status {
    fn from(error: OwnerError) -> Self {
        to_status(&error)
    }
}
