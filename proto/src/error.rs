//! The control plane's error ([`raylet_common::Error`]) on the wire: a
//! call's failure inside a reply or a stream item (`CallFailure`).

use tonic::{Code, Status};

pub use raylet_common::error::{Error, Result};

impl From<Error> for crate::v1::CallFailure {
    fn from(error: Error) -> Self {
        crate::v1::CallFailure {
            code: error.code() as i32,
            message: error.message().to_string(),
        }
    }
}

impl From<crate::v1::CallFailure> for Error {
    fn from(failure: crate::v1::CallFailure) -> Self {
        Error::from(Status::new(Code::from_i32(failure.code), failure.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_survives_a_call_failure_round_trip() {
        let errors = [
            Error::InvalidArgument("bad".into()),
            Error::NotFound("gone".into()),
            Error::AlreadyExists("twice".into()),
            Error::FailedPrecondition("not yet".into()),
            Error::Unauthenticated("who".into()),
            Error::Unavailable("down".into()),
            Error::DeadlineExceeded("late".into()),
            Error::ResourceExhausted("full".into()),
            Error::Internal("bug".into()),
        ];
        for error in errors {
            let failure = crate::v1::CallFailure::from(error.clone());
            assert_eq!(Error::from(failure), error);
        }
    }
}
