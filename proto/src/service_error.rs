//! Typed service errors on the wire, as quickwit-proto has them: a service
//! has its own error enum, and this is the one place that turns it into a
//! `tonic::Status` and back. The status's code and message are what any
//! gRPC client understands; its details carry the error itself, encoded
//! with the value codec and tagged with the service's name, so that a
//! raylet client gets back the very variant the server returned. A status
//! without them (a broken connection, an error of the gRPC layer, or one of
//! another service passed through) becomes the service's variant for a
//! control-plane [`Error`].

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

use crate::Error;

/// The error of one gRPC service.
pub trait ServiceError: Serialize + DeserializeOwned + fmt::Display {
    /// The service's name: its errors are tagged with it on the wire.
    const SERVICE: &'static str;

    /// The gRPC code this error travels under.
    fn code(&self) -> Code;

    /// This service's error for a control-plane one.
    fn from_control_plane(error: Error) -> Self;
}

/// How a service error travels in a status's details.
#[derive(Serialize, Deserialize)]
struct Envelope {
    service: String,
    error: Vec<u8>,
}

/// The status a server returns for `error`.
pub fn to_status<E: ServiceError>(error: &E) -> Status {
    let message = error.to_string();
    let envelope = raylet_common::codec::encode(error).and_then(|error| {
        raylet_common::codec::encode(&Envelope {
            service: E::SERVICE.to_string(),
            error,
        })
    });
    match envelope {
        Ok(details) => Status::with_details(error.code(), message, details.into()),
        Err(_) => Status::new(error.code(), message),
    }
}

/// The service error a client gets for `status`.
pub fn from_status<E: ServiceError>(status: Status) -> E {
    decode_details(status.details()).unwrap_or_else(|| E::from_control_plane(Error::from(status)))
}

/// The error in `details` if it is one of service `E`'s.
fn decode_details<E: ServiceError>(details: &[u8]) -> Option<E> {
    let envelope: Envelope = raylet_common::codec::decode(details).ok()?;
    if envelope.service != E::SERVICE {
        return None;
    }
    raylet_common::codec::decode(&envelope.error).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
    enum KitchenError {
        #[error("the oven is {degrees} degrees too cold")]
        TooCold { degrees: u32 },
        #[error("{0}")]
        ControlPlane(Error),
    }

    impl ServiceError for KitchenError {
        const SERVICE: &'static str = "kitchen";

        fn code(&self) -> Code {
            match self {
                KitchenError::TooCold { .. } => Code::FailedPrecondition,
                KitchenError::ControlPlane(error) => error.code(),
            }
        }

        fn from_control_plane(error: Error) -> Self {
            KitchenError::ControlPlane(error)
        }
    }

    #[derive(Debug, Serialize, Deserialize, thiserror::Error)]
    #[error("the garden is dry")]
    struct GardenError;

    impl ServiceError for GardenError {
        const SERVICE: &'static str = "garden";

        fn code(&self) -> Code {
            Code::FailedPrecondition
        }

        fn from_control_plane(_: Error) -> Self {
            GardenError
        }
    }

    #[test]
    fn a_service_error_comes_back_as_the_same_variant_with_a_plain_code_and_message() {
        let status = to_status(&KitchenError::TooCold { degrees: 40 });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "the oven is 40 degrees too cold");
        assert_eq!(
            from_status::<KitchenError>(status),
            KitchenError::TooCold { degrees: 40 }
        );
    }

    #[test]
    fn a_status_without_this_services_error_maps_to_its_control_plane_variant() {
        let plain = Status::unavailable("the node is gone");
        assert_eq!(
            from_status::<KitchenError>(plain),
            KitchenError::ControlPlane(Error::Unavailable("the node is gone".into()))
        );
        let foreign = to_status(&GardenError);
        assert_eq!(
            from_status::<KitchenError>(foreign),
            KitchenError::ControlPlane(Error::FailedPrecondition("the garden is dry".into()))
        );
        let garbage = Status::with_details(Code::Internal, "broken", vec![0xff; 7].into());
        assert_eq!(
            from_status::<KitchenError>(garbage),
            KitchenError::ControlPlane(Error::Internal("broken".into()))
        );
    }
}
