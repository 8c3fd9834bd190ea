//! Optional TLS for every connection of a cluster: gRPC, task streams and
//! HTTP. A process is either in a TLS cluster or not: the certificate, key
//! and CA are given once (`--tls-cert/--tls-key/--tls-ca`, or the
//! `RAYLET_TLS_*` variables that workers and drivers inherit) and every
//! server and client of the process uses them. Cluster connections are
//! mutual: both ends show a certificate signed by the cluster's CA. HTTP
//! asks for no client certificate (browsers have none); the token guards it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::{Error, Result};

/// The variables that carry the TLS files to the processes a node starts.
pub const CERT_ENV: &str = "RAYLET_TLS_CERT";
pub const KEY_ENV: &str = "RAYLET_TLS_KEY";
pub const CA_ENV: &str = "RAYLET_TLS_CA";

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a process's TLS certificate, key and cluster CA are, as PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The three files, as absolute paths, when all are given; none when
    /// none is; and an error naming what is missing otherwise.
    pub fn from_options(cert: Option<PathBuf>, key: Option<PathBuf>, ca: Option<PathBuf>) -> Result<Option<Self>> {
        match (cert, key, ca) {
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles {
                cert: absolute(&cert, "certificate")?,
                key: absolute(&key, "key")?,
                ca: absolute(&ca, "CA")?,
            })),
            (None, None, None) => Ok(None),
            (cert, key, ca) => {
                let missing: Vec<&str> = [
                    (cert.is_none(), "--tls-cert"),
                    (key.is_none(), "--tls-key"),
                    (ca.is_none(), "--tls-ca"),
                ]
                .into_iter()
                .filter_map(|(missing, flag)| missing.then_some(flag))
                .collect();
                Err(Error::InvalidArgument(format!(
                    "TLS needs a certificate, its key and the cluster's CA together: {} missing",
                    missing.join(", ")
                )))
            }
        }
    }

    /// The files named by `RAYLET_TLS_CERT`, `RAYLET_TLS_KEY` and `RAYLET_TLS_CA`.
    pub fn from_env() -> Result<Option<Self>> {
        let path = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Self::from_options(path(CERT_ENV), path(KEY_ENV), path(CA_ENV))
    }

    /// The variables that give a child process these files.
    pub fn env(&self) -> [(&'static str, &Path); 3] {
        [(CERT_ENV, &self.cert), (KEY_ENV, &self.key), (CA_ENV, &self.ca)]
    }
}

/// A process's TLS material, loaded and checked once.
pub struct ClusterTls {
    files: TlsFiles,
    identity: Identity,
    ca: Certificate,
    cluster_server: Arc<ServerConfig>,
    http_server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

/// What loading this process's TLS gave: its material, none, or why the
/// files were refused (an invalid argument, kept to answer every caller).
static PROCESS_TLS: OnceLock<Result<Option<Arc<ClusterTls>>>> = OnceLock::new();

/// Sets this process's TLS (none for plaintext) before any connection is
/// made. Setting it again to the same files is harmless; to other files, an
/// error.
pub fn configure(files: Option<TlsFiles>) -> Result<()> {
    let wanted = files.clone();
    let loaded = PROCESS_TLS.get_or_init(|| load(files));
    match loaded {
        Err(error) => Err(error.clone()),
        Ok(current) if current.as_ref().map(|tls| &tls.files) == wanted.as_ref() => Ok(()),
        Ok(_) => Err(Error::InvalidArgument(
            "this process's TLS settings were already fixed by an earlier connection or by RAYLET_TLS_*".into(),
        )),
    }
}

/// This process's TLS: what [`configure`] set, else what `RAYLET_TLS_*`
/// name, else none.
pub fn current() -> Result<Option<Arc<ClusterTls>>> {
    let loaded = PROCESS_TLS.get_or_init(|| TlsFiles::from_env().and_then(load));
    loaded.clone()
}

/// The variables that give a child process (a worker, a job's driver) this
/// process's TLS; none without TLS.
pub fn child_env() -> Vec<(&'static str, PathBuf)> {
    match current() {
        Ok(Some(tls)) => tls.files().env().map(|(name, path)| (name, path.to_path_buf())).into(),
        _ => Vec::new(),
    }
}

fn load(files: Option<TlsFiles>) -> Result<Option<Arc<ClusterTls>>> {
    files.map(|files| ClusterTls::load(files).map(Arc::new)).transpose()
}

impl ClusterTls {
    /// Reads and checks the files: the certificate and key must match, and
    /// the CA must be a certificate.
    pub fn load(files: TlsFiles) -> Result<Self> {
        let cert_pem = read(&files.cert, "certificate")?;
        let key_pem = read(&files.key, "key")?;
        let ca_pem = read(&files.ca, "CA")?;
        let chain = certificates(&cert_pem, &files.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| bad(&files.key, format!("holds no PEM private key: {e}")))?;
        let roots = roots(&ca_pem, &files.ca)?;
        let mismatch = |e: rustls::Error| bad(&files.key, format!("does not go with {}: {e}", files.cert.display()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| bad(&files.ca, format!("cannot verify clients with it: {e}")))?;
        let server = |verifier| {
            ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .and_then(|builder| {
                    builder
                        .with_client_cert_verifier(verifier)
                        .with_single_cert(chain.clone(), key.clone_key())
                })
                .map_err(mismatch)
        };
        let cluster_server = server(verifier)?;
        let mut http_server = server(WebPkiClientVerifier::no_client_auth())?;
        http_server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_root_certificates(roots).with_client_auth_cert(chain, key))
            .map_err(mismatch)?;
        Ok(ClusterTls {
            identity: Identity::from_pem(cert_pem, key_pem),
            ca: Certificate::from_pem(ca_pem),
            files,
            cluster_server: Arc::new(cluster_server),
            http_server: Arc::new(http_server),
            client: Arc::new(client),
        })
    }

