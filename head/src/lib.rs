//! The head: keeps the table of node incarnations, marks silent nodes dead,
//! answers `raylet status`, places, restarts and lists actors, reserves
//! placement groups, runs jobs, keeps a key-value store and a record of
//! tasks. A persistent head keeps its tables (all but the tasks) in its
//! state directory and recovers them when started there again.
//! [`simulation`] measures its placement on a thousand virtual nodes.

pub mod actors;
pub mod jobs;
pub mod kv;
mod node_table;
pub mod placement_groups;
mod pushed_metrics;
mod service;
pub mod simulation;
pub mod state_store;
pub mod tasks;
mod wire;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raylet_common::auth::AuthToken;
use raylet_placement::{LaunchableNodes, Placer};
use raylet_proto::Result;
use raylet_proto::server::{MAX_DATA_MESSAGE, authenticated, bounded_shutdown, incoming};
use raylet_proto::v1::actor_service_server::ActorServiceServer;
use raylet_proto::v1::head_service_server::HeadServiceServer;
use raylet_proto::v1::job_service_server::JobServiceServer;
use raylet_proto::v1::kv_service_server::KvServiceServer;
use raylet_proto::v1::placement_group_service_server::PlacementGroupServiceServer;
use raylet_proto::v1::task_event_service_server::TaskEventServiceServer;
use tokio::net::TcpListener;

pub use node_table::{Heartbeat, HeartbeatOutcome, NodeResourcesView, NodeTable, Registration};
pub use service::HeadError;
pub use wire::TextTooLong;

use actors::{ActorRuntime, ActorServiceImpl, ActorTable, HeadLeases, resume_actors};
use jobs::{JobManager, JobServiceImpl};
use kv::{KvServiceImpl, KvTable};
use placement_groups::{GroupManager, NodeManagerBundles, PlacementGroupServiceImpl, keep_placing};
use service::HeadServiceImpl;
use state_store::StateStore;
use tasks::{TaskEventServiceImpl, TaskTable};

/// The largest job service message the head decodes: a binary arrives in
/// chunks of [`raylet_proto::blob::CHUNK_BYTES`], and a job's spec is small.
const MAX_JOB_MESSAGE: usize = 16 << 20;

/// The largest actor service message the head decodes: an actor's spec,
/// which it keeps for restarts, arguments given by value included. Larger
/// arguments go by reference (`cluster.put`).
const MAX_ACTOR_MESSAGE: usize = 64 << 20;
/// Settings of a head.
#[derive(Clone, Debug)]
pub struct HeadConfig {
    pub token: AuthToken,
    /// A node whose heartbeats stop for this long is marked dead.
    pub heartbeat_timeout: Duration,
    /// Where the head keeps jobs' blobs, records and output.
    pub state_dir: PathBuf,
    /// The largest binary or file a job may upload, in bytes.
    pub max_blob_bytes: u64,
    /// Whether the tables are written to `state_dir` and recovered from
    /// it on start; a head that cannot be restarted (the embedded one)
    /// keeps them in memory only.
    pub persistent: bool,
    /// The node types the cluster's autoscaler may launch; work that only
    /// they fit waits for a launch instead of failing as infeasible.
    pub launchable: LaunchableNodes,
}

impl HeadConfig {
    pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
    pub const DEFAULT_MAX_BLOB_BYTES: u64 = 4 << 30;

    /// A config whose state would live in a new directory under the
    /// system's temporary directory (made only once a job comes).
    pub fn new(token: AuthToken) -> Self {
        let unique: u64 = rand::random();
        HeadConfig {
            token,
            heartbeat_timeout: Self::DEFAULT_HEARTBEAT_TIMEOUT,
            state_dir: std::env::temp_dir().join(format!("raylet-head-{unique:016x}")),
            max_blob_bytes: Self::DEFAULT_MAX_BLOB_BYTES,
            persistent: false,
            launchable: LaunchableNodes::default(),
        }
    }

