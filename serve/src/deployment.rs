//! What a user writes: the [`Deployment`] trait, the request and response
//! bodies it takes ([`Json`], raw [`bytes::Bytes`] or a whole
//! [`HttpRequest`](crate::HttpRequest)), and the [`ReplicaContext`] a
//! replica is built with.

use std::future::Future;

use bytes::Bytes;
use futures_util::Stream;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::figures::Figure;
use crate::http_messages::HttpHead;

/// The error user code returns; its message reaches the HTTP client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A model or service whose replicas answer requests. Each replica builds
/// one value with [`Deployment::new`] and calls it concurrently, up to
/// `max_ongoing_requests` at once. Register the type with
/// [`register_deployment!`](crate::register_deployment).
pub trait Deployment: Send + Sync + Sized + 'static {
    /// What every replica is built from (a checkpoint's path, sizes).
    type Init: Serialize + DeserializeOwned;
    /// Settings that [`Deployment::reconfigure`] applies after `new`.
    type UserConfig: Serialize + DeserializeOwned + Send;
    /// A request's body, decoded in the replica: a bad one is a 400.
    type Request: Body;
    /// A response's body.
    type Response: Body;

    /// Builds the replica's value; it runs once per replica.
    fn new(init: Self::Init, context: &ReplicaContext) -> Result<Self, BoxError>;

    /// Whether HTTP requests are answered with [`Deployment::stream`]'s
    /// chunks, as they come (chunked transfer encoding), rather than with
    /// `call`'s one response.
    const STREAMING: bool = false;

    /// Answers one request. An `Err` is a 500 that names the replica,
    /// unless it is an [`HttpError`](crate::HttpError) (or a handle's
    /// [`ServeError::Status`](crate::ServeError::Status)), which the proxy
    /// answers with as it is.
    fn call(&self, request: Self::Request) -> impl Future<Output = Result<Self::Response, BoxError>> + Send;

    /// Answers one request as a stream of chunks (when `STREAMING`). An
    /// error before the first chunk is answered as `call`'s are; after it,
    /// the response ends early. A client that goes away drops the stream.
    fn stream(&self, _request: Self::Request) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        futures_util::stream::once(async { Err::<Bytes, BoxError>("this deployment does not stream".into()) })
    }

    /// The `Content-Type` of `request`'s streamed answer: by default
    /// `application/octet-stream`. An OpenAI-compatible server answers
    /// `text/event-stream` when the request asks to stream and
    /// `application/json` otherwise, its one JSON body the one chunk.
    fn stream_content_type(&self, _request: &Self::Request) -> String {
        Encoding::Bytes.content_type().to_string()
    }

    /// Figures of the replica (tokens per second, latency percentiles)
    /// that `raylet serve status` shows under the deployment, summed or
    /// averaged over its running replicas. Asked about once a second, on
    /// the runtime user code runs on: it should be quick.
    fn figures(&self) -> Vec<Figure> {
        Vec::new()
    }

    /// How full the replica is, as a fraction of what it can hold: 0 empty,
    /// 1 full, above 1 overloaded. An LLM server answers the key/value
    /// cache tokens its running requests reserve plus those its waiting
    /// requests need, over its cache budget. By default `None`: routers
    /// then go by `max_ongoing_requests` alone.
    ///
    /// A replica that reports it rejects requests while it is 1 or more (as
    /// at `max_ongoing_requests`; routers send them elsewhere or hold them
    /// in their bounded queue), and reports it with every answer, at the
    /// start of every stream and at its end; routers send each request to
    /// the emptier of two replicas. A streaming deployment should count a
    /// request from when [`Deployment::stream`] returns, so that the next
    /// request's admission sees it. It is asked before every request is
    /// admitted and with every reply, on the replica's actor thread: it
    /// must be quick (read counters or take a short lock) and never block.
    fn fullness(&self) -> Option<f64> {
        None
    }

    /// Applies the deployment's user config, when it has one: right after
    /// `new`, and again in place, without a restart, whenever a deploy
    /// changes only the user config.
    fn reconfigure(&self, _config: Self::UserConfig) -> Result<(), BoxError> {
        Ok(())
    }

    /// Whether the replica can take traffic; checked before it gets any,
    /// then every health check period. A failure replaces the replica.
    fn check_health(&self) -> Result<(), BoxError> {
        Ok(())
    }
}

/// How a body is encoded on HTTP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Encoding {
    /// `application/json`.
    Json,
    /// `application/octet-stream`.
    Bytes,
}

impl Encoding {
    /// The `Content-Type` of a response in this encoding.
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Bytes => "application/octet-stream",
        }
    }
}

/// A request or response body: JSON ([`Json`]), raw bytes ([`Bytes`]) or
/// a whole HTTP request ([`HttpRequest`](crate::HttpRequest)).
pub trait Body: Sized + Send + 'static {
    /// How this body is encoded.
    const ENCODING: Encoding;

    /// The body's bytes.
    fn encode(self) -> Result<Bytes, BoxError>;

    /// The body from its bytes; the error says what is wrong.
    fn decode(bytes: Bytes) -> Result<Self, BodyError>;

    /// The body of a request that came over HTTP, with its `head` (method,
    /// path, headers), or from a handle (no head); by default the head is
    /// ignored.
    fn decode_http(_head: Option<HttpHead>, body: Bytes) -> Result<Self, BodyError> {
        Self::decode(body)
    }
}

/// Why a body does not decode: a request's error is the message of its
/// 400, a response's that of [`ServeError::BadResponse`](crate::ServeError::BadResponse).
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Malformed JSON, or JSON that is not the body's type.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Not what the cluster's codec encodes (a whole request from a
    /// handle).
    #[error(transparent)]
    Codec(#[from] raylet::codec::Error),
}

/// A JSON body of type `T`: malformed JSON, or JSON that is not a `T`,
/// is a 400 with serde's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: Serialize + DeserializeOwned + Send + 'static> Body for Json<T> {
    const ENCODING: Encoding = Encoding::Json;

    fn encode(self) -> Result<Bytes, BoxError> {
        Ok(serde_json::to_vec(&self.0)?.into())
    }

    fn decode(bytes: Bytes) -> Result<Self, BodyError> {
        Ok(serde_json::from_slice(&bytes).map(Json)?)
    }
}

impl Body for Bytes {
    const ENCODING: Encoding = Encoding::Bytes;

    fn encode(self) -> Result<Bytes, BoxError> {
        Ok(self)
    }

    fn decode(bytes: Bytes) -> Result<Self, BodyError> {
        Ok(bytes)
    }
}

/// Who a replica is: its application, deployment and name. A deployment
/// calls another of its application through
/// `DeploymentHandle::new(&context.app, "other")`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplicaContext {
    pub app: String,
    pub deployment: String,
    /// The replica's actor name, `replica:<app>:<deployment>:<index>`.
    pub replica: String,
}
