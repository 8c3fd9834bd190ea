//! The controller's thread: it owns every application's state, takes
//! commands from the actor's methods and results from probes, and every
//! [`TICK`] converges what runs towards what should: each deployment's
//! replicas through [`replica_set`] (see
//! [`deployment_state`](super::deployment_state) for the plan).
//!
//! Probes run on a runtime of their own ([`probes`]) and come back as
//! [`Event`]s, so a slow replica never stalls the loop. Blocking cluster
//! calls (creating and killing actors, the key-value store,
//! `list_actors`) are made here, on this thread, never on a core runtime.
//! [`commands`] applies what the actor's methods ask; [`polling`] reads
//! the cluster once a second; [`routing_table`] sends the table;
//! [`report`] makes the status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use raylet::Cluster;

use super::Shared;
use super::deployment_state::{DeploymentState, ReplicaSlot};
use super::proxies::{ProxyFailure, ProxySlot};
use super::replica_set::{self, ProbeError, Round};
use crate::config::{Application, HttpOptions};
use crate::error::Result;
use crate::replica::ReplicaLoad;
use crate::routes::QueueReport;
use crate::status::{ControllerStatus, ServeStatus};
pub(super) use commands::Command;
use probes::ClusterLauncher;

mod commands;
mod polling;
mod probes;
mod report;
mod routing_table;

/// How often the loop converges.
const TICK: Duration = Duration::from_millis(100);
/// How often the key-value store, the actors and the nodes are read.
const POLL_PERIOD: Duration = Duration::from_secs(1);
/// How often the status is published even without a change.
const PUBLISH_PERIOD: Duration = Duration::from_secs(1);
/// How long a driver's report of its waiting requests counts: a driver
/// reports five times a second while requests wait.
pub(super) const DRIVER_REPORT_TTL: Duration = Duration::from_secs(1);

/// What comes back to the thread.
enum Event {
    /// A replica was built and passed its first health check, or not.
    Built {
        replica: String,
        result: std::result::Result<ReplicaLoad, ProbeError>,
    },
    Health {
        replica: String,
        result: std::result::Result<(), ProbeError>,
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
        result: std::result::Result<std::net::SocketAddr, ProbeError>,
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
    launcher: ClusterLauncher,
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
        let (launcher, received) = ClusterLauncher::new(cluster.clone())?;
        let long_ago = Instant::now() - POLL_PERIOD;
        Ok(Reconciler {
            cluster,
            http,
            shared,
            commands,
            launcher,
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

    fn built(&mut self, replica: &str, result: std::result::Result<ReplicaLoad, ProbeError>) {
        if let Some(deployment) = deployment_of(&mut self.apps, replica) {
            self.table_dirty |= deployment.built(replica, result, Instant::now(), &mut self.launcher);
        }
    }

    fn health(&mut self, replica: &str, result: std::result::Result<(), ProbeError>) {
        if let Some(deployment) = deployment_of(&mut self.apps, replica) {
            self.table_dirty |= deployment.health(replica, result, Instant::now(), &mut self.launcher);
        }
    }

    fn load(&mut self, replica: &str, load: Option<ReplicaLoad>) {
        if let Some(deployment) = deployment_of(&mut self.apps, replica) {
            deployment.load(replica, load, Instant::now());
        }
    }

    /// Forgets a replica that stopped or died.
    fn stopped(&mut self, replica: &str) {
        if let Some(deployment) = deployment_of(&mut self.apps, replica) {
            self.table_dirty |= deployment.stopped(replica);
        }
    }

    fn proxy_ready(&mut self, node_id: &str, result: std::result::Result<std::net::SocketAddr, ProbeError>) {
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
            Err(error) => {
                self.proxies.remove(node_id);
                self.proxy_failed(node_id, error.to_string());
            }
        }
    }

    // Converging.

    fn converge_app(&mut self, name: &str, now: Instant) {
        let queued = self.queued_requests();
        let installed_everywhere = self.installed_everywhere();
        let table_version = self.table_version;
        let Some(app) = self.apps.get_mut(name) else {
            return;
        };
        app.deployments.retain(|d| !(d.removed && d.replicas.is_empty()));
        for deployment in &mut app.deployments {
            let key = (name.to_string(), deployment.config.name.clone());
            let round = Round {
                now,
                deleting: app.deleting,
                queued: queued.get(&key).copied().unwrap_or(0),
                table_version,
                installed_everywhere,
            };
            self.table_dirty |= replica_set::converge(deployment, name, &round, &mut self.launcher);
        }
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

    fn deployment_mut(&mut self, app: &str, deployment: &str) -> Option<&mut DeploymentState> {
        let app = self.apps.get_mut(app)?;
        app.deployments.iter_mut().find(|d| d.config.name == deployment)
    }

    fn replica_mut(&mut self, name: &str) -> Option<&mut ReplicaSlot> {
        deployment_of(&mut self.apps, name)?.slot_mut(name)
    }
}

/// The deployment that has replica `name`.
fn deployment_of<'a>(apps: &'a mut BTreeMap<String, App>, name: &str) -> Option<&'a mut DeploymentState> {
    apps.values_mut()
        .flat_map(|app| &mut app.deployments)
        .find(|d| d.replicas.iter().any(|slot| slot.name == name))
}
