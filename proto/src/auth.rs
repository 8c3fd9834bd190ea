//! Token authentication and protocol-version checks for every gRPC call,
//! in one client interceptor and one server interceptor.

use std::fmt;
use std::sync::Arc;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::{Error, PROTOCOL_VERSION, Result};

/// Metadata key that carries `Bearer <token>`.
pub const TOKEN_HEADER: &str = "authorization";
/// Metadata key that carries the caller's [`PROTOCOL_VERSION`].
pub const PROTOCOL_HEADER: &str = "x-raylet-protocol-version";

const MAX_TOKEN_LEN: usize = 256;

/// The cluster's shared secret. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(Arc<str>);

impl AuthToken {
    /// A new random token of 32 bytes, as 64 hex digits.
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        AuthToken(hex.into())
    }

    /// Reads a token given by a user or a file; surrounding whitespace is ignored.
    pub fn parse(text: &str) -> Result<Self> {
        let token = text.trim();
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(Error::InvalidArgument(format!(
                "the token must be 1 to {MAX_TOKEN_LEN} characters long"
            )));
        }
        if !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(Error::InvalidArgument(
                "the token must be printable ASCII without spaces".into(),
            ));
        }
        Ok(AuthToken(token.into()))
    }

    /// The secret itself, for writing to the session directory.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn bearer(&self) -> AsciiMetadataValue {
        format!("Bearer {}", self.0)
            .parse()
            .expect("a parsed token is printable ASCII")
    }

    /// Whether `presented` is this token (compared in constant time).
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), presented)
    }

    /// Whether an HTTP `Authorization` header value is `Bearer <this token>`.
    pub fn admits_bearer(&self, authorization: &[u8]) -> bool {
        authorization
            .strip_prefix(b"Bearer ")
            .is_some_and(|token| self.matches(token))
    }

    /// Admits a peer that speaks this [`PROTOCOL_VERSION`] and presents
    /// this token; the error says which is wrong, never showing a token.
    pub fn admit(&self, presented: Option<&[u8]>, peer_version: Option<&str>) -> Result<()> {
        check_protocol_version(peer_version)?;
        let presented = presented.ok_or_else(|| Error::Unauthenticated(missing_token_message()))?;
        if !self.matches(presented) {
            return Err(Error::Unauthenticated(
                "the cluster token is wrong; use the token from the head's session \
                 directory (--token, RAYLET_TOKEN or <temp-dir>/session_latest/token)"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Client side: adds the token and the protocol version to every call.
#[derive(Clone)]
pub struct ClientAuth {
    bearer: AsciiMetadataValue,
    version: AsciiMetadataValue,
}

impl ClientAuth {
    pub fn new(token: &AuthToken) -> Self {
        Self::with_version(token, PROTOCOL_VERSION)
    }

    /// A client that claims another protocol version; for compatibility tests.
    pub fn with_version(token: &AuthToken, version: u32) -> Self {
        ClientAuth {
            bearer: token.bearer(),
            version: AsciiMetadataValue::from(version),
        }
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let metadata = request.metadata_mut();
        metadata.insert(TOKEN_HEADER, self.bearer.clone());
        metadata.insert(PROTOCOL_HEADER, self.version.clone());
        Ok(request)
    }
}

/// Server side: rejects calls from another protocol version or without the token.
#[derive(Clone)]
pub struct ServerAuth {
    token: AuthToken,
}

impl ServerAuth {
    pub fn new(token: AuthToken) -> Self {
        ServerAuth { token }
    }

    fn check(&self, metadata: &MetadataMap) -> Result<()> {
        let version = metadata
            .get(PROTOCOL_HEADER)
            .map(|value| value.to_str().unwrap_or("<not text>"));
        let presented = metadata
            .get(TOKEN_HEADER)
            .map(|value| value.as_bytes().strip_prefix(b"Bearer ").unwrap_or(b""));
        self.token.admit(presented, version)
    }
}

fn missing_token_message() -> String {
    "no cluster token was sent; pass --token, set RAYLET_TOKEN, or run on a machine \
     whose session directory holds the token"
        .into()
}

fn check_protocol_version(peer: Option<&str>) -> Result<()> {
    let Some(peer) = peer else {
        return Err(Error::protocol_mismatch("<none>", PROTOCOL_VERSION));
    };
    if peer.parse::<u32>() != Ok(PROTOCOL_VERSION) {
        return Err(Error::protocol_mismatch(peer, PROTOCOL_VERSION));
    }
    Ok(())
}

impl Interceptor for ServerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(request.metadata())?;
        crate::connection_admission::prove_connection(request.extensions());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_from(client: &mut ClientAuth) -> Request<()> {
        client.call(Request::new(())).unwrap()
    }

    #[test]
    fn the_right_token_and_version_pass() {
        let token = AuthToken::generate();
        let mut server = ServerAuth::new(token.clone());
        assert!(server.call(request_from(&mut ClientAuth::new(&token))).is_ok());
    }

    #[test]
    fn a_wrong_or_missing_token_is_unauthenticated_without_leaking_it() {
        let token = AuthToken::generate();
        let wrong = AuthToken::generate();
        let mut server = ServerAuth::new(token.clone());
        let status = server.call(request_from(&mut ClientAuth::new(&wrong))).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(!status.message().contains(token.expose()));
        assert!(!status.message().contains(wrong.expose()));

        let mut bare = Request::new(());
        bare.metadata_mut().insert(PROTOCOL_HEADER, "1".parse().unwrap());
        let status = server.call(bare).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("no cluster token"));
    }

    #[test]
    fn another_protocol_version_is_rejected_with_both_versions() {
        let token = AuthToken::generate();
        let mut server = ServerAuth::new(token.clone());
        let mut old_client = ClientAuth::with_version(&token, 99);
        let status = server.call(request_from(&mut old_client)).unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains("version 99"), "{}", status.message());
        assert!(status.message().contains(&format!("version {PROTOCOL_VERSION}")));
    }

    #[test]
    fn tokens_are_validated_and_redacted() {
        assert!(AuthToken::parse("  abc \n").is_ok());
        assert!(AuthToken::parse("").is_err());
        assert!(AuthToken::parse("a b").is_err());
        assert_eq!(format!("{:?}", AuthToken::generate()), "AuthToken(<redacted>)");
    }
}
