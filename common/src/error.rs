//! The one code-shaped error of the control plane, and its mapping to and
//! from `tonic::Status` (the wire's `CallFailure` maps in raylet-proto).

use tonic::{Code, Status};

/// A control-plane error. Each variant corresponds to one gRPC status code, so
/// an error survives a round trip through `tonic::Status` unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// A store or quota is full, e.g. the object store and its spill disk.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    #[error("internal error: {0}")]
    Internal(String),
}

/// Result with the control-plane [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A peer speaks another version of the wire protocol.
    pub fn protocol_mismatch(peer: &str, local: u32) -> Self {
        Error::FailedPrecondition(format!(
            "protocol version mismatch: the peer speaks raylet protocol version {peer}, \
             this side speaks version {local}; run the same raylet version on every node"
        ))
    }

    /// The message without the kind prefix that `Display` adds.
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::NotFound(m)
            | Error::AlreadyExists(m)
            | Error::FailedPrecondition(m)
            | Error::Unauthenticated(m)
            | Error::Unavailable(m)
            | Error::DeadlineExceeded(m)
            | Error::ResourceExhausted(m)
            | Error::Internal(m) => m,
        }
    }

    /// The gRPC code this error travels under.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::Unavailable(_) => Code::Unavailable,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Internal(_) => Code::Internal,
        }
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        Status::new(error.code(), error.message())
    }
}

impl From<Status> for Error {
    /// A status with a source error was made on this side from a failed
    /// connection (a peer sends none): the peer is unreachable.
    fn from(status: Status) -> Self {
        if status.code() == Code::Unknown
            && let Some(source) = std::error::Error::source(&status)
        {
            return Error::Unavailable(format!("{}: {}", status.message(), error_chain(source)));
        }
        let message = status.message().to_string();
        match status.code() {
            Code::InvalidArgument | Code::OutOfRange => Error::InvalidArgument(message),
            Code::NotFound => Error::NotFound(message),
            Code::AlreadyExists => Error::AlreadyExists(message),
            Code::FailedPrecondition => Error::FailedPrecondition(message),
            Code::Unauthenticated | Code::PermissionDenied => Error::Unauthenticated(message),
            Code::Unavailable | Code::Cancelled | Code::Aborted => Error::Unavailable(message),
            Code::DeadlineExceeded => Error::DeadlineExceeded(message),
            Code::ResourceExhausted => Error::ResourceExhausted(message),
            _ => Error::Internal(message),
        }
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(error: tonic::transport::Error) -> Self {
        Error::Unavailable(error_chain(&error))
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::Internal(error_chain(&error))
    }
}

/// An error and all its sources, joined with ": ".
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_survives_a_status_round_trip() {
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
            let status = Status::from(error.clone());
            assert_eq!(Error::from(status), error);
        }
    }

    #[test]
    fn a_status_made_here_from_a_failed_connection_is_unavailable_and_one_from_the_peer_is_not() {
        let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let local = Status::from_error(Box::new(broken));
        let error = Error::from(local);
        assert!(
            matches!(&error, Error::Unavailable(text) if text.contains("connection reset")),
            "{error:?}"
        );
        assert_eq!(
            Error::from(Status::unknown("the peer's own failure")),
            Error::Internal("the peer's own failure".into())
        );
    }

    #[test]
    fn protocol_mismatch_names_both_versions() {
        let text = Error::protocol_mismatch("7", 1).to_string();
        assert!(text.contains("version 7"), "{text}");
        assert!(text.contains("version 1"), "{text}");
    }
}
