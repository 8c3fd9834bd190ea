//! The node manager: one per machine. It registers with the head, sends a
//! heartbeat with its resources and utilization every interval, registers
//! anew when the head has marked it dead, serves its own gRPC service, and
//! ends workers when the machine runs out of memory.

mod binary_cache;
mod blob_fetch;
mod bundle_ops;
mod gpu_devices;
mod gpus;
mod heartbeat;
mod job_drivers;
mod job_layout;
mod leasing;
mod ledger;
mod memory_monitor;
mod node_manager_error;
mod resources;
mod service;
mod stats;
mod worker_launcher;
mod worker_logs;
mod worker_process;
mod worker_stacks;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raylet_cluster_status::NodeStats;
use raylet_common::auth::AuthToken;
use raylet_common::log_rotation::RotationSettings;
use raylet_object_store::{ObjectStoreServiceImpl, SharedStore, SpillDirectory, SpillTarget, StoreConfig, owner_watch};
use raylet_proto::channel::HeadClient;
use raylet_proto::resources::OBJECT_STORE_MEMORY;
use raylet_proto::server::{MAX_DATA_MESSAGE, authenticated, bounded_shutdown, incoming};
use raylet_proto::v1::node_manager_service_server::NodeManagerServiceServer;
use raylet_proto::v1::object_store_service_server::ObjectStoreServiceServer;
use raylet_proto::{Labels, NodeId, ResourceSet, Result};
use tokio::net::TcpListener;

pub use bundle_ops::BundleError;
pub use gpu_devices::{FakeGpus, GpuDetector, NvmlDetector};
pub use leasing::NodeView;
pub use ledger::ResourceLedger;
pub use memory_monitor::MemoryMonitorConfig;
pub use node_manager_error::NodeManagerError;
pub use resources::{ResourceOverrides, resolve as resolve_resources};

use job_drivers::JobDrivers;
use leasing::{LeaseManager, WorkerContext};
use worker_process::ProcessLauncher;

/// Settings of a node manager.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub head_address: String,
    pub token: AuthToken,
    pub node_id: NodeId,
    pub resources: ResourceSet,
    /// Labels that label selectors match, from `--labels k=v,..`.
    pub labels: Labels,
    /// Where this node's `/metrics` is served, told to the head.
    pub metrics_address: Option<String>,
    pub is_head_node: bool,
    pub heartbeat_interval: Duration,
    /// How long to keep retrying an unreachable head before giving up.
    pub connect_timeout: Duration,
    /// How long the workers of the head's actors outlive the head's lease
    /// session, for a restarted head to adopt them.
    pub adoption_grace: Duration,
    /// The object store spills into `<spill_root>/<node id>`, which is
    /// removed when the node stops.
    pub spill_root: PathBuf,
    /// Where the object store spills instead of `<spill_root>/<node id>`:
    /// a bucket of object storage, say.
    pub spill_to: Option<Arc<dyn SpillTarget>>,
    /// Bytes the spilled objects may take [default: 90% of the space free
    /// in the spill directory's file system at start; no bound elsewhere].
    pub spill_limit: Option<u64>,
    pub memory_monitor: MemoryMonitorConfig,
    /// Job drivers run in, and blobs are cached under, `<work_root>/<node id>`.
    pub work_root: PathBuf,
    /// Reads the machine's GPUs for the heartbeat: NVML, or a fake in tests.
    pub gpu_detector: Arc<dyn GpuDetector>,
}

impl NodeConfig {
    pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    /// As long as drivers wait for a head to come back.
    pub const DEFAULT_ADOPTION_GRACE: Duration = Duration::from_secs(60);

    /// A config for a node that joins the head at `head_address`, with the
    /// given total resources (see [`resolve_resources`]).
    pub fn new(head_address: impl Into<String>, token: AuthToken, resources: ResourceSet) -> Self {
        NodeConfig {
            head_address: head_address.into(),
            token,
            node_id: NodeId::random(),
            resources,
            labels: Labels::new(),
            metrics_address: None,
            is_head_node: false,
            heartbeat_interval: Self::DEFAULT_HEARTBEAT_INTERVAL,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            adoption_grace: Self::DEFAULT_ADOPTION_GRACE,
            spill_root: std::env::temp_dir().join("raylet-spill"),
            spill_to: None,
            spill_limit: None,
            memory_monitor: MemoryMonitorConfig::default(),
            work_root: std::env::temp_dir().join("raylet-work"),
            gpu_detector: Arc::new(NvmlDetector::new()),
        }
    }

