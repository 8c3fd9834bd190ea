//! The Serve controller: one detached, named actor (`controller` in
//! namespace `serve`) that owns every replica and proxy of the cluster.
//!
//! **State.** What should run (each [`Application`]) is kept in the head's
//! key-value store, namespace `_raylet_serve`, key `apps/<name>`, so it
//! survives a restart of the controller (it restarts without limit) and of
//! the head. What does run is found again by name (`replica:..`,
//! `proxy:..`) after a restart. `raylet serve delete` deletes the key; the
//! controller notices within a second.
//!
//! **Work.** The actor's methods only hand commands to the
//! [`reconciler`] thread, which makes every blocking cluster call and
//! converges what runs towards what should: it starts, health-checks,
//! drains and stops replicas, rolls out new versions, autoscales, keeps a
//! proxy on every alive node and pushes the routing table to the proxies
//! and replicas. Drivers follow the table through [`ServeController::routes`],
//! a long poll.
//!
//! **Cost.** A tick every 100 ms of local work; cluster calls at most
//! about once a second per replica and proxy (load and health probes), one
//! `list_actors` a second, and one push of the table per change.

mod autoscaler;
mod builds;
mod deployment_state;
mod proxies;
mod reconciler;
mod replica_set;
mod store;
mod waiting;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raylet::Cluster;
use tokio::sync::watch;

use crate::config::{Application, HttpOptions};
use crate::error::{Result, ServeError};
use crate::routes::{QueueReport, RoutingTable};
use crate::status::ServeStatus;
use reconciler::{Command, Reconciler};
pub(crate) use store::KV_NAMESPACE;

/// The namespace of Serve's actors.
pub(crate) const NAMESPACE: &str = "serve";
/// The controller's actor name.
const CONTROLLER_NAME: &str = "controller";
/// How long a long poll for the routing table waits for a change.
const LONG_POLL: Duration = Duration::from_secs(10);

/// A version of the routing table.
pub type VersionedTable = (u64, RoutingTable);

/// What the actor and the reconciler thread share.
struct Shared {
    status: Mutex<ServeStatus>,
    table: watch::Sender<Arc<VersionedTable>>,
    stop: AtomicBool,
}

/// The controller actor.
#[raylet::actor]
pub struct ServeController {
    shared: Arc<Shared>,
    commands: SyncSender<Command>,
}

#[raylet::actor]
impl ServeController {
    pub fn new(http: HttpOptions) -> Result<Self, ServeError> {
        let cluster = raylet::current()?;
        let (table, _) = watch::channel(Arc::new((0, RoutingTable::default())));
        let shared = Arc::new(Shared {
            status: Mutex::new(ServeStatus::default()),
            table,
            stop: AtomicBool::new(false),
        });
        let (commands, received) = sync_channel(16);
        let reconciler = Reconciler::new(cluster, http, shared.clone(), received)?;
        std::thread::Builder::new()
            .name("serve-controller".into())
            .spawn(move || reconciler.run())?;
        Ok(ServeController { shared, commands })
    }

    /// Deploys or updates `app`; returns once it is recorded. Its progress
    /// shows in [`ServeController::status`].
    pub fn deploy(&self, app: Application) -> Result<(), ServeError> {
        app.validate()?;
        let (done, answer) = sync_channel(1);
        self.send(Command::Deploy { app, done })?;
        answer.recv().map_err(|_| stopped())?
    }

    /// Deletes application `app`; returns whether there was one. Its
    /// replicas stop in the background.
    pub fn delete(&self, app: String) -> Result<bool, ServeError> {
        let (done, answer) = sync_channel(1);
        self.send(Command::Delete { app, done })?;
        answer.recv().map_err(|_| stopped())
    }

    /// The requests waiting in a driver's routers (its handles'), which
    /// the controller cannot poll as it polls proxies and replicas: the
    /// driver reports them while any wait, and a report counts for a
    /// second.
    pub fn report_queues(&self, driver: String, queues: Vec<QueueReport>) -> Result<(), ServeError> {
        self.send(Command::Queues { driver, queues })
    }

    /// What runs now.
    pub fn status(&self) -> ServeStatus {
        self.shared.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The routing table once its version differs from `known`, or after
    /// about 10 s.
    pub async fn routes(&self, known: u64) -> VersionedTable {
        let mut table = self.shared.table.subscribe();
        let changed = table.wait_for(|current| current.0 != known);
        let _ = tokio::time::timeout(LONG_POLL, changed).await;
        let current = table.borrow().clone();
        (*current).clone()
    }
}

impl ServeController {
    fn send(&self, command: Command) -> Result<()> {
        self.commands.send(command).map_err(|_| stopped())
    }
}

impl Drop for ServeController {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn stopped() -> ServeError {
    ServeError::ControllerGone("its reconciler thread has stopped".into())
}

/// The cluster's controller, started with `http` if there is none.
pub(crate) fn get_or_start(cluster: &Cluster, http: &HttpOptions) -> Result<ServeControllerHandle> {
    for _ in 0..3 {
        if let Ok(controller) = find(cluster) {
            match builds::check(cluster, controller)? {
                builds::Controller::Ours(controller) => return Ok(controller),
                builds::Controller::Retired => {}
            }
        }
        let started = ServeController::remote(cluster, http.clone())
            .num_cpus(0.0)
            .name(CONTROLLER_NAME)
            .namespace(NAMESPACE)
            .detached()
            .max_restarts(-1)
            .max_concurrency(64)
            .spawn();
        match started {
            Ok(controller) => return Ok(controller),
            // Another driver started one first: look it up again.
            Err(e) => tracing::debug!("starting the serve controller: {e}"),
        }
    }
    find(cluster)
}

/// The cluster's controller, if one runs.
pub(crate) fn find(cluster: &Cluster) -> Result<ServeControllerHandle> {
    cluster
        .get_actor_in::<ServeController>(NAMESPACE, CONTROLLER_NAME)
        .map_err(|e| ServeError::ControllerGone(e.to_string()))
}

/// Waits until `ready` holds for the controller's status, or `timeout`
/// passes; returns the status that satisfied it.
pub(crate) fn wait_for_status(
    controller: &ServeControllerHandle,
    timeout: Duration,
    what: &str,
    ready: impl Fn(&ServeStatus) -> bool,
) -> Result<ServeStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        let status = controller.status().get_timeout(timeout)?;
        if ready(&status) {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            return Err(ServeError::WaitTimedOut {
                waiting_for: what.to_string(),
                after: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
