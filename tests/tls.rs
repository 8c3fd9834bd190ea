//! A cluster of real `raylet` processes with TLS on: a head and a node
//! started with `--tls-cert/--tls-key/--tls-ca`, a driver (this test) that
//! runs tasks on the node and moves objects both ways, the CLI and the
//! dashboard and a Serve application's proxy over HTTPS. Plaintext clients, clients without a certificate
//! and clients whose certificate another CA signed are all refused, and
//! no process of the cluster listens on a same-node Unix socket.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{Daemons, RAYLET, head_address};
use raylet_common::auth::AuthToken;
use raylet_common::tls::TlsFiles;
use raylet_proto::v1::GetClusterStatusRequest;
use raylet_proto::v1::head_service_client::HeadServiceClient;
use raylet_serve::{
    Application, BoxError, Bytes, Deployment, DeploymentConfig, HttpOptions, ReplicaContext, register_deployment,
};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_bytes::ByteBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A CA and a certificate it signed for loopback, written as PEM files.
struct Authority {
    files: TlsFiles,
}

impl Authority {
    fn create(dir: &Path) -> Authority {
        std::fs::create_dir_all(dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let node_key = KeyPair::generate().unwrap();
        let node_params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let node = node_params.signed_by(&node_key, &issuer).unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        Authority {
            files: TlsFiles {
                cert: write("node.pem", node.pem()),
                key: write("node.key", node_key.serialize_pem()),
                ca: write("ca.pem", ca.pem()),
            },
        }
    }

    fn flags(&self) -> Vec<String> {
        let path = |p: &PathBuf| p.to_str().unwrap().to_string();
        vec![
            "--tls-cert".into(),
            path(&self.files.cert),
            "--tls-key".into(),
            path(&self.files.key),
            "--tls-ca".into(),
            path(&self.files.ca),
        ]
    }

    fn pem(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }
}

/// Runs `raylet ARGS --temp-dir TEMP` with `tls` flags; returns whether it
/// succeeded and what it printed on stdout and stderr.
fn raylet(temp: &Path, args: &[&str], tls: &[String]) -> (bool, String) {
    let output = Command::new(RAYLET)
        .args(args)
        .args(tls)
        .arg("--temp-dir")
        .arg(temp)
        .env_remove("RAYLET_TLS_CERT")
        .env_remove("RAYLET_TLS_KEY")
        .env_remove("RAYLET_TLS_CA")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The sum of a block's bytes, and a block of its own as large, made on
/// whichever node runs it.
#[raylet::remote]
fn sum_and_echo(block: ByteBuf) -> (u64, ByteBuf) {
    let sum = block.iter().map(|&b| b as u64).sum();
    (sum, ByteBuf::from(vec![3u8; block.len()]))
}

/// Answers a request's bytes in upper case.
struct Shout;
register_deployment!(Shout);

impl Deployment for Shout {
    type Init = ();
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Shout)
    }

    async fn call(&self, request: Bytes) -> Result<Bytes, BoxError> {
        Ok(request.to_ascii_uppercase().into())
    }
}

