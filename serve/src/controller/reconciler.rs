//! The controller's thread: it owns every application's state, takes
//! commands from the actor's methods and results from probes, and every
//! [`TICK`] converges what runs towards what should (see
//! [`deployment_state`](super::deployment_state) for the plan).
//!
//! Probes (a replica's health and load, a proxy's queues, installing the
//! routing table) run as tasks on a small runtime of its own and come
//! back as [`Event`]s, so a slow replica never stalls the loop. Blocking
//! cluster calls (creating and killing actors, the key-value store,
//! `list_actors`) are made here, on this thread, never on a core runtime.
//! [`polling`] reads the cluster once a second; [`report`] makes the
//! status.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, channel};
use std::time::{Duration, Instant};

use raylet::Cluster;
use tokio::runtime::Runtime;

use super::deployment_state::{Action, DeploymentState, ReplicaSlot};
use super::proxies::{ProxyFailure, ProxySlot};
use super::{NAMESPACE, Shared, store};
use crate::config::{Application, HttpOptions};
use crate::deployment::ReplicaContext;
use crate::error::{Result, ServeError};
use crate::proxy::HttpProxyHandle;
use crate::replica::{Replica, ReplicaHandle, ReplicaLoad, ReplicaSpec};
use crate::routes::{AppRoute, DeploymentRoutes, QueueReport, RoutingTable};
use crate::status::{ControllerStatus, ReplicaState, RequestCounts, ServeStatus};

mod polling;
mod report;

/// How often the loop converges.
const TICK: Duration = Duration::from_millis(100);
/// How often running replicas report their load, at most.
const LOAD_PERIOD: Duration = Duration::from_secs(1);
/// How often a draining replica is asked whether it is idle.
const DRAIN_PROBE_PERIOD: Duration = Duration::from_millis(100);
/// How long a draining replica must have seen no request before it stops:
/// longer than a routed call takes to arrive.
const DRAIN_IDLE: Duration = Duration::from_millis(300);
/// How long a draining replica waits for every proxy and replica to
/// install the table without it.
const ACK_PATIENCE: Duration = Duration::from_secs(5);
/// How long a replica may take to be built.
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a probe of a load or a table install may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the key-value store, the actors and the nodes are read.
const POLL_PERIOD: Duration = Duration::from_secs(1);
/// How often the status is published even without a change.
const PUBLISH_PERIOD: Duration = Duration::from_secs(1);
/// How long a driver's report of its waiting requests counts: a driver
/// reports five times a second while requests wait.
pub(super) const DRIVER_REPORT_TTL: Duration = Duration::from_secs(1);

/// What the actor's methods ask of the thread.
pub(super) enum Command {
    Deploy {
        app: Application,
        done: SyncSender<std::result::Result<(), String>>,
    },
    Delete {
        app: String,
        done: SyncSender<bool>,
    },
    /// The requests waiting in a driver's routers.
    Queues {
        driver: String,
        queues: Vec<QueueReport>,
    },
}

/// What comes back to the thread.
enum Event {
    /// A replica was built and passed its first health check, or not.
    Built {
        replica: String,
        result: std::result::Result<ReplicaLoad, String>,
    },
    Health {
        replica: String,
        result: std::result::Result<(), String>,
    },
    Load {
        replica: String,
        load: Option<ReplicaLoad>,
    },
    Stopped {
        replica: String,
    },
    ProxyReady {
        node_id: String,
        result: std::result::Result<std::net::SocketAddr, String>,
    },
    ProxyQueues {
        node_id: String,
        queues: Option<Vec<QueueReport>>,
    },
    /// A proxy (by node id) or a replica (by name) installed a table.
    Installed {
        target: String,
        version: u64,
    },
}

/// One application.
struct App {
    config: Application,
    deleting: bool,
    deployments: Vec<DeploymentState>,
}