    /// Reads GPUs through `detector` instead of NVML; give the same one to
    /// [`resolve_resources`].
    pub fn gpu_detector(mut self, detector: Arc<dyn GpuDetector>) -> Self {
        self.gpu_detector = detector;
        self
    }

    pub fn metrics_address(mut self, address: impl Into<String>) -> Self {
        self.metrics_address = Some(address.into());
        self
    }

    pub fn labels(mut self, labels: Labels) -> Self {
        self.labels = labels;
        self
    }

    pub fn node_id(mut self, node_id: NodeId) -> Self {
        self.node_id = node_id;
        self
    }

    pub fn spill_root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_root = dir.into();
        self
    }

    pub fn work_root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.work_root = dir.into();
        self
    }

    /// This node's own directory for job drivers and cached blobs.
    /// Where this node's workers write their output: `raylet logs` reads it.
    pub fn worker_log_dir(&self) -> PathBuf {
        self.work_dir().join("worker_logs")
    }

    pub fn work_dir(&self) -> PathBuf {
        self.work_root.join(self.node_id.to_string())
    }

    /// This node's own spill directory.
    pub fn spill_dir(&self) -> PathBuf {
        self.spill_root.join(self.node_id.to_string())
    }

    /// When the out-of-memory monitor ends workers, and how often it looks.
    pub fn memory_monitor(mut self, monitor: MemoryMonitorConfig) -> Self {
        self.memory_monitor = monitor;
        self
    }

    /// Spills to `target` instead of the spill directory.
    pub fn spill_to(mut self, target: Arc<dyn SpillTarget>) -> Self {
        self.spill_to = Some(target);
        self
    }

    pub fn spill_limit(mut self, bytes: Option<u64>) -> Self {
        self.spill_limit = bytes;
        self
    }

    fn store_config(&self) -> StoreConfig {
        let capacity = self.resources.get(OBJECT_STORE_MEMORY).as_f64().max(0.0) as u64;
        let spill_limit = self.spill_limit.unwrap_or_else(|| match self.spill_to {
            Some(_) => u64::MAX,
            None => default_spill_limit(&self.spill_dir()),
        });
        StoreConfig {
            capacity,
            spill_limit,
            spill_to: self.spill_target(),
        }
    }

    /// Where the object store spills: `spill_to`, or this node's spill
    /// directory.
    fn spill_target(&self) -> Arc<dyn SpillTarget> {
        match &self.spill_to {
            Some(target) => target.clone(),
            None => Arc::new(SpillDirectory(self.spill_dir())),
        }
    }

    pub fn head_node(mut self, is_head_node: bool) -> Self {
        self.is_head_node = is_head_node;
        self
    }

    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    pub fn adoption_grace(mut self, grace: Duration) -> Self {
        self.adoption_grace = grace;
        self
    }
}

/// State that the heartbeat loop and the gRPC service share.
pub(crate) struct NodeShared {
    pub(crate) config: NodeConfig,
    pub(crate) address: SocketAddr,
    /// The incarnation the head gave this node; its lease grants carry it.
    pub(crate) incarnation: Arc<AtomicU64>,
    pub(crate) leases: Arc<LeaseManager>,
    pub(crate) stats: Mutex<NodeStats>,
    pub(crate) store: Arc<SharedStore>,
    pub(crate) job_drivers: Arc<JobDrivers>,
}