#[test]
fn a_cluster_with_tls_runs_tasks_moves_objects_and_serves_https_and_refuses_plaintext() {
    let temp = tempfile::tempdir().unwrap();
    let authority = Authority::create(&temp.path().join("tls"));
    let other = Authority::create(&temp.path().join("other"));
    let tls = authority.flags();
    let _daemons = Daemons(temp.path());

    let started = raylet(
        temp.path(),
        &[
            "start",
            "--head",
            "--port",
            "0",
            "--num-cpus",
            "0",
            "--dashboard-port",
            "0",
        ],
        &tls,
    );
    assert!(started.0, "{}", started.1);
    assert!(
        started.1.contains("speaks TLS only") && started.1.contains("https://"),
        "{}",
        started.1
    );
    let head = head_address(temp.path());
    let joined = raylet(temp.path(), &["start", "--address", &head, "--num-cpus", "2"], &tls);
    assert!(joined.0, "{}", joined.1);

    let (ok, status) = raylet(temp.path(), &["status", "--format", "json"], &tls);
    assert!(ok, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["alive_nodes"], 2, "{status}");
    let (ok, plaintext) = raylet(temp.path(), &["status"], &[]);
    assert!(!ok, "a CLI without TLS cannot read a TLS cluster: {plaintext}");
    assert!(
        plaintext.contains("seems to speak TLS") && plaintext.contains("--tls-cert"),
        "a CLI without TLS is told that the head speaks TLS: {plaintext}"
    );
    let (ok, foreign) = raylet(temp.path(), &["status"], &other.flags());
    assert!(!ok, "a CLI whose certificate another CA signed is refused: {foreign}");
    let (ok, half) = raylet(temp.path(), &["status", "--tls-cert", "/nonexistent.pem"], &[]);
    assert!(!ok && half.contains("--tls-key") && half.contains("--tls-ca"), "{half}");

    let config = raylet::Config::new().address(&head).temp_dir(temp.path());
    let driver = raylet::init_with(config.tls(authority.files.clone())).unwrap();
    let blocks: Vec<_> = (0..4u8)
        .map(|i| driver.put(&ByteBuf::from(vec![i; 4 << 20])).unwrap())
        .collect();
    let results: Vec<_> = blocks
        .iter()
        .map(|block| sum_and_echo::remote(&driver, block).unwrap())
        .collect();
    for (i, result) in results.iter().enumerate() {
        let (sum, echoed) = result.get().unwrap();
        assert_eq!(sum, i as u64 * (4 << 20));
        assert_eq!(echoed.len(), 4 << 20);
        assert!(echoed.iter().all(|&b| b == 3));
    }
    let workers: Vec<u32> = common::daemon_records(temp.path())
        .iter()
        .flat_map(|record| common::children_of(record["pid"].as_u64().unwrap() as u32))
        .collect();
    assert!(!workers.is_empty(), "the tasks ran in workers of the node");
    for pid in workers.into_iter().chain([std::process::id()]) {
        let sockets = common::same_node_sockets(pid);
        assert!(sockets.is_empty(), "with TLS, process {pid} listens on {sockets:?}");
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let token = std::fs::read_to_string(temp.path().join("session_latest/token")).unwrap();
    let token = AuthToken::parse(token.trim()).unwrap();
    runtime.block_on(serve_answers_over_https_only(&driver, token.expose(), &authority));
    driver.shutdown().unwrap();

    let dashboard = std::fs::read_to_string(temp.path().join("session_latest/dashboard_address")).unwrap();
    runtime.block_on(refuses_clients_without_the_clusters_certificate(
        &head, &token, &authority, &other,
    ));
    runtime.block_on(serves_https_only(dashboard.trim(), token.expose(), &authority));
}

/// Asks the head for the cluster's status with `token` over `channel`.
async fn cluster_status(channel: Channel, token: &AuthToken) -> Result<(), tonic::Status> {
    let authed =
        tonic::service::interceptor::InterceptedService::new(channel, raylet_common::auth::ClientAuth::new(token));
    HeadServiceClient::new(authed)
        .get_cluster_status(GetClusterStatusRequest::default())
        .await?;
    Ok(())
}

async fn tls_channel(head: &str, tls: ClientTlsConfig) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("https://{head}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

/// With the right token, only a client showing a certificate of the
/// cluster's CA is served.
async fn refuses_clients_without_the_clusters_certificate(
    head: &str,
    token: &AuthToken,
    authority: &Authority,
    other: &Authority,
) {
    let ca = Certificate::from_pem(Authority::pem(&authority.files.ca));
    let identity = Identity::from_pem(
        Authority::pem(&authority.files.cert),
        Authority::pem(&authority.files.key),
    );
    let member = tls_channel(
        head,
        ClientTlsConfig::new().ca_certificate(ca.clone()).identity(identity),
    )
    .await;
    cluster_status(member.unwrap(), token).await.unwrap();
    let plaintext = Channel::from_shared(format!("http://{head}")).unwrap().connect().await;
    assert_refused(plaintext, token, "a plaintext client").await;
    let anonymous = tls_channel(head, ClientTlsConfig::new().ca_certificate(ca.clone())).await;
    assert_refused(anonymous, token, "a client without a certificate").await;
    let foreign_identity = Identity::from_pem(Authority::pem(&other.files.cert), Authority::pem(&other.files.key));
    let foreign = tls_channel(
        head,
        ClientTlsConfig::new().ca_certificate(ca).identity(foreign_identity),
    )
    .await;
    assert_refused(foreign, token, "a client whose certificate another CA signed").await;
}

/// Either the connection or the call on it failed.
async fn assert_refused(channel: Result<Channel, tonic::transport::Error>, token: &AuthToken, who: &str) {
    if let Ok(channel) = channel {
        let answered = cluster_status(channel, token).await;
        assert!(answered.is_err(), "{who} is refused");
    }
}

/// One HTTPS GET with the cluster's CA; the status line and body.
async fn https_get(address: &str, path: &str, token: &str, ca: &Path) -> String {
    https_request(address, "GET", path, token, "", ca).await
}

/// One HTTPS request with the cluster's CA; the status line and body.
async fn https_request(address: &str, method: &str, path: &str, token: &str, body: &str, ca: &Path) -> String {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    https_exchange(address, &request, ca).await
}

/// Sends `request` as it is over HTTPS with the cluster's CA; the reply.
async fn https_exchange(address: &str, request: &str, ca: &Path) -> String {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(certificate.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, socket)
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    reply
}

/// A Serve application on the TLS cluster: its proxy answers HTTPS with the
/// token, refuses a wrong token, and serves no plain HTTP.
async fn serve_answers_over_https_only(driver: &raylet::Cluster, token: &str, authority: &Authority) {
    let shout = DeploymentConfig::new::<Shout>("shout", ()).unwrap().num_cpus(0.5);
    let app = Application::new("shout", "/shout").deployment(shout);
    let app = raylet_serve::run_with(driver, app, HttpOptions::default().port(0)).unwrap();
    let proxy = app.address().to_string();
    let ca = &authority.files.ca;
    let answer = https_request(&proxy, "POST", "/shout", token, "quiet please", ca).await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("QUIET PLEASE"),
        "{answer}"
    );
    let refused = https_request(&proxy, "POST", "/shout", "wrong", "quiet", ca).await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(
        !plain_http_answers(&proxy, "/-/healthz").await,
        "the proxy serves no plain HTTP"
    );
    app.shutdown().unwrap();
}

/// Whether a plain-HTTP GET of `path` at `address` gets a 200.
async fn plain_http_answers(address: &str, path: &str) -> bool {
    let reply = tokio::time::timeout(Duration::from_secs(5), async {
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        socket
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut reply = Vec::new();
        let _ = socket.read_to_end(&mut reply).await;
        reply
    })
    .await
    .unwrap();
    reply.starts_with(b"HTTP/1.1 200")
}

async fn serves_https_only(dashboard: &str, token: &str, authority: &Authority) {
    let healthz = https_get(dashboard, "/healthz", "", &authority.files.ca).await;
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    let nodes = https_get(dashboard, "/api/nodes", token, &authority.files.ca).await;
    assert!(nodes.starts_with("HTTP/1.1 200") && nodes.contains("ALIVE"), "{nodes}");
    let refused = https_get(dashboard, "/api/nodes", "wrong", &authority.files.ca).await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let form = format!("token={token}");
    let login = format!(
        "POST /login HTTP/1.1\r\nHost: {dashboard}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    );
    let login = https_exchange(dashboard, &login, &authority.files.ca).await;
    let cookie = login
        .lines()
        .find(|line| line.starts_with("set-cookie: raylet_token="))
        .unwrap_or_else(|| panic!("the login sets no cookie: {login}"));
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly") && !cookie.contains(token),
        "over HTTPS the login cookie is Secure and holds no token: {cookie}"
    );
    println!("the login cookie over HTTPS: {cookie}");
    let targets = https_get(dashboard, "/api/prometheus_targets", token, &authority.files.ca).await;
    let body = targets.split_once("\r\n\r\n").unwrap().1;
    let targets: serde_json::Value = serde_json::from_str(body).unwrap();
    let node = targets
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["labels"]["is_head_node"] == "false")
        .unwrap();
    assert_eq!(node["labels"]["__scheme__"], "https");
    let node_metrics = node["targets"][0].as_str().unwrap();
    let metrics = https_get(node_metrics, "/metrics", token, &authority.files.ca).await;
    assert!(
        metrics.starts_with("HTTP/1.1 200") && metrics.contains("raylet_"),
        "{metrics}"
    );
    assert!(
        !plain_http_answers(dashboard, "/healthz").await,
        "plain HTTP is not served"
    );
}
