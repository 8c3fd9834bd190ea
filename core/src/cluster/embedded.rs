//! The embedded cluster: a head and one node manager inside the driver's own
//! process, on loopback ports, started by `raylet::init()` with no address.
//! They run on a thread of their own, so the driver's calls and the
//! cluster's answers are worked on side by side.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use raylet_head::HeadConfig;
use raylet_node::{NodeConfig, NodeManager, ResourceOverrides, resolve_resources};
use raylet_proto::auth::AuthToken;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::cluster::config::Config;
use crate::{Error, Result};

/// The running head and node manager, and how to stop them.
pub(crate) struct Embedded {
    runtime: tokio::runtime::Runtime,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<raylet_proto::Result<()>>>,
    pub(crate) node_manager: String,
    pub(crate) head_address: String,
    pub(crate) token: AuthToken,
}

impl Embedded {
    pub(crate) async fn start(config: &Config) -> Result<Self> {
        let overrides = ResourceOverrides {
            num_cpus: config.num_cpus,
            num_gpus: config.num_gpus,
            custom: config.resources.clone(),
            object_store_memory: config.object_store_memory.map(|bytes| bytes as f64),
            ..Default::default()
        };
        let resources = resolve_resources(&overrides, &*config.gpu_detector)?;
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
            .spill_limit(config.max_spill_bytes)
            .memory_monitor(config.memory_monitor)
            .gpu_detector(config.gpu_detector.clone())
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
