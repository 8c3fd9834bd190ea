//! Whole HTTP messages for deployments that serve an HTTP API of their own
//! (an OpenAI-compatible server, say): [`HttpRequest`], a request body
//! type that sees the method, the path below the application's route
//! prefix, the query and the content negotiation headers; and
//! [`HttpError`], an error user code returns to answer with any status,
//! content type and body.
//!
//! The proxy sends the request's [`HttpHead`] beside its body, so the body
//! is never copied into another encoding. A
//! [`DeploymentHandle`](crate::DeploymentHandle) has no head to send: it
//! encodes the whole [`HttpRequest`] with the cluster's codec, and the
//! replica decodes it back.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::deployment::{Body, BodyError, BoxError, Encoding};

/// The request headers the proxy passes on. `Authorization` never is: the
/// cluster token stays at the proxy.
pub(crate) const FORWARDED_HEADERS: [&str; 2] = ["content-type", "accept"];

/// An HTTP request without its body, as the proxy passes it on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpHead {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path below the application's route prefix, always starting
    /// with `/`: under prefix `/v1`, `/v1/chat/completions` is
    /// `/chat/completions` and `/v1` is `/`.
    pub path: String,
    /// What follows `?`, if anything does.
    pub query: Option<String>,
    /// `content-type` and `accept`, when the request has them (names in
    /// lower case).
    pub headers: Vec<(String, String)>,
}

/// A whole HTTP request, as a deployment's `type Request`: it gets every
/// method (`GET` included) and path under the application's route prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRequest {
    pub method: String,
    /// The path below the application's route prefix, always starting
    /// with `/` (see [`HttpHead::path`]).
    pub path: String,
    pub query: Option<String>,
    /// `content-type` and `accept`, when the request has them.
    pub headers: Vec<(String, String)>,
    #[serde(with = "bytes_field")]
    pub body: Bytes,
}

impl HttpRequest {
    /// The value of header `name` (case-insensitive), if the request has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        let header = self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name));
        header.map(|(_, value)| value.as_str())
    }

    /// The body as JSON of type `T`; the message says what is wrong.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

impl Body for HttpRequest {
    const ENCODING: Encoding = Encoding::Bytes;

    /// The whole request in the cluster's codec, as a handle sends it.
    fn encode(self) -> Result<Bytes, BoxError> {
        Ok(raylet::codec::encode(&self)?.into())
    }

    /// A whole request that a handle encoded.
    fn decode(bytes: Bytes) -> Result<Self, BodyError> {
        Ok(raylet::codec::decode(&bytes)?)
    }

    /// The request from the proxy's head and the raw body, or a whole
    /// request from a handle (no head).
    fn decode_http(head: Option<HttpHead>, body: Bytes) -> Result<Self, BodyError> {
        let Some(head) = head else {
            return Self::decode(body);
        };
        Ok(HttpRequest {
            method: head.method,
            path: head.path,
            query: head.query,
            headers: head.headers,
            body,
        })
    }
}

/// An answer with any status, content type and body. Returned as the
/// error of [`Deployment::call`](crate::Deployment::call) or, before the
/// first chunk, of [`Deployment::stream`](crate::Deployment::stream), the
/// proxy answers with exactly it; through a
/// [`DeploymentHandle`](crate::DeploymentHandle) the caller gets
/// [`ServeError::Status`](crate::ServeError::Status), which a deployment
/// can return in turn to pass the status on. A status outside 100..=999
/// is answered as 500.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpError {
    pub status: u16,
    pub content_type: String,
    #[serde(with = "bytes_field")]
    pub body: Bytes,
}

impl HttpError {
    pub fn new(status: u16, content_type: impl Into<String>, body: impl Into<Bytes>) -> Self {
        HttpError {
            status,
            content_type: content_type.into(),
            body: body.into(),
        }
    }

    /// A JSON body, such as OpenAI's `{"error": {"message": .., "type": ..}}`.
    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Self::new(status, Encoding::Json.content_type(), body.to_string())
    }

    /// A plain-text body.
    pub fn text(status: u16, message: impl Into<String>) -> Self {
        Self::new(status, "text/plain; charset=utf-8", message.into())
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}: {}", self.status, String::from_utf8_lossy(&self.body))
    }
}

impl std::error::Error for HttpError {}

/// [`Bytes`] as a serde byte string (the `bytes` crate's own serde
/// support is a feature this workspace does not turn on).
mod bytes_field {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        serde_bytes::ByteBuf::deserialize(deserializer).map(|bytes| Bytes::from(bytes.into_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> HttpRequest {
        HttpRequest {
            method: "POST".into(),
            path: "/chat/completions".into(),
            query: Some("verbose=1".into()),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from_static(b"{\"stream\": true}"),
        }
    }

    #[test]
    fn a_handle_sends_the_whole_request_and_the_proxy_the_head_beside_the_body() {
        let whole = request().encode().unwrap();
        assert_eq!(HttpRequest::decode_http(None, whole).unwrap(), request());
        let head = HttpHead {
            method: "POST".into(),
            path: "/chat/completions".into(),
            query: Some("verbose=1".into()),
            headers: vec![("content-type".into(), "application/json".into())],
        };
        let from_proxy = HttpRequest::decode_http(Some(head), request().body).unwrap();
        assert_eq!(from_proxy, request());
        assert_eq!(from_proxy.header("Content-Type"), Some("application/json"));
        assert_eq!(from_proxy.json::<serde_json::Value>().unwrap()["stream"], true);
    }

    #[test]
    fn an_http_error_says_its_status_and_body() {
        let error = HttpError::json(429, &serde_json::json!({"error": "slow down"}));
        assert_eq!(error.content_type, "application/json");
        assert_eq!(error.to_string(), r#"HTTP 429: {"error":"slow down"}"#);
        let boxed: BoxError = Box::new(error.clone());
        assert_eq!(boxed.downcast_ref::<HttpError>(), Some(&error));
    }
}
