//! What routers and replicas exchange on an actor call: the raw request
//! body, and a reply that always carries the replica's count of ongoing
//! requests (the router's load estimate).

use serde::{Deserialize, Serialize};

use crate::deployment::Encoding;

/// One request, its body still encoded: the replica decodes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServeRequest {
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// A replica's answer to one [`ServeRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServeReply {
    /// Requests the replica was running when it replied, this one not
    /// counted.
    pub ongoing: u32,
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
    /// The replica was at `max_ongoing_requests`; user code did not run.
    Rejected,
    /// The body did not decode into the deployment's request type.
    BadRequest(String),
    /// User code returned an error or panicked.
    UserError(String),
}

/// One item of a streamed answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StreamChunk {
    /// The next piece of the response body.
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The replica was at `max_ongoing_requests` (only ever first).
    Rejected,
    /// The body did not decode (only ever first).
    BadRequest(String),
    /// User code failed; the stream ends here.
    UserError(String),
}
