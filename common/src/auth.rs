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

    /// Whether an HTTP `Authorization` header value is `Bearer <this token>`
    /// (the scheme in any case, as RFC 7235 has it).
    pub fn admits_bearer(&self, authorization: &[u8]) -> bool {
        bearer_credentials(authorization).is_some_and(|token| self.matches(token))
    }

    /// A value derived from the token for `label`, as 64 hex digits: the
    /// HMAC-SHA256 of `label` keyed by the token. It proves that its holder
    /// had the token without being the token, so it can stand for the
    /// token in one place (the dashboard's login cookie) and nowhere else.
    pub fn derive(&self, label: &str) -> String {
        hex(&hmac_sha256(self.0.as_bytes(), label.as_bytes()))
    }

    /// Whether `presented` is [`AuthToken::derive`] of `label` (compared
    /// in constant time).
    pub fn admits_derived(&self, label: &str, presented: &[u8]) -> bool {
        constant_time_eq(self.derive(label).as_bytes(), presented)
    }

    /// Admits a peer that presents this token and speaks this
    /// [`PROTOCOL_VERSION`]; the error says which is wrong, never showing a
    /// token. The token is checked first, so that a caller without it
    /// learns nothing, not even the version.
    pub fn admit(&self, presented: Option<&[u8]>, peer_version: Option<&str>) -> Result<()> {
        let presented = presented.ok_or_else(|| Error::Unauthenticated(missing_token_message()))?;
        if !self.matches(presented) {
            return Err(Error::Unauthenticated(
                "the cluster token is wrong; use the token from the head's session \
                 directory (--token, RAYLET_TOKEN or <temp-dir>/session_latest/token)"
                    .into(),
            ));
        }
        check_protocol_version(peer_version)
    }
}

/// The credentials of an `Authorization` value of the `Bearer` scheme: the
/// scheme matches in any case and one or more spaces follow it (RFC 7235).
pub fn bearer_credentials(authorization: &[u8]) -> Option<&[u8]> {
    let space = authorization.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = authorization.split_at(space);
    let credentials = rest.trim_ascii_start();
    (scheme.eq_ignore_ascii_case(b"bearer") && !credentials.is_empty()).then_some(credentials)
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
            .map(|value| bearer_credentials(value.as_bytes()).unwrap_or(b""));
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
    fn a_caller_without_the_token_learns_nothing_of_the_version() {
        let token = AuthToken::generate();
        let mut server = ServerAuth::new(token.clone());
        let mut wrong_and_old = ClientAuth::with_version(&AuthToken::generate(), 99);
        let status = server.call(request_from(&mut wrong_and_old)).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{}", status.message());
        assert!(!status.message().contains("version"), "{}", status.message());

        let mut bare = Request::new(());
        bare.metadata_mut().insert(PROTOCOL_HEADER, "99".parse().unwrap());
        let status = server.call(bare).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{}", status.message());
        assert!(!status.message().contains("version"), "{}", status.message());

        let admitted = token.admit(Some(b"wrong"), None).unwrap_err();
        assert!(matches!(admitted, Error::Unauthenticated(_)), "{admitted}");
    }

    #[test]
    fn the_bearer_scheme_matches_in_any_case() {
        let token = AuthToken::generate();
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            for gap in [" ", "  "] {
                let value = format!("{scheme}{gap}{}", token.expose());
                assert!(token.admits_bearer(value.as_bytes()), "{scheme:?}{gap:?}");
                let mut request = Request::new(());
                request.metadata_mut().insert(TOKEN_HEADER, value.parse().unwrap());
                request.metadata_mut().insert(PROTOCOL_HEADER, "1".parse().unwrap());
                assert!(
                    ServerAuth::new(token.clone()).call(request).is_ok(),
                    "{scheme:?} over gRPC"
                );
            }
        }
        for refused in [
            format!("Basic {}", token.expose()),
            format!("Bearer{}", token.expose()),
            format!("Bearers {}", token.expose()),
            token.expose().to_string(),
            "Bearer ".to_string(),
            "Bearer wrong".to_string(),
        ] {
            assert!(!token.admits_bearer(refused.as_bytes()), "{refused:?}");
        }
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test cases 1 and 6 (a key longer than a block).
        let mac = hmac_sha256(&[0x0b; 20], b"Hi There");
        assert_eq!(
            hex(&mac),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        let mac = hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(
            hex(&mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_derived_value_is_not_the_token_and_admits_only_itself() {
        let token = AuthToken::generate();
        let derived = token.derive("raylet dashboard login");
        assert_eq!(derived.len(), 64);
        assert_ne!(derived, token.expose());
        assert!(token.admits_derived("raylet dashboard login", derived.as_bytes()));
        assert!(!token.admits_derived("raylet dashboard login", token.expose().as_bytes()));
        assert!(!token.admits_derived("another label", derived.as_bytes()));
        assert!(!AuthToken::generate().admits_derived("raylet dashboard login", derived.as_bytes()));
        assert!(!token.matches(derived.as_bytes()), "the derived value is no token");
    }

    #[test]
    fn tokens_are_validated_and_redacted() {
        assert!(AuthToken::parse("  abc \n").is_ok());
        assert!(AuthToken::parse("").is_err());
        assert!(AuthToken::parse("a b").is_err());
        assert_eq!(format!("{:?}", AuthToken::generate()), "AuthToken(<redacted>)");
    }
}
