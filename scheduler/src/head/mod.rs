//! The head: keeps the table of node incarnations, marks silent nodes dead,
//! answers `raylet status`, places, restarts and lists actors, and reserves
//! placement groups.

pub mod actors;
mod node_table;
pub mod placement_groups;
mod service;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raylet_proto::auth::AuthToken;
use raylet_proto::server::{MAX_DATA_MESSAGE, authenticated, incoming};
use raylet_proto::v1::actor_service_server::ActorServiceServer;
use raylet_proto::v1::head_service_server::HeadServiceServer;
use raylet_proto::v1::placement_group_service_server::PlacementGroupServiceServer;
use tokio::net::TcpListener;

pub use node_table::{Heartbeat, HeartbeatOutcome, NodeResourcesView, NodeTable, Registration};

use crate::Result;
use crate::placement::Placer;
use actors::{ActorRuntime, ActorServiceImpl, ActorTable, HeadLeases};
use placement_groups::{GroupManager, NodeManagerBundles, PlacementGroupServiceImpl, keep_placing};
use service::HeadServiceImpl;

/// Settings of a head.
#[derive(Clone, Debug)]
pub struct HeadConfig {
    pub token: AuthToken,
    /// A node whose heartbeats stop for this long is marked dead.
    pub heartbeat_timeout: Duration,
}

impl HeadConfig {
    pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

    pub fn new(token: AuthToken) -> Self {
        HeadConfig {
            token,
            heartbeat_timeout: Self::DEFAULT_HEARTBEAT_TIMEOUT,
        }
    }

    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }
}

/// Runs a head on `listener` until `shutdown` resolves.
pub async fn run(config: HeadConfig, listener: TcpListener, shutdown: impl Future<Output = ()>) -> Result<()> {
    let table = Arc::new(Mutex::new(NodeTable::new(config.heartbeat_timeout)));
    let groups = Arc::new(GroupManager::new(
        table.clone(),
        NodeManagerBundles::new(config.token.clone()),
    ));
    let nodes = HeadServiceServer::new(HeadServiceImpl {
        table: table.clone(),
        groups: groups.clone(),
    });
    let runtime = Arc::new(ActorRuntime {
        table: Arc::new(Mutex::new(ActorTable::default())),
        nodes: table.clone(),
        leases: HeadLeases::new(config.token.clone()),
        placer: Mutex::new(Placer::new(rand::random())),
        groups: groups.clone(),
        next_bundle: Default::default(),
        token: config.token.clone(),
        stopping: tokio::sync::watch::channel(false).0,
    });
    let stopping = runtime.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.stop_streams();
    };
    let placement_groups = PlacementGroupServiceServer::new(PlacementGroupServiceImpl {
        groups: groups.clone(),
        stopping: runtime.stopping.subscribe(),
    });
    let actors = ActorServiceServer::new(ActorServiceImpl { runtime })
        .max_decoding_message_size(MAX_DATA_MESSAGE)
        .max_encoding_message_size(MAX_DATA_MESSAGE);
    let server = authenticated(config.token)
        .add_service(nodes)
        .add_service(actors)
        .add_service(placement_groups)
        .serve_with_incoming_shutdown(incoming(listener), shutdown);
    tokio::select! {
        result = server => Ok(result?),
        never = detect_failures(table, config.heartbeat_timeout) => match never {},
        never = keep_placing(groups) => match never {},
    }
}

/// Checks for silent nodes several times per timeout, forever.
async fn detect_failures(table: Arc<Mutex<NodeTable>>, timeout: Duration) -> std::convert::Infallible {
    let period = (timeout / 5).max(Duration::from_millis(20));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut table = table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        table.detect_failures(Instant::now());
    }
}