    pub fn persistent(mut self, persistent: bool) -> Self {
        self.persistent = persistent;
        self
    }

    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = dir.into();
        self
    }

    pub fn max_blob_bytes(mut self, bytes: u64) -> Self {
        self.max_blob_bytes = bytes;
        self
    }

    pub fn launchable(mut self, launchable: LaunchableNodes) -> Self {
        self.launchable = launchable;
        self
    }

    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }
}

/// Runs a head on `listener` until `shutdown` resolves.
pub async fn run(config: HeadConfig, listener: TcpListener, shutdown: impl Future<Output = ()>) -> Result<()> {
    let store = match config.persistent {
        true => StateStore::open(&config.state_dir)?,
        false => StateStore::in_memory_only(),
    };
    let mut nodes = NodeTable::recover(config.heartbeat_timeout, store.clone(), Instant::now())?;
    nodes.set_launchable(config.launchable.clone());
    let table = Arc::new(Mutex::new(nodes));
    let groups = Arc::new(GroupManager::recover(
        table.clone(),
        NodeManagerBundles::new(config.token.clone()),
        store.clone(),
    )?);
    groups.release_unrecorded_reservations().await;
    let stopping = tokio::sync::watch::channel(false).0;
    let nodes = HeadServiceServer::new(HeadServiceImpl {
        table: table.clone(),
        groups: groups.clone(),
        stopping: stopping.subscribe(),
    });
    let (actor_table, recovered_actors) = ActorTable::recover(store.clone())?;
    let runtime = Arc::new(ActorRuntime {
        table: Arc::new(Mutex::new(actor_table)),
        nodes: table.clone(),
        leases: HeadLeases::new(config.token.clone(), config.persistent),
        placer: Mutex::new(Placer::new(rand::random())),
        groups: groups.clone(),
        next_bundle: Default::default(),
        token: config.token.clone(),
        stopping,
    });
    resume_actors(&runtime, recovered_actors);
    let stopping = runtime.clone();
    let (shutdown, clients_waited_for) = bounded_shutdown(async move {
        shutdown.await;
        stopping.stop_streams();
    });
    let placement_groups = PlacementGroupServiceServer::new(PlacementGroupServiceImpl {
        groups: groups.clone(),
        stopping: runtime.stopping.subscribe(),
    });
    let job_manager = JobManager::recover(
        &config.state_dir,
        config.max_blob_bytes,
        table.clone(),
        config.token.clone(),
        store.clone(),
    )?;
    let jobs = JobServiceServer::new(JobServiceImpl {
        jobs: job_manager,
        stopping: runtime.stopping.subscribe(),
    })
    .max_decoding_message_size(MAX_JOB_MESSAGE)
    .max_encoding_message_size(MAX_DATA_MESSAGE);
    let kv = KvServiceServer::new(KvServiceImpl {
        table: Arc::new(Mutex::new(KvTable::recover(store.clone())?)),
    })
    .max_decoding_message_size(kv::MAX_REQUEST_BYTES);
    let tasks = TaskEventServiceServer::new(TaskEventServiceImpl {
        table: Arc::new(Mutex::new(TaskTable::default())),
    })
    .max_decoding_message_size(tasks::MAX_REPORT_BYTES)
    .max_encoding_message_size(MAX_DATA_MESSAGE);
    let actors = ActorServiceServer::new(ActorServiceImpl { runtime })
        .max_decoding_message_size(MAX_ACTOR_MESSAGE)
        .max_encoding_message_size(MAX_DATA_MESSAGE);
    let server = authenticated(config.token)?
        .add_service(nodes)
        .add_service(actors)
        .add_service(placement_groups)
        .add_service(jobs)
        .add_service(kv)
        .add_service(tasks)
        .serve_with_incoming_shutdown(incoming(listener), shutdown);
    let result = tokio::select! {
        result = server => result,
        () = clients_waited_for => {
            tracing::info!("clients still hold calls open after the shutdown grace; ending them");
            Ok(())
        }
        never = detect_failures(table, config.heartbeat_timeout) => match never {},
        never = keep_placing(groups) => match never {},
    };
    if let Err(error) = store.flush().await {
        tracing::error!(%error, "the head's last changes are not on disk");
    }
    Ok(result?)
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
