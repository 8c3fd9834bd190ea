//! `ClusterSandbox`: a head and N node managers in one process, each on its
//! own loopback port, for tests that need a real cluster without processes.

use std::future::Future;
use std::time::{Duration, Instant};

use raylet_cluster_status::ClusterStatus;
use raylet_common::auth::AuthToken;
use raylet_head::HeadConfig;
use raylet_node::{NodeConfig, NodeManager};
use raylet_proto::channel::{HeadClient, connect_head};
use raylet_proto::resources::CPU;
use raylet_proto::v1::GetClusterStatusRequest;
use raylet_proto::{Amount, Error, NodeId, ResourceSet, Result};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server task with its shutdown signal; dropping it aborts the task.
struct RunningService {
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<()>>,
}

impl RunningService {
    fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(oneshot::Receiver<()>) -> Fut,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let (shutdown, signal) = oneshot::channel();
        let task = tokio::spawn(run(signal));
        RunningService {
            shutdown: Some(shutdown),
            task,
        }
    }

    async fn stop(mut self) -> Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let task = &mut self.task;
        task.await
            .map_err(|e| Error::Internal(format!("sandbox service task failed: {e}")))?
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn signalled(signal: oneshot::Receiver<()>) {
    let _ = signal.await;
}

/// Builds a [`ClusterSandbox`].
#[derive(Clone, Debug)]
pub struct SandboxBuilder {
    nodes: usize,
    node_resources: ResourceSet,
    heartbeat_timeout: Duration,
    heartbeat_interval: Duration,
}

impl SandboxBuilder {
    /// Number of node managers besides the head (default 1).
    pub fn nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }

    /// Total resources of every node (default 2 CPUs).
    pub fn node_resources(mut self, resources: ResourceSet) -> Self {
        self.node_resources = resources;
        self
    }

    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// Starts the head, then every node, and returns once all registered.
    pub async fn start(self) -> Result<ClusterSandbox> {
        let token = AuthToken::generate();
        let listener = loopback_listener().await?;
        let head_address = listener.local_addr()?.to_string();
        let config = HeadConfig::new(token.clone()).heartbeat_timeout(self.heartbeat_timeout);
        let head = RunningService::spawn(|signal| raylet_head::run(config, listener, signalled(signal)));
        let mut sandbox = ClusterSandbox {
            token,
            head_address,
            head: Some(head),
            nodes: Vec::new(),
        };
        for _ in 0..self.nodes {
            let config = NodeConfig::new(
                sandbox.head_address.clone(),
                sandbox.token.clone(),
                self.node_resources.clone(),
            )
            .heartbeat_interval(self.heartbeat_interval)
            .connect_timeout(Duration::from_secs(5));
            let (running, address) = start_node(config.clone()).await?;
            sandbox.nodes.push(SandboxNode {
                config,
                address,
                running: Some(running),
            });
        }
        Ok(sandbox)
    }
}

struct SandboxNode {
    config: NodeConfig,
    address: String,
    running: Option<RunningService>,
}

async fn loopback_listener() -> Result<TcpListener> {
    Ok(TcpListener::bind("127.0.0.1:0").await?)
}

/// Starts a node manager; returns it running, with its address.
async fn start_node(config: NodeConfig) -> Result<(RunningService, String)> {
    let node = NodeManager::start(config, loopback_listener().await?).await?;
    let address = node.address().to_string();
    Ok((RunningService::spawn(|signal| node.run(signalled(signal))), address))
}

/// A head and N node managers running in this process on loopback.
pub struct ClusterSandbox {
    token: AuthToken,
    head_address: String,
    head: Option<RunningService>,
    nodes: Vec<SandboxNode>,
}

impl ClusterSandbox {
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder {
            nodes: 1,
            node_resources: ResourceSet::new().with(CPU, Amount::whole(2)),
            heartbeat_timeout: HeadConfig::DEFAULT_HEARTBEAT_TIMEOUT,
            heartbeat_interval: NodeConfig::DEFAULT_HEARTBEAT_INTERVAL,
        }
    }

    pub fn token(&self) -> &AuthToken {
        &self.token
    }

    pub fn head_address(&self) -> &str {
        &self.head_address
    }

    pub fn node_id(&self, index: usize) -> NodeId {
        self.nodes[index].config.node_id
    }

    /// The address of node `index`'s node manager service.
    pub fn node_address(&self, index: usize) -> &str {
        &self.nodes[index].address
    }

    pub async fn head_client(&self) -> Result<HeadClient> {
        connect_head(&self.head_address, &self.token, Duration::from_secs(5)).await
    }

    pub async fn cluster_status(&self) -> Result<ClusterStatus> {
        let reply = self
            .head_client()
            .await?
            .get_cluster_status(GetClusterStatusRequest {})
            .await?;
        ClusterStatus::from_proto(reply.into_inner())
    }

    /// Polls the cluster status until `done` holds, or fails after `timeout`.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&ClusterStatus) -> bool) -> Result<ClusterStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.cluster_status().await?;
            if done(&status) {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(Error::DeadlineExceeded(format!(
                    "cluster did not reach the expected state within {timeout:?}: {status:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills node `index` abruptly: it stops serving and heartbeating and
    /// does not say goodbye, as after `kill -9`.
    pub fn kill_node(&mut self, index: usize) {
        self.nodes[index].running = None;
    }

    /// Stops node `index` cleanly: it unregisters from the head.
    pub async fn stop_node(&mut self, index: usize) -> Result<()> {
        match self.nodes[index].running.take() {
            Some(running) => running.stop().await,
            None => Ok(()),
        }
    }

    /// Starts node `index` again with the same node id, on a new port.
    pub async fn restart_node(&mut self, index: usize) -> Result<()> {
        let config = self.nodes[index].config.clone();
        let (running, address) = start_node(config).await?;
        self.nodes[index].running = Some(running);
        self.nodes[index].address = address;
        Ok(())
    }

    /// Stops every node cleanly, then the head.
    pub async fn shutdown(mut self) -> Result<()> {
        for index in 0..self.nodes.len() {
            self.stop_node(index).await?;
        }
        match self.head.take() {
            Some(head) => head.stop().await,
            None => Ok(()),
        }
    }
}