/// The thread's state.
pub(super) struct Reconciler {
    cluster: Cluster,
    http: HttpOptions,
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    probes: Runtime,
    events: Sender<Event>,
    received: Receiver<Event>,
    apps: BTreeMap<String, App>,
    proxies: BTreeMap<String, ProxySlot>,
    /// Nodes whose proxy failed to start, in a row: started again only
    /// after a back-off.
    proxy_failures: BTreeMap<String, ProxyFailure>,
    /// What each driver last reported waiting in its routers, and when.
    driver_queues: BTreeMap<String, (Instant, Vec<QueueReport>)>,
    table_version: u64,
    table_dirty: bool,
    last_poll: Instant,
    last_publish: Instant,
    published: ServeStatus,
    controller: ControllerStatus,
}

impl Reconciler {
    pub(super) fn new(
        cluster: Cluster,
        http: HttpOptions,
        shared: Arc<Shared>,
        commands: Receiver<Command>,
    ) -> Result<Self> {
        let probes = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("serve-controller-probes")
            .enable_all()
            .build()?;
        // Unbounded, yet bounded: each probe sends one event, a replica or
        // proxy has at most one health or load probe out, and a table push
        // one install per proxy and replica.
        let (events, received) = channel();
        let long_ago = Instant::now() - POLL_PERIOD;
        Ok(Reconciler {
            cluster,
            http,
            shared,
            commands,
            probes,
            events,
            received,
            apps: BTreeMap::new(),
            proxies: BTreeMap::new(),
            proxy_failures: BTreeMap::new(),
            driver_queues: BTreeMap::new(),
            table_version: 0,
            table_dirty: true,
            last_poll: long_ago,
            last_publish: long_ago,
            published: ServeStatus::default(),
            controller: ControllerStatus {
                node_id: String::new(),
                pid: std::process::id(),
            },
        })
    }

    /// Recovers what a previous controller left, then converges until the
    /// actor is dropped.
    pub(super) fn run(mut self) {
        if let Err(e) = self.recover() {
            tracing::error!("the serve controller could not read its recorded state: {e}");
        }
        while !self.shared.stop.load(Ordering::Relaxed) {
            self.wait_for_events();
            self.tick();
        }
    }

