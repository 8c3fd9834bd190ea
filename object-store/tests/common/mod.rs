//! A node's store served on its own loopback port, with a client, for
//! tests that run several stores in one process.

#![allow(dead_code, reason = "each test binary uses a part of the harness")]

use std::sync::Arc;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_object_store::{ObjectStoreServiceImpl, SharedStore, SpillDirectory, StoreClient, StoreConfig};
use raylet_proto::ObjectId;
use raylet_proto::server::{MAX_DATA_MESSAGE, authenticated, incoming};
use raylet_proto::v1::object_store_service_server::ObjectStoreServiceServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

pub const MIB: u64 = 1 << 20;
pub const OWNER: &str = "driver:1";
pub const WAIT: Duration = Duration::from_secs(10);

/// One node's store, served on its own port and, unless it serves objects
/// through gRPC only, on a transfer port, until dropped.
pub struct Node {
    pub store: Arc<SharedStore>,
    pub address: String,
    pub client: Arc<StoreClient>,
    _stop: oneshot::Sender<()>,
    _transfers: JoinSet<()>,
    _dir: tempfile::TempDir,
}

/// How a node serves its objects to other nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    TcpAndGrpc,
    GrpcOnly,
}

impl Node {
    pub async fn start(token: &AuthToken, capacity: u64) -> Node {
        Node::serving(token, capacity, Serving::TcpAndGrpc).await
    }

    pub async fn serving(token: &AuthToken, capacity: u64, serving: Serving) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            capacity,
            spill_to: std::sync::Arc::new(SpillDirectory(dir.path().join("spill"))),
            spill_limit: 4 << 30,
        };
        let store = SharedStore::new(config, token.clone()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let service = ObjectStoreServiceServer::new(ObjectStoreServiceImpl { store: store.clone() })
            .max_decoding_message_size(MAX_DATA_MESSAGE)
            .max_encoding_message_size(MAX_DATA_MESSAGE);
        let (stop, stopped) = oneshot::channel::<()>();
        let server = authenticated(token.clone())
            .unwrap()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming(listener), async {
                let _ = stopped.await;
            });
        tokio::spawn(server);
        let mut transfers = JoinSet::new();
        if serving == Serving::TcpAndGrpc {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let serving = store.clone().serve_transfers(listener);
            transfers.spawn(async move { match serving.await {} });
        }
        let client = connect_client(&address, token).await;
        Node {
            store,
            address,
            client,
            _stop: stop,
            _transfers: transfers,
            _dir: dir,
        }
    }

    /// Writes an object whose bytes follow `pattern(seed)`.
    pub async fn put(&self, size: u64, seed: u64) -> ObjectId {
        let id = ObjectId::random();
        let mut writer = self.client.create(id, size, OWNER, WAIT).await.unwrap();
        fill(&mut writer, seed);
        self.client.seal(writer, size).await.unwrap();
        id
    }

    pub async fn pull(&self, id: ObjectId, size: u64, sources: &[&Node]) -> raylet_object_store::Result<()> {
        let sources: Vec<String> = sources.iter().map(|node| node.address.clone()).collect();
        self.client.pull(id, size, OWNER, &sources, WAIT).await
    }

    pub async fn assert_holds(&self, id: ObjectId, size: u64, seed: u64) {
        let mapped = self.client.get(id).await.unwrap();
        assert_eq!(mapped.len() as u64, size);
        assert!(follows_pattern(&mapped, seed), "object {id} has the wrong bytes");
    }

    pub fn served(&self) -> u64 {
        self.store.usage().served
    }

    pub fn pulled(&self) -> u64 {
        self.store.usage().pulled
    }
}

pub async fn cluster(count: usize, capacity: u64) -> (AuthToken, Vec<Node>) {
    let token = AuthToken::generate();
    let mut nodes = Vec::new();
    for _ in 0..count {
        nodes.push(Node::start(&token, capacity).await);
    }
    (token, nodes)
}

/// The word at each 8-byte position `i`, mixed so that a misplaced chunk shows.
pub fn word(i: u64, seed: u64) -> u64 {
    (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
}

pub fn fill(bytes: &mut [u8], seed: u64) {
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let word = word(i as u64, seed).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

pub fn follows_pattern(bytes: &[u8], seed: u64) -> bool {
    bytes
        .chunks(8)
        .enumerate()
        .all(|(i, chunk)| chunk == &word(i as u64, seed).to_le_bytes()[..chunk.len()])
}

/// A new session with the store at `address`, as another process on its
/// node would open.
pub async fn connect_client(address: &str, token: &AuthToken) -> Arc<StoreClient> {
    let channel = raylet_proto::channel::connect(address, token, WAIT).await.unwrap();
    StoreClient::connect(channel, OWNER, None).await.unwrap()
}
