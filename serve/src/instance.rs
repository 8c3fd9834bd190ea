//! [`run`]: deploying an application from the driver, which plays the
//! controller for now. It creates every replica, waits until each is built
//! and healthy, starts one proxy per alive node, and pushes the routing
//! table to all of them and to itself. Anything it started is killed again
//! when a step fails. Replicas and proxies are owned by the driver, so they
//! end with it; a detached controller actor that outlives it comes next.

use std::net::SocketAddr;
use std::time::Duration;

use raylet::{Cluster, SchedulingStrategy};

use crate::config::{Application, DeploymentConfig, HttpOptions};
use crate::deployment::{Deployment, ReplicaContext};
use crate::error::{Result, ServeError};
use crate::handle::DeploymentHandle;
use crate::proxy::{HttpProxy, HttpProxyHandle};
use crate::replica::{Replica, ReplicaHandle, ReplicaSpec};
use crate::routes::{self, AppRoute, DeploymentRoutes, RoutingTable};

/// The namespace of replica and proxy actors.
const NAMESPACE: &str = "serve";
/// How long a replica or proxy may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running application: its proxies' addresses, handles to its
/// deployments, and [`ServeInstance::shutdown`].
pub struct ServeInstance {
    cluster: Cluster,
    app: String,
    started: Started,
    addresses: Vec<SocketAddr>,
}

/// What [`run`] started, to stop.
#[derive(Debug, Default)]
struct Started {
    proxies: Vec<HttpProxyHandle>,
    replicas: Vec<ReplicaHandle>,
}

impl Started {
    /// Kills every one, the proxies first so that nothing routes to a
    /// replica going away; returns the first error.
    fn kill(&self, cluster: &Cluster) -> Result<()> {
        let proxies = self.proxies.iter().map(|proxy| cluster.kill(proxy, true));
        let replicas = self.replicas.iter().map(|replica| cluster.kill(replica, true));
        let results: Vec<raylet::Result<()>> = proxies.chain(replicas).collect();
        Ok(results.into_iter().collect::<raylet::Result<()>>()?)
    }
}

/// Deploys `app` behind proxies on port 8000 of every alive node.
pub fn run(cluster: &Cluster, app: Application) -> Result<ServeInstance> {
    run_with(cluster, app, HttpOptions::default())
}

/// Deploys `app` behind proxies with the given HTTP options (port 0 for
/// any free port).
pub fn run_with(cluster: &Cluster, app: Application, http: HttpOptions) -> Result<ServeInstance> {
    app.validate()?;
    let mut started = Started::default();
    match start(cluster, &app, http, &mut started) {
        Ok(addresses) => Ok(ServeInstance {
            cluster: cluster.clone(),
            app: app.name,
            started,
            addresses,
        }),
        Err(e) => {
            if let Err(kill) = started.kill(cluster) {
                tracing::warn!(app = %app.name, "stopping what a failed deploy started: {kill}");
            }
            Err(e)
        }
    }
}

/// Starts the replicas and proxies of `app`; returns the proxies'
/// addresses.
fn start(cluster: &Cluster, app: &Application, http: HttpOptions, started: &mut Started) -> Result<Vec<SocketAddr>> {
    let mut deployments = Vec::with_capacity(app.deployments.len());
    for config in &app.deployments {
        deployments.push(start_replicas(cluster, &app.name, config, started)?);
    }
    for routes in &deployments {
        routes
            .replicas
            .iter()
            .try_for_each(|(name, replica)| wait_healthy(name, replica))?;
    }
    let table = RoutingTable {
        apps: vec![AppRoute {
            app: app.name.clone(),
            route_prefix: app.route_prefix.clone(),
            public: app.public,
            ingress: app.deployments[0].name.clone(),
        }],
        deployments,
    };
    for replica in &started.replicas {
        replica.install_routes(table.clone()).get_timeout(READY_TIMEOUT)?;
    }
    let addresses = start_proxies(cluster, &app.name, http, &table, started)?;
    routes::install(table);
    Ok(addresses)
}

