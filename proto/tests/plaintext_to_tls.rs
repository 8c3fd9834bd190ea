//! A process without TLS that calls a peer speaking TLS gets an error that
//! says so and names the TLS flags, instead of "operation was canceled";
//! a plaintext peer that hangs up gets no such hint.

use std::sync::Arc;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::channel::{connect_head, speaks_tls};
use raylet_proto::v1::GetClusterStatusRequest;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, ServerConfig};

const PATIENCE: Duration = Duration::from_secs(2);

/// A server on loopback that speaks TLS (and nothing after the handshake).
async fn tls_server() -> String {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move { drop(acceptor.accept(stream).await) });
        }
    });
    address
}

/// A plaintext server that accepts connections and closes them at once.
async fn hanging_up_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    address
}

/// The error of asking the head at `address` for the cluster's status.
async fn status_error(address: &str) -> String {
    let token = AuthToken::generate();
    let failed = async {
        let mut head = connect_head(address, &token, PATIENCE).await?;
        head.get_cluster_status(GetClusterStatusRequest::default()).await?;
        Ok::<(), raylet_proto::Error>(())
    };
    let error: raylet_proto::Error = failed.await.expect_err("the call cannot succeed");
    error.to_string()
}

#[tokio::test]
async fn a_plaintext_call_to_a_tls_peer_says_that_it_speaks_tls() {
    let address = tls_server().await;
    assert!(speaks_tls(&address).await);
    let error = status_error(&address).await;
    println!("{error}");
    assert!(error.contains(&format!("{address} seems to speak TLS")), "{error}");
    for cure in ["--tls-cert", "--tls-key", "--tls-ca", "RAYLET_TLS_CERT"] {
        assert!(error.contains(cure), "{error} does not name {cure}");
    }
}

#[tokio::test]
async fn a_plaintext_peer_that_hangs_up_gets_no_tls_hint() {
    let address = hanging_up_server().await;
    assert!(!speaks_tls(&address).await);
    let error = status_error(&address).await;
    println!("{error}");
    assert!(!error.contains("TLS"), "{error}");

    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = closed.local_addr().unwrap().to_string();
    drop(closed);
    assert!(!speaks_tls(&nowhere).await, "nothing listens at {nowhere}");
}
