//! What routers and replicas exchange on an actor call: the raw request
//! body (with the HTTP request's head when the proxy sends it), and a
//! reply that always carries the replica's count of ongoing requests and,
//! for a deployment that reports one, its fullness (the router's load
//! estimate). A streamed answer starts with its content type, so that the
//! proxy can send the response's head with the first chunk; its first and
//! last chunks carry the replica's fullness.

use serde::{Deserialize, Serialize};

use crate::deployment::Encoding;
use crate::http_messages::{HttpError, HttpHead};

/// One request, its body still encoded: the replica decodes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServeRequest {
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// The HTTP request's method, path and headers, from the proxy; none
    /// from a handle.
    pub head: Option<HttpHead>,
}

/// A replica's answer to one [`ServeRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServeReply {
    /// Requests the replica was running when it replied, this one not
    /// counted.
    pub ongoing: u32,
    /// The replica's [`Deployment::fullness`](crate::Deployment::fullness)
    /// when it replied.
    pub fullness: Option<f64>,
    pub outcome: Outcome,
}

/// What became of a request at a replica.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Outcome {
    /// The response body.
    Ok {
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
        encoding: Encoding,
    },
    /// The replica was at `max_ongoing_requests` or full by its fullness;
    /// user code did not run.
    Rejected,
    /// The body did not decode into the deployment's request type.
    BadRequest(String),
    /// User code returned an error or panicked.
    UserError(String),
    /// User code answered with this status, content type and body.
    Status(HttpError),
}

impl Outcome {
    /// Whether the request counts as failed in the replica's error count:
    /// user errors, and statuses of 500 and above.
    pub fn is_failure(&self) -> bool {
        match self {
            Outcome::UserError(_) => true,
            Outcome::Status(error) => error.status >= 500,
            Outcome::Ok { .. } | Outcome::Rejected | Outcome::BadRequest(_) => false,
        }
    }
}

/// One item of a streamed answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StreamChunk {
    /// The answer's `Content-Type` (always first, once the request has
    /// decoded), with the replica's fullness once it took the request.
    Start {
        content_type: String,
        fullness: Option<f64>,
    },
    /// The next piece of the response body.
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The deployment's stream ran out (always last, when it did): the
    /// replica's fullness without this request.
    End { fullness: Option<f64> },
    /// The replica was at `max_ongoing_requests` or full by its fullness
    /// (only ever first).
    Rejected,
    /// The body did not decode (only ever first).
    BadRequest(String),
    /// User code failed; the stream ends here.
    UserError(String),
    /// User code answered with this status (before any data: a status; after
    /// some: the stream ends here).
    Status(HttpError),
}

impl StreamChunk {
    /// Whether the chunk makes the request count as failed, as
    /// [`Outcome::is_failure`] says.
    pub fn is_failure(&self) -> bool {
        match self {
            StreamChunk::UserError(_) => true,
            StreamChunk::Status(error) => error.status >= 500,
            StreamChunk::Start { .. }
            | StreamChunk::Data(_)
            | StreamChunk::End { .. }
            | StreamChunk::Rejected
            | StreamChunk::BadRequest(_) => false,
        }
    }
}