    /// Applies commands and events until the next tick is due.
    fn wait_for_events(&mut self) {
        let deadline = Instant::now() + TICK;
        loop {
            while let Ok(command) = self.commands.try_recv() {
                self.command(command);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.received.recv_timeout(left.min(Duration::from_millis(10))) {
                Ok(event) => self.event(event),
                Err(RecvTimeoutError::Timeout) if left.is_zero() => return,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_poll) >= POLL_PERIOD {
            self.last_poll = now;
            self.poll_cluster();
        }
        self.probe_proxies(now);
        let names: Vec<String> = self.apps.keys().cloned().collect();
        for name in names {
            self.converge_app(&name, now);
        }
        self.apps
            .retain(|_, app| !(app.deleting && app.deployments.iter().all(|d| d.replicas.is_empty())));
        self.driver_queues.retain(|_, (at, _)| at.elapsed() < DRIVER_REPORT_TTL);
        if self.table_dirty {
            self.push_table();
        }
        self.refresh_status(false);
    }

    // Commands.

    fn command(&mut self, command: Command) {
        match command {
            Command::Deploy { app, done } => {
                let result = self.deploy(app).map_err(|e| e.to_string());
                self.refresh_status(true);
                let _ = done.send(result);
            }
            Command::Delete { app, done } => {
                let existed = self.delete(&app);
                self.refresh_status(true);
                let _ = done.send(existed);
            }
            Command::Queues { driver, queues } => {
                self.driver_queues.insert(driver, (Instant::now(), queues));
            }
        }
    }

    fn deploy(&mut self, config: Application) -> Result<()> {
        if let Some(other) = self.apps.values().find(|app| {
            app.config.name != config.name && !app.deleting && app.config.route_prefix == config.route_prefix
        }) {
            return Err(ServeError::InvalidConfig(format!(
                "route prefix {} is taken by application `{}`",
                config.route_prefix, other.config.name
            )));
        }
        store::save(&self.cluster, &config)?;
        self.adopt_config(config);
        Ok(())
    }

    /// Makes `config` what should run for its application.
    fn adopt_config(&mut self, config: Application) {
        let app = self.apps.entry(config.name.clone()).or_insert_with(|| App {
            config: config.clone(),
            deleting: false,
            deployments: Vec::new(),
        });
        app.deleting = false;
        for deployment in &mut app.deployments {
            deployment.removed = !config.deployments.iter().any(|d| d.name == deployment.config.name);
        }
        let mut reconfigure = Vec::new();
        for wanted in &config.deployments {
            match app.deployments.iter_mut().find(|d| d.config.name == wanted.name) {
                Some(deployment) => {
                    if deployment.update(wanted.clone()) {
                        reconfigure.push(wanted.name.clone());
                    }
                }
                None => app.deployments.push(DeploymentState::new(wanted.clone())),
            }
        }
        app.config = config;
        self.table_dirty = true;
        let name = app.config.name.clone();
        for deployment in reconfigure {
            self.reconfigure(&name, &deployment);
        }
    }

    fn delete(&mut self, name: &str) -> bool {
        let recorded = store::remove(&self.cluster, name).unwrap_or_else(|e| {
            tracing::warn!(app = name, "forgetting the application: {e}");
            false
        });
        let known = self.apps.get_mut(name).is_some_and(|app| {
            let was_live = !app.deleting;
            app.deleting = true;
            was_live
        });
        self.table_dirty |= known;
        recorded || known
    }

    /// Applies a changed user config to every replica of the current
    /// version in place.
    fn reconfigure(&mut self, app: &str, deployment: &str) {
        let Some(state) = self.deployment(app, deployment) else {
            return;
        };
        let Some(config) = state.config.user_config.clone() else {
            return;
        };
        let current: Vec<_> = state
            .replicas
            .iter()
            .filter(|slot| slot.version == state.version)
            .map(|slot| (slot.name.clone(), slot.handle.clone()))
            .collect();
        for (name, handle) in current {
            let config = serde_bytes::ByteBuf::from(config.clone());
            let events = self.events.clone();
            self.probes.spawn(async move {
                let result = match handle.reconfigure(config).get_async().await {
                    Ok(()) => Ok(()),
                    Err(e) => Err(format!("reconfigure: {e}")),
                };
                if let Err(message) = result {
                    let _ = events.send(Event::Health {
                        replica: name,
                        result: Err(message),
                    });
                }
            });
        }
    }

    // Events.

    fn event(&mut self, event: Event) {
        match event {
            Event::Built { replica, result } => self.built(&replica, result),
            Event::Health { replica, result } => self.health(&replica, result),
            Event::Load { replica, load } => self.load(&replica, load),
            Event::Stopped { replica } => self.stopped(&replica),
            Event::ProxyReady { node_id, result } => self.proxy_ready(&node_id, result),
            Event::ProxyQueues { node_id, queues } => {
                if let Some(proxy) = self.proxies.get_mut(&node_id) {
                    proxy.probing = false;
                    proxy.queues = queues.unwrap_or_default();
                }
            }
            Event::Installed { target, version } => self.installed(&target, version),
        }
    }

    fn built(&mut self, replica: &str, result: std::result::Result<ReplicaLoad, String>) {
        let Some(deployment) = self.deployment_of(replica) else {
            return;
        };
        let current_version = deployment.version.clone();
        let Some(slot) = deployment.slot_mut(replica) else {
            return;
        };
        slot.probing = false;
        match result {
            Ok(load) => {
                slot.version = load.version;
                if slot.state == ReplicaState::Starting {
                    slot.enter(ReplicaState::Running);
                    slot.last_health = Instant::now();
                    if slot.version == current_version {
                        deployment.replica_ran();
                    }
                    self.table_dirty = true;
                }
            }
            Err(message) => {
                tracing::warn!(replica, "a replica failed to start: {message}");
                if slot.version == current_version {
                    let message = format!("replica {replica} failed to start: {message}");
                    if let Some(delay) = deployment.start_failed(message, Instant::now()) {
                        tracing::warn!(replica, "starting another in {delay:?}");
                    }
                }
                self.stop(replica);
            }
        }
    }

    fn health(&mut self, replica: &str, result: std::result::Result<(), String>) {
        let Some(slot) = self.replica_mut(replica) else {
            return;
        };
        slot.probing = false;
        slot.last_health = Instant::now();
        if let Err(message) = result
            && slot.state == ReplicaState::Running
        {
            tracing::warn!(replica, "replacing an unhealthy replica: {message}");
            self.stop(replica);
        }
    }

    fn load(&mut self, replica: &str, load: Option<ReplicaLoad>) {
        let Some(slot) = self.replica_mut(replica) else {
            return;
        };
        slot.probing = false;
        slot.last_load = Instant::now();
        let Some(load) = load else {
            return;
        };
        slot.ongoing = load.ongoing;
        slot.idle_ms = load.idle_ms;
        slot.counts = RequestCounts {
            total: load.answered,
            errors: load.errors,
        };
        slot.figures = load.figures;
        slot.queues = load.queued;
    }

    fn stopped(&mut self, replica: &str) {
        for app in self.apps.values_mut() {
            for deployment in &mut app.deployments {
                if let Some(index) = deployment.replicas.iter().position(|slot| slot.name == replica) {
                    let slot = deployment.replicas.remove(index);
                    deployment.retired.total += slot.counts.total;
                    deployment.retired.errors += slot.counts.errors;
                }
            }
        }
    }

    fn proxy_ready(&mut self, node_id: &str, result: std::result::Result<std::net::SocketAddr, String>) {
        match result {
            Ok(address) => {
                if let Some(proxy) = self.proxies.get_mut(node_id) {
                    proxy.address = Some(address);
                    proxy.probing = false;
                    self.table_dirty = true;
                }
                if let Some(failure) = self.proxy_failures.remove(node_id) {
                    tracing::info!(node = node_id, %address, "the serve proxy started after {} failed starts", failure.failures);
                }
            }
            Err(message) => {
                self.proxies.remove(node_id);
                self.proxy_failed(node_id, message);
            }
        }
    }

    fn installed(&mut self, target: &str, version: u64) {
        if let Some(proxy) = self.proxies.get_mut(target) {
            proxy.acked = proxy.acked.max(version);
        } else if let Some(slot) = self.replica_mut(target) {
            slot.acked = slot.acked.max(version);
        }
    }

    // Converging.

    fn converge_app(&mut self, name: &str, now: Instant) {
        let queued = self.queued_requests();
        let Some(app) = self.apps.get_mut(name) else {
            return;
        };
        let deleting = app.deleting;
        let mut work = Vec::new();
        for deployment in &mut app.deployments {
            let key = (name.to_string(), deployment.config.name.clone());
            let waiting = queued.get(&key).copied().unwrap_or(0);
            if let Some(scaler) = &mut deployment.autoscaler
                && scaler.sample_due(now, waiting)
            {
                let ongoing = deployment
                    .replicas
                    .iter()
                    .filter(|slot| slot.state == ReplicaState::Running)
                    .map(|slot| slot.ongoing)
                    .sum();
                scaler.record(now, ongoing, waiting);
            }
            work.push((deployment.config.name.clone(), deployment.plan(deleting, now)));
        }
        app.deployments.retain(|d| !(d.removed && d.replicas.is_empty()));
        for (deployment, actions) in work {
            for action in actions {
                self.act(name, &deployment, action);
            }
            self.probe_replicas(name, &deployment, now);
        }
    }

    fn act(&mut self, app: &str, deployment: &str, action: Action) {
        match action {
            Action::Start => {
                if let Err(e) = self.start_replica(app, deployment) {
                    tracing::warn!(app, deployment, "starting a replica: {e}");
                    if let Some(state) = self.deployment_mut(app, deployment) {
                        state.start_failed(format!("starting a replica: {e}"), Instant::now());
                    }
                }
            }
            Action::Drain(replica) => self.drain(&replica),
            Action::Stop(replica) => self.stop(&replica),
        }
    }

    fn start_replica(&mut self, app: &str, deployment: &str) -> Result<()> {
        let cluster = self.cluster.clone();
        let state = self
            .deployment_mut(app, deployment)
            .ok_or_else(|| ServeError::InvalidConfig(format!("no deployment `{deployment}`")))?;
        let name = state.next_name(app);
        let config = &state.config;
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
            version: state.version.clone(),
        };
        let handle = Replica::remote(&cluster, spec)
            .num_cpus(config.num_cpus)
            .num_gpus(config.num_gpus)
            // Rejections, probes and installs must never queue behind work.
            .max_concurrency(config.max_ongoing_requests + 16)
            .name(&name)
            .namespace(NAMESPACE)
            .detached()
            .spawn()?;
        let mut slot = ReplicaSlot::new(name.clone(), handle.clone(), state.version.clone());
        slot.probing = true;
        state.replicas.push(slot);
        self.spawn_build_probe(name, handle);
        Ok(())
    }

    /// Waits for a replica (new or found again) to be built and healthy,
    /// then reads its version.
    fn spawn_build_probe(&self, name: String, handle: ReplicaHandle) {
        let built = async move {
            handle.check_health().get_async().await.map_err(|e| e.to_string())?;
            handle.load().get_async().await.map_err(|e| e.to_string())
        };
        self.probe(BUILD_TIMEOUT, built, move |result| Event::Built {
            replica: name,
            result,
        });
    }

    /// Takes a replica out of routing; it stops once idle.
    fn drain(&mut self, replica: &str) {
        let version = self.table_version + 1;
        if let Some(slot) = self.replica_mut(replica)
            && slot.state == ReplicaState::Running
        {
            slot.enter(ReplicaState::Draining);
            slot.left_in = version;
            self.table_dirty = true;
        }
    }

    /// Kills a replica in the background; it leaves routing at once.
    fn stop(&mut self, replica: &str) {
        let Some(slot) = self.replica_mut(replica) else {
            return;
        };
        if slot.state == ReplicaState::Stopping {
            return;
        }
        let was_routed = slot.state == ReplicaState::Running;
        slot.enter(ReplicaState::Stopping);
        let handle = slot.handle.clone();
        self.table_dirty |= was_routed;
        let cluster = self.cluster.clone();
        let events = self.events.clone();
        let name = replica.to_string();
        self.probes.spawn_blocking(move || {
            if let Err(e) = cluster.kill(&handle, true) {
                tracing::debug!(replica = %name, "killing a replica: {e}");
            }
            let _ = events.send(Event::Stopped { replica: name });
        });
    }

    // Probes.

    /// Runs `call` on the probe runtime within `timeout` and sends the
    /// event `event` makes of its outcome.
    fn probe<T, F>(
        &self,
        timeout: Duration,
        call: F,
        event: impl FnOnce(std::result::Result<T, String>) -> Event + Send + 'static,
    ) where
        T: Send + 'static,
        F: Future<Output = std::result::Result<T, String>> + Send + 'static,
    {
        let events = self.events.clone();
        self.probes.spawn(async move {
            let outcome = match tokio::time::timeout(timeout, call).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
            let _ = events.send(event(outcome));
        });
    }

    /// Sends the health and load probes that are due for one deployment's
    /// replicas, and stops draining replicas that are idle.
    fn probe_replicas(&mut self, app: &str, deployment: &str, now: Instant) {
        let table_version = self.table_version;
        let Some(state) = self.deployment(app, deployment) else {
            return;
        };
        let config = state.config.clone();
        let load_period = config
            .autoscaling
            .as_ref()
            .map_or(LOAD_PERIOD, |autoscaling| autoscaling.metrics_interval.min(LOAD_PERIOD));
        let mut due = Vec::new();
        let mut idle = Vec::new();
        for slot in &state.replicas {
            if slot.probing {
                continue;
            }
            match slot.state {
                ReplicaState::Running if now.duration_since(slot.last_health) >= config.health_check_period => {
                    due.push((slot.name.clone(), slot.handle.clone(), true));
                }
                ReplicaState::Running if now.duration_since(slot.last_load) >= load_period => {
                    due.push((slot.name.clone(), slot.handle.clone(), false));
                }
                ReplicaState::Draining => {
                    let patience_over = now.duration_since(slot.since) >= ACK_PATIENCE;
                    let out_of_routing =
                        slot.left_in <= table_version && (self.everyone_installed(slot.left_in) || patience_over);
                    let quiet = slot.ongoing == 0 && slot.idle_ms >= DRAIN_IDLE.as_millis() as u64;
                    let overdue = now.duration_since(slot.since) >= config.graceful_shutdown_timeout;
                    if (out_of_routing && quiet && slot.last_load > slot.since) || overdue {
                        idle.push(slot.name.clone());
                    } else if now.duration_since(slot.last_load) >= DRAIN_PROBE_PERIOD {
                        due.push((slot.name.clone(), slot.handle.clone(), false));
                    }
                }
                _ => {}
            }
        }
        for replica in idle {
            self.stop(&replica);
        }
        for (name, handle, health) in due {
            if let Some(slot) = self.replica_mut(&name) {
                slot.probing = true;
            }
            match health {
                true => self.probe_health(name, handle, config.health_check_timeout),
                false => self.probe_load(name, handle),
            }
        }
    }

    fn probe_health(&self, name: String, handle: ReplicaHandle, timeout: Duration) {
        let check = async move { handle.check_health().get_async().await.map_err(|e| e.to_string()) };
        self.probe(timeout, check, move |result| Event::Health { replica: name, result });
    }

    fn probe_load(&self, name: String, handle: ReplicaHandle) {
        let load = async move { handle.load().get_async().await.map_err(|e| e.to_string()) };
        self.probe(PROBE_TIMEOUT, load, move |result| Event::Load {
            replica: name,
            load: result.ok(),
        });
    }

    /// Asks every proxy for its queues about twice a second, or every tick
    /// while a deployment is scaled to zero, whose first request waits for
    /// the controller to see it.
    fn probe_proxies(&mut self, now: Instant) {
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
            let queued = async move { handle.queued().get_async().await.map_err(|e| e.to_string()) };
            self.probe(PROBE_TIMEOUT, queued, move |result| Event::ProxyQueues {
                node_id,
                queues: result.ok(),
            });
        }
    }

