//! The deployments linked into this binary, by name, in raylet's registry:
//! a replica (this same binary, started again as a worker) finds its class
//! there, since actors cannot be generic.
//! [`register_deployment!`](crate::register_deployment) adds one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use futures_util::{Stream, StreamExt};
use raylet::{EntryKind, RegistryError};

use crate::deployment::{Body, BoxError, Deployment, ReplicaContext};
use crate::error::ServeError;
use crate::figures::Figure;
use crate::http_messages::{HttpError, HttpHead};
use crate::wire::{Outcome, StreamChunk};

/// A future a replica runs on its own runtime.
pub(crate) type OutcomeFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;
/// The chunks of a streamed answer, which a replica drives on its own
/// runtime.
pub(crate) type ChunkStream = Pin<Box<dyn Stream<Item = StreamChunk> + Send>>;

/// A built deployment, its type erased. Not a public API.
#[doc(hidden)]
pub trait ErasedDeployment: Send + Sync {
    /// Decodes the body (with the HTTP head, if any), runs the call and
    /// encodes its response.
    fn call(self: Arc<Self>, head: Option<HttpHead>, body: Bytes) -> OutcomeFuture;

    /// Decodes the body and streams the answer's content type (with the
    /// fullness once the deployment has the request), then its chunks.
    fn stream(self: Arc<Self>, head: Option<HttpHead>, body: Bytes) -> ChunkStream;

    /// The deployment's fullness, unless it is not a number.
    fn fullness(&self) -> Option<f64>;

    /// The deployment's figures.
    fn figures(&self) -> Vec<Figure>;

    /// The deployment's health check, with its error.
    fn check_health(&self) -> Result<(), BoxError>;

    /// Decodes and applies a user config.
    fn reconfigure(&self, user_config: &[u8]) -> Result<(), ReconfigureError>;
}

/// Why a replica did not apply a user config.
#[derive(Debug, thiserror::Error)]
pub enum ReconfigureError {
    /// It is not the deployment's `UserConfig`, encoded.
    #[error("decoding the user config: {0}")]
    Decode(#[source] raylet::codec::Error),
    /// The deployment's [`Deployment::reconfigure`] refused it.
    #[error(transparent)]
    Refused(BoxError),
}

/// Why a deploy file's `init` or `user_config` is not what a replica
/// decodes.
#[derive(Debug, thiserror::Error)]
pub enum EncodeFromJsonError {
    /// The JSON value is not of the deployment's type.
    #[error(transparent)]
    WrongType(#[from] serde_json::Error),
    /// The typed value does not encode.
    #[error(transparent)]
    Encode(#[from] raylet::codec::Error),
}

/// How a replica builds a deployment from its encoded `Init` and user
/// config.
type Construct = fn(&[u8], Option<&[u8]>, &ReplicaContext) -> Result<Arc<dyn ErasedDeployment>, ServeError>;

/// How a deploy file's `init` or `user_config` (JSON or YAML, as a JSON
/// value) becomes what a replica decodes.
type EncodeFromJson = fn(serde_json::Value) -> Result<Vec<u8>, EncodeFromJsonError>;

/// One registered deployment class, as raylet's registry holds it. Not a
/// public API.
#[doc(hidden)]
pub struct RegisteredDeployment {
    /// Whether HTTP requests are streamed ([`Deployment::STREAMING`]).
    pub streaming: bool,
    pub construct: Construct,
    pub encode_init: EncodeFromJson,
    pub encode_user_config: EncodeFromJson,
}

impl RegisteredDeployment {
    pub const fn of<D: Deployment>() -> Self {
        RegisteredDeployment {
            streaming: D::STREAMING,
            construct: construct::<D>,
            encode_init: encode_from_json::<D::Init>,
            encode_user_config: encode_from_json::<D::UserConfig>,
        }
    }
}

/// `value` as a `T`, encoded as the cluster encodes arguments.
fn encode_from_json<T: serde::Serialize + serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<Vec<u8>, EncodeFromJsonError> {
    let typed: T = serde_json::from_value(value)?;
    Ok(raylet::codec::encode(&typed)?)
}

/// What [`register_deployment!`](crate::register_deployment) expands to
/// refers to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use raylet;

    pub use super::RegisteredDeployment;
}

/// Registers a [`Deployment`] type so that replicas can build it.
#[macro_export]
macro_rules! register_deployment {
    ($deployment:ty) => {
        $crate::__private::raylet::__register!(
            Deployment,
            ::std::any::type_name::<$deployment>,
            &$crate::__private::RegisteredDeployment::of::<$deployment>()
        );
    };
}

/// The registered class called `name`.
pub(crate) fn find(name: &str) -> Result<&'static RegisteredDeployment, RegistryError> {
    raylet::find_registered(EntryKind::Deployment, name)
}

/// A deployment behind [`ErasedDeployment`].
struct Erased<D>(D);

impl<D: Deployment> ErasedDeployment for Erased<D> {
    fn call(self: Arc<Self>, head: Option<HttpHead>, body: Bytes) -> OutcomeFuture {
        Box::pin(async move {
            let request = match D::Request::decode_http(head, body) {
                Ok(request) => request,
                Err(error) => return Outcome::BadRequest(error.to_string()),
            };
            let response = match self.0.call(request).await {
                Ok(response) => response,
                Err(e) => return failure(e),
            };
            match response.encode() {
                Ok(body) => Outcome::Ok {
                    body: body.into(),
                    encoding: D::Response::ENCODING,
                },
                Err(e) => Outcome::UserError(format!("encoding the response: {e}")),
            }
        })
    }