    /// The files this was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// For gRPC servers: this node's certificate, and clients must show one
    /// signed by the cluster's CA.
    pub fn grpc_server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// For gRPC clients: the server must show a certificate for `host`
    /// signed by the cluster's CA, and this process shows its own.
    pub fn grpc_client(&self, host: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
            .domain_name(host)
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// Accepts the cluster's task streams (clients show a certificate).
    pub fn stream_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.cluster_server.clone())
    }

    /// Accepts HTTPS from browsers and scrapers (no client certificate).
    pub fn http_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.http_server.clone())
    }

    /// Opens TLS on `socket` to the cluster peer `host`.
    pub async fn connect(&self, host: &str, socket: TcpStream) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| Error::InvalidArgument(format!("'{host}' is not a host name for TLS: {e}")))?;
        let handshake = TlsConnector::from(self.client.clone()).connect(name, socket);
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => Err(Error::Unavailable(format!("TLS with {host} failed: {error}"))),
            Err(_) => Err(Error::DeadlineExceeded(format!(
                "TLS with {host} did not complete within {HANDSHAKE_TIMEOUT:?}"
            ))),
        }
    }
}

fn absolute(path: &Path, what: &str) -> Result<PathBuf> {
    std::fs::canonicalize(path).map_err(|e| Error::InvalidArgument(format!("TLS {what} {}: {e}", path.display())))
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::InvalidArgument(format!("TLS {what} {}: {e}", path.display())))
}

fn bad(path: &Path, problem: String) -> Error {
    Error::InvalidArgument(format!("TLS file {}: {problem}", path.display()))
}

fn certificates(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(path, format!("not PEM certificates: {e}")))?;
    match chain.is_empty() {
        true => Err(bad(path, "holds no certificate".into())),
        false => Ok(chain),
    }
}

fn roots(pem: &[u8], path: &Path) -> Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(pem, path)? {
        roots
            .add(certificate)
            .map_err(|e| bad(path, format!("not a CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    /// A CA, and a certificate for 127.0.0.1 it signed, with its key.
    fn write_authority(dir: &Path) -> TlsFiles {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let node_key = KeyPair::generate().unwrap();
        let node = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&node_key, &Issuer::new(ca_params, ca_key))
            .unwrap();
        let files = TlsFiles {
            cert: dir.join("node.pem"),
            key: dir.join("node.key"),
            ca: dir.join("ca.pem"),
        };
        std::fs::write(&files.cert, node.pem()).unwrap();
        std::fs::write(&files.key, node_key.serialize_pem()).unwrap();
        std::fs::write(&files.ca, ca.pem()).unwrap();
        files
    }

    #[test]
    fn the_three_files_come_together_or_not_at_all() {
        assert_eq!(TlsFiles::from_options(None, None, None).unwrap(), None);
        let missing = TlsFiles::from_options(Some("a".into()), None, None)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("--tls-key, --tls-ca missing"), "{missing}");
        let absent = TlsFiles::from_options(Some("/no/cert".into()), Some("/no/key".into()), Some("/no/ca".into()))
            .unwrap_err()
            .to_string();
        assert!(absent.contains("TLS certificate /no/cert"), "{absent}");
    }

    #[test]
    fn good_files_load_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_authority(dir.path());
        assert!(ClusterTls::load(files.clone()).is_ok());

        let other = tempfile::tempdir().unwrap();
        let other_key = write_authority(other.path()).key;
        let mismatched = ClusterTls::load(TlsFiles {
            key: other_key,
            ..files.clone()
        })
        .err()
        .unwrap()
        .to_string();
        assert!(mismatched.contains("does not go with"), "{mismatched}");

        std::fs::write(dir.path().join("garbage.pem"), "not a certificate").unwrap();
        let garbage = ClusterTls::load(TlsFiles {
            ca: dir.path().join("garbage.pem"),
            ..files
        })
        .err()
        .unwrap()
        .to_string();
        assert!(
            garbage.contains("garbage.pem") && garbage.contains("no certificate"),
            "{garbage}"
        );
    }
}