    /// Whether every proxy and running replica has installed table
    /// `version` or a newer one.
    fn everyone_installed(&self, version: u64) -> bool {
        let proxies = self.proxies.values().all(|proxy| proxy.acked >= version);
        let replicas = self.apps.values().flat_map(|app| &app.deployments).all(|deployment| {
            deployment
                .replicas
                .iter()
                .filter(|slot| slot.state == ReplicaState::Running)
                .all(|slot| slot.acked >= version)
        });
        proxies && replicas
    }

    // The routing table.

    /// Sends a new routing table to every proxy and running replica, and
    /// to drivers that follow it.
    fn push_table(&mut self) {
        self.table_dirty = false;
        self.table_version += 1;
        let version = self.table_version;
        let table = self.routing_table();
        self.shared.table.send_replace(Arc::new((version, table.clone())));
        let proxies = self
            .proxies
            .values()
            .filter(|proxy| proxy.address.is_some())
            .map(|proxy| (proxy.node_id.clone(), Target::Proxy(proxy.handle.clone())));
        let replicas = self
            .apps
            .values()
            .flat_map(|app| &app.deployments)
            .flat_map(|deployment| &deployment.replicas)
            .filter(|slot| slot.state == ReplicaState::Running)
            .map(|slot| (slot.name.clone(), Target::Replica(slot.handle.clone())));
        let targets: Vec<(String, Target)> = proxies.chain(replicas).collect();
        for (name, target) in targets {
            let table = table.clone();
            let install = async move {
                let installed = match target {
                    Target::Proxy(proxy) => proxy.install_routes(table).get_async().await,
                    Target::Replica(replica) => replica.install_routes(table).get_async().await,
                };
                installed.map_err(|e| e.to_string())
            };
            self.probe(PROBE_TIMEOUT, install, move |result| match result {
                Ok(()) => Event::Installed { target: name, version },
                Err(_) => Event::Installed {
                    target: name,
                    version: 0,
                },
            });
        }
    }