/// Creates the replicas of one deployment.
fn start_replicas(
    cluster: &Cluster,
    app: &str,
    config: &DeploymentConfig,
    started: &mut Started,
) -> Result<DeploymentRoutes> {
    let mut replicas = Vec::with_capacity(config.num_replicas as usize);
    for index in 0..config.num_replicas {
        let name = format!("replica:{app}:{}:{index}", config.name);
        let spec = ReplicaSpec {
            context: ReplicaContext {
                app: app.to_string(),
                deployment: config.name.clone(),
                replica: name.clone(),
            },
            class: config.class.clone(),
            init: config.init.clone(),
            user_config: config.user_config.clone().map(serde_bytes::ByteBuf::from),
            max_ongoing_requests: config.max_ongoing_requests,
            threads: config.num_cpus.ceil() as usize,
        };
        let replica = Replica::remote(cluster, spec)
            .num_cpus(config.num_cpus)
            .num_gpus(config.num_gpus)
            // Rejections and health checks must never queue behind work.
            .max_concurrency(config.max_ongoing_requests + 16)
            .name(&name)
            .namespace(NAMESPACE)
            .spawn()?;
        started.replicas.push(replica.clone());
        replicas.push((name, replica));
    }
    Ok(DeploymentRoutes {
        app: app.to_string(),
        deployment: config.name.clone(),
        class: config.class.clone(),
        max_ongoing_requests: config.max_ongoing_requests,
        max_queued_requests: config.queue_limit(),
        replicas,
    })
}

/// Waits until a replica is built and passes its health check.
fn wait_healthy(name: &str, replica: &ReplicaHandle) -> Result<()> {
    match replica.check_health().get_timeout(READY_TIMEOUT) {
        Ok(()) => Ok(()),
        Err(raylet::Error::Task(failure)) => Err(ServeError::ReplicaFailed {
            replica: name.to_string(),
            message: failure.message,
        }),
        Err(e) => Err(e.into()),
    }
}

/// Starts one proxy on every alive node and gives each the table.
fn start_proxies(
    cluster: &Cluster,
    app: &str,
    http: HttpOptions,
    table: &RoutingTable,
    started: &mut Started,
) -> Result<Vec<SocketAddr>> {
    let status = cluster.status()?;
    let mut addresses = Vec::new();
    for node in status.alive() {
        let proxy = HttpProxy::remote(cluster, http.clone())
            .num_cpus(0.0)
            .scheduling_strategy(SchedulingStrategy::NodeAffinity {
                node_id: node.node_id,
                soft: false,
            })
            .name(&format!("proxy:{app}:{}", node.node_id))
            .namespace(NAMESPACE)
            .spawn()?;
        started.proxies.push(proxy.clone());
        proxy.install_routes(table.clone()).get_timeout(READY_TIMEOUT)?;
        addresses.push(proxy.address().get_timeout(READY_TIMEOUT)?);
    }
    match addresses.is_empty() {
        true => Err(ServeError::InvalidConfig(
            "the cluster has no alive node for a proxy".into(),
        )),
        false => Ok(addresses),
    }
}

impl ServeInstance {
    /// The address of the first node's proxy: send HTTP requests to
    /// `http://ADDRESS/<route prefix>`.
    pub fn address(&self) -> SocketAddr {
        self.addresses[0]
    }

    /// The addresses of every node's proxy.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }

    /// A handle to deployment `name` of this application, which must be a
    /// `D`; it routes like the proxies.
    pub fn handle<D: Deployment>(&self, name: &str) -> Result<DeploymentHandle<D>> {
        DeploymentHandle::new(&self.app, name).resolve()
    }

    /// Stops the proxies, then the replicas.
    pub fn shutdown(self) -> Result<()> {
        routes::remove_app(&self.app);
        self.started.kill(&self.cluster)
    }
}
