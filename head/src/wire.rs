//! The one place where the head's typed errors become what travels on the
//! wire. Each service's error says which gRPC code each of its variants
//! travels under ([`Coded`]); [`on_the_wire!`] gives it the conversions to
//! a `tonic::Status` (its code and its text) and to the control-plane
//! error of the callers that are not gRPC handlers. Clients read the code
//! and the text, as they read any status.

use tonic::{Code, Status};

/// An error of one of the head's services, with the gRPC code it travels
/// under.
pub(crate) trait Coded: std::error::Error {
    fn code(&self) -> Code;
}

/// The status a handler answers with for `error`.
pub(crate) fn to_status(error: &impl Coded) -> Status {
    Status::new(error.code(), error.to_string())
}

/// Gives each error type `From` conversions to `tonic::Status` and to
/// `raylet_proto::Error`, through its [`Coded::code`].
macro_rules! on_the_wire {
    ($($error:ty),+ $(,)?) => {$(
        impl From<$error> for tonic::Status {
            fn from(error: $error) -> Self {
                $crate::wire::to_status(&error)
            }
        }

        impl From<$error> for raylet_proto::Error {
            fn from(error: $error) -> Self {
                raylet_proto::Error::from($crate::wire::to_status(&error))
            }
        }
    )+};
}
pub(crate) use on_the_wire;

/// A request's text field longer than the head takes.
#[derive(Debug, thiserror::Error)]
#[error("{field} is {len} bytes long; the limit is {limit}")]
pub struct TextTooLong {
    pub field: &'static str,
    pub len: usize,
    pub limit: usize,
}

impl Coded for TextTooLong {
    fn code(&self) -> Code {
        Code::InvalidArgument
    }
}

on_the_wire!(TextTooLong);

/// The longest name, address or other text a request may carry.
const MAX_TEXT_LEN: usize = 1024;

/// `text` if it is at most [`MAX_TEXT_LEN`] bytes long.
pub(crate) fn bounded_text(field: &'static str, text: String) -> Result<String, TextTooLong> {
    if text.len() > MAX_TEXT_LEN {
        return Err(TextTooLong {
            field,
            len: text.len(),
            limit: MAX_TEXT_LEN,
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum OvenError {
        #[error("the oven is {degrees} degrees too cold")]
        TooCold { degrees: u32 },
        #[error("{}", .0.message())]
        ControlPlane(raylet_proto::Error),
    }

    impl Coded for OvenError {
        fn code(&self) -> Code {
            match self {
                OvenError::TooCold { .. } => Code::FailedPrecondition,
                OvenError::ControlPlane(error) => error.code(),
            }
        }
    }

    on_the_wire!(OvenError);

    #[test]
    fn an_error_travels_under_its_code_with_its_text_once() {
        let status = Status::from(OvenError::TooCold { degrees: 40 });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "the oven is 40 degrees too cold");
        let passed_on = OvenError::ControlPlane(raylet_proto::Error::NotFound("no oven".into()));
        assert_eq!(
            raylet_proto::Error::from(passed_on),
            raylet_proto::Error::NotFound("no oven".into()),
            "a control-plane error comes back as it was, its kind not repeated in its text"
        );
    }
}