    /// Every application's route and every deployment's running replicas.
    fn routing_table(&self) -> RoutingTable {
        let live = self.apps.values().filter(|app| !app.deleting);
        let apps = live
            .clone()
            .map(|app| AppRoute {
                app: app.config.name.clone(),
                route_prefix: app.config.route_prefix.clone(),
                public: app.config.public,
                ingress: app.config.deployments[0].name.clone(),
                streaming: crate::registry::find(&app.config.deployments[0].class).is_some_and(|class| class.streaming),
            })
            .collect();
        let deployments = live
            .flat_map(|app| app.deployments.iter().filter(|d| !d.removed).map(move |d| (app, d)))
            .map(|(app, deployment)| DeploymentRoutes {
                app: app.config.name.clone(),
                deployment: deployment.config.name.clone(),
                class: deployment.config.class.clone(),
                max_ongoing_requests: deployment.config.max_ongoing_requests,
                max_queued_requests: deployment.config.queue_limit(),
                awaits_replicas: deployment.failed.is_none(),
                replicas: deployment
                    .replicas
                    .iter()
                    .filter(|slot| slot.state == ReplicaState::Running)
                    .map(|slot| (slot.name.clone(), slot.handle.clone()))
                    .collect(),
            })
            .collect();
        RoutingTable { apps, deployments }
    }

