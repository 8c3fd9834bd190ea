//! The reconciler's calls to replicas and proxies: [`ClusterLauncher`],
//! the [`ReplicaLauncher`] that creates and kills replica actors, and the
//! probes (a replica's health and load, a proxy's address and queues, a
//! table install), each a task on a small runtime of its own whose outcome
//! comes back as an [`Event`] within its timeout, so a slow replica never
//! stalls the loop.

use std::future::Future;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use raylet::Cluster;
use tokio::runtime::Runtime;

use super::super::NAMESPACE;
use super::super::replica_set::{LOAD_PERIOD, ProbeError, ReplicaLauncher};
use super::{Event, Reconciler, TICK};
use crate::config::DeploymentConfig;
use crate::deployment::ReplicaContext;
use crate::error::{Result, ServeError};
use crate::replica::{Replica, ReplicaHandle, ReplicaSpec};

/// How long a replica or a proxy may take to be built.
pub(super) const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a probe of a load or a table install may take.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Replicas as actors of the cluster, probed on the reconciler's runtime.
pub(super) struct ClusterLauncher {
    cluster: Cluster,
    runtime: Runtime,
    events: Sender<Event>,
}

impl ClusterLauncher {
    /// A launcher for `cluster`, and where its probes' events arrive.
    pub(super) fn new(cluster: Cluster) -> Result<(Self, Receiver<Event>)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("serve-controller-probes")
            .enable_all()
            .build()?;
        // Unbounded, yet bounded: each probe sends one event, a replica or
        // proxy has at most one health or load probe out, and a table push
        // one install per proxy and replica.
        let (events, received) = channel();
        let launcher = ClusterLauncher {
            cluster,
            runtime,
            events,
        };
        Ok((launcher, received))
    }

    /// Runs `call` on the probe runtime within `timeout` and sends the
    /// event `event` makes of its outcome.
    pub(super) fn probe<T, F>(
        &self,
        timeout: Duration,
        call: F,
        event: impl FnOnce(std::result::Result<T, ProbeError>) -> Event + Send + 'static,
    ) where
        T: Send + 'static,
        F: Future<Output = std::result::Result<T, ProbeError>> + Send + 'static,
    {
        let events = self.events.clone();
        self.runtime.spawn(async move {
            let outcome = match tokio::time::timeout(timeout, call).await {
                Ok(outcome) => outcome,
                Err(_) => Err(ProbeError::Timeout(timeout)),
            };
            let _ = events.send(event(outcome));
        });
    }

    /// Waits for a replica (new or found again) to be built and healthy,
    /// then reads its version.
    pub(super) fn probe_build(&self, name: String, handle: ReplicaHandle) {
        let built = async move {
            handle.check_health().get_async().await?;
            Ok(handle.load().get_async().await?)
        };
        self.probe(BUILD_TIMEOUT, built, move |result| Event::Built {
            replica: name,
            result,
        });
    }
}

impl ReplicaLauncher for ClusterLauncher {
    type Handle = ReplicaHandle;

    fn start(
        &mut self,
        replica: ReplicaContext,
        config: &DeploymentConfig,
        version: &str,
    ) -> std::result::Result<ReplicaHandle, ServeError> {
        let name = replica.replica.clone();
        let spec = ReplicaSpec {
            context: replica,
            class: config.class.clone(),
            init: config.init.clone(),
            user_config: config.user_config.clone().map(serde_bytes::ByteBuf::from),
            max_ongoing_requests: config.max_ongoing_requests,
            threads: config.num_cpus.ceil() as usize,
            version: version.to_string(),
        };
        let handle = Replica::remote(&self.cluster, spec)
            .num_cpus(config.num_cpus)
            .num_gpus(config.num_gpus)
            // Rejections, probes and installs must never queue behind work.
            .max_concurrency(config.max_ongoing_requests + 16)
            .name(&name)
            .namespace(NAMESPACE)
            .detached()
            .spawn()?;
        self.probe_build(name, handle.clone());
        Ok(handle)
    }

    fn stop(&mut self, name: &str, handle: &ReplicaHandle) {
        let cluster = self.cluster.clone();
        let events = self.events.clone();
        let (name, handle) = (name.to_string(), handle.clone());
        self.runtime.spawn_blocking(move || {
            if let Err(e) = cluster.kill(&handle, true) {
                tracing::debug!(replica = %name, "killing a replica: {e}");
            }
            let _ = events.send(Event::Stopped { replica: name });
        });
    }

    fn probe_health(&mut self, name: &str, handle: &ReplicaHandle, timeout: Duration) {
        let handle = handle.clone();
        let check = async move { Ok(handle.check_health().get_async().await?) };
        let replica = name.to_string();
        self.probe(timeout, check, move |result| Event::Health { replica, result });
    }

    fn probe_load(&mut self, name: &str, handle: &ReplicaHandle) {
        let handle = handle.clone();
        let load = async move { Ok(handle.load().get_async().await?) };
        let replica = name.to_string();
        self.probe(PROBE_TIMEOUT, load, move |result| Event::Load {
            replica,
            load: result.ok(),
        });
    }

    fn reconfigure(&mut self, name: &str, handle: &ReplicaHandle, user_config: Vec<u8>) {
        let (replica, handle) = (name.to_string(), handle.clone());
        let events = self.events.clone();
        self.runtime.spawn(async move {
            let user_config = serde_bytes::ByteBuf::from(user_config);
            if let Err(e) = handle.reconfigure(user_config).get_async().await {
                let result = Err(ProbeError::Reconfigure(e));
                let _ = events.send(Event::Health { replica, result });
            }
        });
    }
}

impl Reconciler {
    /// Asks every proxy for its queues about twice a second, or every tick
    /// while a deployment is scaled to zero, whose first request waits for
    /// the controller to see it.
    pub(super) fn probe_proxies(&mut self, now: Instant) {
        let scaled_to_zero = (self.apps.values().flat_map(|app| &app.deployments)).any(|deployment| {
            deployment
                .autoscaler
                .as_ref()
                .is_some_and(|scaler| scaler.target() == 0)
        });
        let period = if scaled_to_zero { TICK } else { LOAD_PERIOD / 2 };
        let mut due = Vec::new();
        for proxy in self.proxies.values_mut() {
            if proxy.probing || proxy.address.is_none() || now.duration_since(proxy.last_probe) < period {
                continue;
            }
            proxy.probing = true;
            proxy.last_probe = now;
            due.push((proxy.node_id.clone(), proxy.handle.clone()));
        }
        for (node_id, handle) in due {
            let queued = async move { Ok(handle.queued().get_async().await?) };
            self.launcher
                .probe(PROBE_TIMEOUT, queued, move |result| Event::ProxyQueues {
                    node_id,
                    queues: result.ok(),
                });
        }
    }
}