    fn stream(self: Arc<Self>, head: Option<HttpHead>, body: Bytes) -> ChunkStream {
        let request = match D::Request::decode_http(head, body) {
            Ok(request) => request,
            Err(error) => {
                let bad_request = StreamChunk::BadRequest(error.to_string());
                return Box::pin(futures_util::stream::iter([bad_request]));
            }
        };
        let content_type = self.0.stream_content_type(&request);
        let chunks = self.0.stream(request).map(|chunk| match chunk {
            Ok(bytes) => StreamChunk::Data(bytes.into()),
            Err(e) => match http_error_of(&e) {
                Some(status) => StreamChunk::Status(status),
                None => StreamChunk::UserError(e.to_string()),
            },
        });
        let start = StreamChunk::Start {
            content_type,
            fullness: self.fullness(),
        };
        Box::pin(futures_util::stream::iter([start]).chain(chunks))
    }

    fn fullness(&self) -> Option<f64> {
        self.0.fullness().filter(|fullness| !fullness.is_nan())
    }

    fn figures(&self) -> Vec<Figure> {
        self.0.figures()
    }

    fn check_health(&self) -> Result<(), BoxError> {
        self.0.check_health()
    }

    fn reconfigure(&self, user_config: &[u8]) -> Result<(), ReconfigureError> {
        let config: D::UserConfig = raylet::codec::decode(user_config).map_err(ReconfigureError::Decode)?;
        self.0.reconfigure(config).map_err(ReconfigureError::Refused)
    }
}

/// What an error of user code answers: its status when it is an
/// [`HttpError`] (or a handle's [`ServeError::Status`] passed on), a user
/// error otherwise.
fn failure(error: BoxError) -> Outcome {
    match http_error_of(&error) {
        Some(status) => Outcome::Status(status),
        None => Outcome::UserError(error.to_string()),
    }
}

/// The [`HttpError`] an error of user code is or carries.
fn http_error_of(error: &BoxError) -> Option<HttpError> {
    if let Some(status) = error.downcast_ref::<HttpError>() {
        return Some(status.clone());
    }
    match error.downcast_ref::<ServeError>() {
        Some(ServeError::Status { error, .. }) => Some(error.clone()),
        _ => None,
    }
}

fn construct<D: Deployment>(
    init: &[u8],
    user_config: Option<&[u8]>,
    context: &ReplicaContext,
) -> Result<Arc<dyn ErasedDeployment>, ServeError> {
    let failed = |message: String| ServeError::ReplicaFailed {
        replica: context.replica.clone(),
        message,
    };
    let init: D::Init = raylet::codec::decode(init).map_err(|e| failed(format!("decoding its Init: {e}")))?;
    let deployment = D::new(init, context).map_err(|e| failed(e.to_string()))?;
    if let Some(config) = user_config {
        let config: D::UserConfig =
            raylet::codec::decode(config).map_err(|e| failed(format!("decoding its user config: {e}")))?;
        deployment
            .reconfigure(config)
            .map_err(|e| failed(format!("reconfigure: {e}")))?;
    }
    Ok(Arc::new(Erased(deployment)))
}