    // Lookups.

    /// Requests waiting in routers, by application and deployment: in the
    /// proxies', the replicas' and the drivers' (their handles').
    fn queued_requests(&self) -> BTreeMap<(String, String), u32> {
        let replicas = (self.apps.values().flat_map(|app| &app.deployments))
            .flat_map(|deployment| &deployment.replicas)
            .flat_map(|slot| &slot.queues);
        let proxies = self.proxies.values().flat_map(|proxy| &proxy.queues);
        let drivers = (self.driver_queues.values())
            .filter(|(at, _)| at.elapsed() < DRIVER_REPORT_TTL)
            .flat_map(|(_, queues)| queues);
        let mut queued = BTreeMap::new();
        for report in proxies.chain(replicas).chain(drivers) {
            *queued
                .entry((report.app.clone(), report.deployment.clone()))
                .or_insert(0) += report.waiting;
        }
        queued
    }

    fn deployment(&self, app: &str, deployment: &str) -> Option<&DeploymentState> {
        let app = self.apps.get(app)?;
        app.deployments.iter().find(|d| d.config.name == deployment)
    }

    fn deployment_mut(&mut self, app: &str, deployment: &str) -> Option<&mut DeploymentState> {
        let app = self.apps.get_mut(app)?;
        app.deployments.iter_mut().find(|d| d.config.name == deployment)
    }

    /// The deployment that has replica `name`.
    fn deployment_of(&mut self, name: &str) -> Option<&mut DeploymentState> {
        self.apps
            .values_mut()
            .flat_map(|app| &mut app.deployments)
            .find(|d| d.replicas.iter().any(|slot| slot.name == name))
    }

    fn replica_mut(&mut self, name: &str) -> Option<&mut ReplicaSlot> {
        self.deployment_of(name)?.slot_mut(name)
    }
}

/// Where a routing table is installed.
enum Target {
    Proxy(HttpProxyHandle),
    Replica(ReplicaHandle),
}
