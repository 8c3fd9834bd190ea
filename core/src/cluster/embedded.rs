//! The embedded cluster (feature `embedded`, on by default): a head and one
//! node manager inside the driver's own process, on loopback ports, started
//! by `raylet::init()` with no address, and the settings of its node. They
//! run on a thread of their own, so the driver's calls and the cluster's
//! answers are worked on side by side.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_head::HeadConfig;
use raylet_node::{
    GpuDetector, MemoryMonitorConfig, NodeConfig, NodeManager, NvmlDetector, ResourceOverrides, resolve_resources,
};
use raylet_proto::ResourceSet;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::cluster::config::Config;
use crate::{Error, Result};

/// The embedded node's settings, which [`Config`]'s builder sets.
#[derive(Clone, Debug)]
pub(crate) struct EmbeddedNode {
    num_cpus: Option<f64>,
    num_gpus: Option<f64>,
    resources: ResourceSet,
    object_store_memory: Option<u64>,
    max_spill_bytes: Option<u64>,
    memory_monitor: MemoryMonitorConfig,
    gpu_detector: Arc<dyn GpuDetector>,
}

impl Default for EmbeddedNode {
    fn default() -> Self {
        EmbeddedNode {
            num_cpus: None,
            num_gpus: None,
            resources: ResourceSet::new(),
            object_store_memory: None,
            max_spill_bytes: None,
            memory_monitor: MemoryMonitorConfig::default(),
            gpu_detector: Arc::new(NvmlDetector::new()),
        }
    }
}

/// The settings of the embedded cluster's node.
impl Config {
    /// CPUs of the embedded node [default: detected].
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.embedded_node.num_cpus = Some(cpus);
        self
    }

    /// GPUs of the embedded node [default: detected].
    pub fn num_gpus(mut self, gpus: f64) -> Self {
        self.embedded_node.num_gpus = Some(gpus);
        self
    }

    /// How the embedded node finds and reads its GPUs [default: NVML]. Tests
    /// give a [`FakeGpus`](crate::FakeGpus) to have GPUs
    /// without a device.
    pub fn gpu_detector(mut self, detector: Arc<dyn GpuDetector>) -> Self {
        self.embedded_node.gpu_detector = detector;
        self
    }

    /// Custom resources of the embedded node.
    pub fn resources(mut self, resources: ResourceSet) -> Self {
        self.embedded_node.resources = resources;
        self
    }

    /// Bytes of shared memory for the embedded node's object store
    /// [default: 30% of RAM].
    pub fn object_store_memory(mut self, bytes: u64) -> Self {
        self.embedded_node.object_store_memory = Some(bytes);
        self
    }

    /// Bytes of disk the embedded node may spill objects to [default: 90%
    /// of the free space of the temp directory].
    pub fn max_spill_bytes(mut self, bytes: u64) -> Self {
        self.embedded_node.max_spill_bytes = Some(bytes);
        self
    }

    /// The share of the machine's memory in use above which the embedded
    /// node ends the newest task's worker (its task is retried) [default:
    /// 0.95, checked every 250 ms].
    pub fn memory_usage_threshold(mut self, share: f64) -> Self {
        self.embedded_node.memory_monitor.threshold = share;
        self
    }
}

/// The running head and node manager, and how to stop them.
pub(crate) struct Embedded {
    runtime: tokio::runtime::Runtime,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<raylet_proto::Result<()>>>,
    node_manager: String,
    head_address: String,
    token: AuthToken,
}

impl Embedded {
    pub(crate) async fn start(config: &Config) -> Result<Self> {
        let settings = &config.embedded_node;
        let overrides = ResourceOverrides {
            num_cpus: settings.num_cpus,
            num_gpus: settings.num_gpus,
            custom: settings.resources.clone(),
            object_store_memory: settings.object_store_memory.map(|bytes| bytes as f64),
            ..Default::default()
        };
        let resources = resolve_resources(&overrides, &*settings.gpu_detector)?;
        let token = AuthToken::generate();
        let loopback = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0);
        let head_listener = TcpListener::bind(loopback).await?;
        let head_address = head_listener.local_addr()?.to_string();
        let (stop_head, head_stopped) = oneshot::channel::<()>();
        let head_config = HeadConfig::new(token.clone()).state_dir(config.temp_dir.join("head"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("raylet-embedded")
            .enable_all()
            .build()?;
        let head = runtime.spawn(raylet_head::run(head_config, head_listener, async {
            let _ = head_stopped.await;
        }));
        let node_config = NodeConfig::new(head_address.clone(), token.clone(), resources)
            .head_node(true)
            .spill_root(config.temp_dir.join("spill"))
            .work_root(config.temp_dir.join("work"))
            .spill_limit(settings.max_spill_bytes)
            .memory_monitor(settings.memory_monitor)
            .gpu_detector(settings.gpu_detector.clone())
            .connect_timeout(Duration::from_secs(5));
        let node_listener = TcpListener::bind(loopback).await?;
        let started = runtime.spawn(NodeManager::start(node_config, node_listener));
        let node = started
            .await
            .map_err(|e| Error::Cluster(raylet_proto::Error::Internal(e.to_string())))??;
        let node_manager = node.address().to_string();
        let (stop_node, node_stopped) = oneshot::channel::<()>();
        let node = runtime.spawn(node.run(async {
            let _ = node_stopped.await;
        }));
        Ok(Embedded {
            runtime,
            stops: vec![stop_node, stop_head],
            tasks: vec![node, head],
            node_manager,
            head_address,
            token,
        })
    }

    /// The node manager's address.
    pub(crate) fn node_manager(&self) -> &str {
        &self.node_manager
    }

    /// The head's address.
    pub(crate) fn head_address(&self) -> &str {
        &self.head_address
    }

    /// The token the head and the node manager were started with.
    pub(crate) fn token(&self) -> &AuthToken {
        &self.token
    }

    /// Stops the node manager (which kills its workers), then the head.
    pub(crate) async fn stop(self) -> Result<()> {
        for (stop, task) in self.stops.into_iter().zip(self.tasks) {
            let _ = stop.send(());
            task.await
                .map_err(|e| Error::Cluster(raylet_proto::Error::Internal(e.to_string())))??;
        }
        self.runtime.shutdown_background();
        Ok(())
    }
}