impl NodeShared {
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }

    pub(crate) fn stats(&self) -> NodeStats {
        lock(&self.stats).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A node manager that has registered with the head and is ready to run.
pub struct NodeManager {
    shared: Arc<NodeShared>,
    head: HeadClient,
    listener: TcpListener,
    /// Where the object store serves objects to peers over plain TCP.
    transfer_listener: TcpListener,
}

impl NodeManager {
    /// Connects to the head (retrying with backoff up to the connect timeout)
    /// and registers. Returns once the node is a member of the cluster.
    pub async fn start(config: NodeConfig, listener: TcpListener) -> Result<Self> {
        config.memory_monitor.validate()?;
        RotationSettings::process().map_err(|e| raylet_proto::Error::InvalidArgument(e.to_string()))?;
        let address = listener.local_addr()?;
        let mut head =
            raylet_proto::channel::connect_head(&config.head_address, &config.token, config.connect_timeout).await?;
        let incarnation = Arc::new(AtomicU64::new(0));
        let context = WorkerContext {
            node_id: config.node_id,
            incarnation: incarnation.clone(),
            node_manager_address: address.to_string(),
            head_address: config.head_address.clone(),
            token: config.token.expose().to_string(),
            bind_ip: address.ip().to_string(),
            labels: config.labels.clone(),
            log_dir: config.worker_log_dir(),
        };
        std::fs::create_dir_all(&context.log_dir)
            .map_err(|e| raylet_proto::Error::Internal(format!("making {}: {e}", context.log_dir.display())))?;
        raise_open_file_limit();
        let store = SharedStore::new(config.store_config(), config.token.clone()).map_err(raylet_proto::Error::from)?;
        let shared = Arc::new(NodeShared {
            leases: LeaseManager::new(
                context,
                config.resources.clone(),
                config.adoption_grace,
                Arc::new(ProcessLauncher),
            ),
            store,
            job_drivers: Arc::new(JobDrivers::new(
                &config.work_dir(),
                config.head_address.clone(),
                config.token.clone(),
            )),
            config,
            address,
            incarnation,
            stats: Mutex::new(NodeStats::default()),
        });
        let transfer_listener = TcpListener::bind((address.ip(), 0)).await?;
        heartbeat::register(&mut head, &shared).await?;
        Ok(NodeManager {
            shared,
            head,
            listener,
            transfer_listener,
        })
    }

    pub fn node_id(&self) -> NodeId {
        self.shared.config.node_id
    }

    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation()
    }

    /// The address of this node manager's gRPC service.
    pub fn address(&self) -> SocketAddr {
        self.shared.address
    }

    /// Serves and heartbeats until `shutdown` resolves, then leaves the cluster.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let NodeManager {
            shared,
            mut head,
            listener,
            transfer_listener,
        } = self;
        let service = NodeManagerServiceServer::new(service::NodeManagerServiceImpl { shared: shared.clone() });
        let store = ObjectStoreServiceServer::new(ObjectStoreServiceImpl {
            store: shared.store.clone(),
        })
        .max_decoding_message_size(MAX_DATA_MESSAGE)
        .max_encoding_message_size(MAX_DATA_MESSAGE);
        let swept = raylet_proto::local_socket::remove_stale_sockets();
        if swept > 0 {
            tracing::info!(swept, "removed the same-node socket files of processes that are gone");
        }
        let store_calls = shared
            .store
            .serve_same_node(shared.address, shared.config.token.clone());
        let stopping = shared.clone();
        let (shutdown, clients_waited_for) = bounded_shutdown(async move {
            shutdown.await;
            stopping.leases.shut_down();
        });
        let server = authenticated(shared.config.token.clone())?
            .add_service(service)
            .add_service(store)
            .serve_with_incoming_shutdown(incoming(listener), shutdown);
        let result = tokio::select! {
            result = server => result.map_err(raylet_proto::Error::from),
            () = clients_waited_for => {
                tracing::info!("clients still hold calls open after the shutdown grace; ending them");
                Ok(())
            }
            never = heartbeat::run(head.clone(), shared.clone()) => match never {},
            never = memory_monitor::run(shared.leases.clone(), shared.config.memory_monitor) => match never {},
            never = owner_watch::run(shared.store.clone(), shared.config.token.clone()) => match never {},
            never = shared.store.clone().serve_transfers(transfer_listener) => match never {},
        };
        shared.leases.shut_down();
        drop(store_calls);
        remove_spilled_objects(&shared.config.spill_target());
        heartbeat::unregister(&mut head, &shared, "node manager shut down").await;
        result
    }
}

/// Nine tenths of the space free where the spill directory will be.
fn default_spill_limit(spill_dir: &std::path::Path) -> u64 {
    let existing = spill_dir.ancestors().find(|dir| dir.exists()).unwrap_or(spill_dir);
    match nix::sys::statvfs::statvfs(existing) {
        Ok(stats) => stats.blocks_available() * stats.fragment_size() / 10 * 9,
        Err(_) => 0,
    }
}

fn remove_spilled_objects(target: &Arc<dyn SpillTarget>) {
    if let Err(error) = target.remove_all() {
        tracing::warn!(place = %target.location_of(""), %error, "cannot remove the spilled objects");
    }
}

/// Every object in the store is an open memfd: allow as many as the hard
/// limit does.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(%error, "cannot raise the open file limit");
    }
}
