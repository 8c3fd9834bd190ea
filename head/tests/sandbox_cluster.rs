//! In-process clusters: membership, failure detection, incarnations, auth and
//! protocol checks over real gRPC on loopback.

use std::time::{Duration, Instant};

use raylet_cluster_status::NodeState;
use raylet_common::auth::{AuthToken, ClientAuth};
use raylet_node::{NodeConfig, NodeManager};
use raylet_proto::channel::endpoint;
use raylet_proto::resources::CPU;
use raylet_proto::v1::head_service_client::HeadServiceClient;
use raylet_proto::v1::job_service_client::JobServiceClient;
use raylet_proto::v1::lease_session_request::Kind as LeaseKind;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{BlobChunk, GetClusterStatusRequest, LeaseSessionRequest, WorkerBinary};
use raylet_proto::{Amount, Error, ResourceSet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::service::interceptor::InterceptedService;

use crate::sandbox::ClusterSandbox;

const TIMEOUT: Duration = Duration::from_millis(600);
const INTERVAL: Duration = Duration::from_millis(100);

async fn sandbox(nodes: usize) -> ClusterSandbox {
    ClusterSandbox::builder()
        .nodes(nodes)
        .node_resources(ResourceSet::new().with(CPU, Amount::parse(CPU, 1.5).unwrap()))
        .heartbeat_timeout(TIMEOUT)
        .heartbeat_interval(INTERVAL)
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn nodes_register_and_their_resources_add_up() {
    let sandbox = sandbox(3).await;
    let status = sandbox.cluster_status().await.unwrap();
    assert_eq!(status.alive().count(), 3);
    assert_eq!(status.total().get(CPU).to_string(), "4.5");
    assert!(status.nodes.iter().all(|n| n.incarnation == 1));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn heartbeats_carry_utilization() {
    let sandbox = sandbox(1).await;
    let status = sandbox
        .wait_for(Duration::from_secs(5), |s| {
            s.nodes.iter().all(|n| n.stats.memory_total_bytes > 0)
        })
        .await
        .unwrap();
    assert!(status.nodes[0].stats.memory_used_bytes > 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_killed_node_is_marked_dead_within_the_timeout() {
    let mut sandbox = sandbox(2).await;
    let victim = sandbox.node_id(1);
    let killed_at = Instant::now();
    sandbox.kill_node(1);
    let status = sandbox
        .wait_for(TIMEOUT * 4, |s| s.dead().any(|n| n.node_id == victim))
        .await
        .unwrap();
    let detected_after = killed_at.elapsed();
    // The last heartbeat came at most one interval before the kill.
    assert!(
        detected_after >= TIMEOUT - INTERVAL,
        "marked dead too early: {detected_after:?}"
    );
    assert_eq!(status.alive().count(), 1);
    assert_eq!(status.total().get(CPU).to_string(), "1.5");
    let dead = status.dead().next().unwrap();
    assert!(dead.death_reason.as_ref().unwrap().contains("no heartbeat"));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_node_that_returns_is_a_new_incarnation() {
    let mut sandbox = sandbox(1).await;
    let node = sandbox.node_id(0);
    sandbox.kill_node(0);
    sandbox.wait_for(TIMEOUT * 4, |s| s.alive().count() == 0).await.unwrap();
    sandbox.restart_node(0).await.unwrap();
    let status = sandbox.cluster_status().await.unwrap();
    let incarnations: Vec<_> = status
        .nodes
        .iter()
        .filter(|n| n.node_id == node)
        .map(|n| (n.incarnation, n.state))
        .collect();
    assert_eq!(incarnations, [(2, NodeState::Alive), (1, NodeState::Dead)]);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stopped_node_leaves_with_its_reason() {
    let mut sandbox = sandbox(2).await;
    sandbox.stop_node(0).await.unwrap();
    let status = sandbox.cluster_status().await.unwrap();
    assert_eq!(status.alive().count(), 1);
    let dead = status.dead().next().unwrap();
    assert!(dead.death_reason.as_ref().unwrap().contains("left the cluster"));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_wrong_token_is_refused_without_revealing_either_token() {
    let sandbox = sandbox(0).await;
    let wrong = AuthToken::generate();
    let config = NodeConfig::new(sandbox.head_address(), wrong.clone(), ResourceSet::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = NodeManager::start(config, listener).await.err().unwrap();
    assert!(matches!(error, Error::Unauthenticated(_)), "{error}");
    let text = error.to_string();
    assert!(text.contains("token is wrong"), "{text}");
    assert!(!text.contains(wrong.expose()) && !text.contains(sandbox.token().expose()));
    assert_eq!(sandbox.cluster_status().await.unwrap().nodes.len(), 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_peer_with_another_protocol_version_is_rejected_naming_both() {
    let sandbox = sandbox(0).await;
    let channel = endpoint(sandbox.head_address()).unwrap().connect().await.unwrap();
    let auth = ClientAuth::with_version(sandbox.token(), 42);
    let mut client = HeadServiceClient::new(InterceptedService::new(channel, auth));
    let status = client.get_cluster_status(GetClusterStatusRequest {}).await.unwrap_err();
    let error = Error::from(status).to_string();
    assert!(error.contains("version 42"), "{error}");
    assert!(
        error.contains(&format!("version {}", raylet_proto::PROTOCOL_VERSION)),
        "{error}"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn garbage_on_the_head_port_does_not_hurt_it() {
    let sandbox = sandbox(1).await;
    let mut stream = tokio::net::TcpStream::connect(sandbox.head_address()).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff garbage")
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut reply)).await;
    assert_eq!(sandbox.cluster_status().await.unwrap().alive().count(), 1);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn joining_a_head_that_is_not_there_fails_in_bounded_time() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = listener.local_addr().unwrap().to_string();
    drop(listener);
    let config =
        NodeConfig::new(nowhere, AuthToken::generate(), ResourceSet::new()).connect_timeout(Duration::from_millis(700));
    let started = Instant::now();
    let node_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = NodeManager::start(config, node_listener).await.err().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(error.to_string().contains("could not reach"), "{error}");
}

/// Opens a lease session for `path` claiming `hash`; returns the refusal.
async fn refused_lease_session(sandbox: &ClusterSandbox, path: &str, hash: &str) -> String {
    let channel = raylet_proto::channel::connect(sandbox.node_address(0), sandbox.token(), Duration::from_secs(5))
        .await
        .unwrap();
    let binary = WorkerBinary {
        path: path.into(),
        hash: hash.into(),
        namespace: String::new(),
    };
    let open = LeaseSessionRequest {
        kind: Some(LeaseKind::Open(binary)),
    };
    let reply = NodeManagerServiceClient::new(channel)
        .lease_session(tokio_stream::iter(vec![open]))
        .await;
    match reply {
        Ok(_) => panic!("the session must be refused"),
        Err(status) => Error::from(status).to_string(),
    }
}

#[tokio::test]
async fn a_lease_session_for_another_build_of_the_binary_is_refused_naming_both_hashes() {
    let sandbox = sandbox(1).await;
    let claimed = "0".repeat(32);
    let error = refused_lease_session(&sandbox, "/bin/sh", &claimed).await;
    let actual = raylet_common::binary_hash::hash_file(std::path::Path::new("/bin/sh")).unwrap();
    assert!(error.contains(&claimed) && error.contains(&actual), "{error}");
    assert!(error.contains("rebuilt"), "{error}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lease_session_for_a_binary_the_node_lacks_is_refused() {
    let sandbox = sandbox(1).await;
    let error = refused_lease_session(&sandbox, "/no/such/binary", &"0".repeat(32)).await;
    assert!(error.contains("/no/such/binary is not on this node"), "{error}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_worker_binary_missing_on_a_node_is_fetched_from_the_head_when_a_job_brought_it() {
    let sandbox = sandbox(1).await;
    let binary = std::path::Path::new("/bin/true");
    let blob = raylet_proto::blob::blob_of_file(binary).unwrap();
    let build_hash = raylet_common::binary_hash::hash_file(binary).unwrap();
    let missing = "/no/such/dir/true";
    let refused = refused_lease_session(&sandbox, missing, &build_hash).await;
    assert!(refused.contains("is not on this node"), "{refused}");

    let head = raylet_proto::channel::connect(sandbox.head_address(), sandbox.token(), Duration::from_secs(5))
        .await
        .unwrap();
    let chunk = BlobChunk {
        blob: Some(blob.clone()),
        data: std::fs::read(binary).unwrap().into(),
    };
    let stored = JobServiceClient::new(head)
        .upload_blob(tokio_stream::iter(vec![chunk]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stored.bytes_stored, blob.size);

    let channel = raylet_proto::channel::connect(sandbox.node_address(0), sandbox.token(), Duration::from_secs(5))
        .await
        .unwrap();
    let open = LeaseSessionRequest {
        kind: Some(LeaseKind::Open(WorkerBinary {
            path: missing.into(),
            hash: build_hash,
            namespace: String::new(),
        })),
    };
    let opened = tokio::time::timeout(
        Duration::from_secs(10),
        NodeManagerServiceClient::new(channel).lease_session(tokio_stream::iter(vec![open])),
    )
    .await
    .expect("the node answers the session in time");
    assert!(
        opened.is_ok(),
        "the node fetched the binary by its build hash: {:?}",
        opened.err()
    );
    drop(opened);
    sandbox.shutdown().await.unwrap();
}
