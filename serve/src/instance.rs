//! Deploying from Rust: [`run`] hands an application to the cluster's
//! Serve controller (started on first use) and waits until it runs
//! behind every proxy; [`status`], [`delete`] and [`shutdown`] are the
//! rest of the API, as `serve.run`, `serve.status`, `serve.delete` and
//! `serve.shutdown` are in Ray. The controller and everything it starts
//! are detached: on a started cluster an application keeps serving after
//! the program that deployed it exits.
//!
//! A driver that deployed routes its handles' requests itself: it follows
//! the controller's routing table, and while requests wait in its routers
//! (for a deployment scaled to zero, say) it reports them to the
//! controller, which cannot poll a driver as it polls proxies and
//! replicas.

use std::net::SocketAddr;
use std::sync::Once;
use std::time::{Duration, Instant};

use raylet::Cluster;

use crate::config::{Application, HttpOptions};
use crate::controller::{self, ServeControllerHandle};
use crate::deployment::Deployment;
use crate::error::{Result, ServeError};
use crate::handle::DeploymentHandle;
use crate::proxy::HttpProxy;
use crate::routes::{self, QueueReport};
use crate::status::{AppState, ServeStatus};

/// How long a deploy may take to run (replicas loading models included).
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a deleted application may take to stop.
const DELETE_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a driver looks for requests waiting in its routers, and
/// reports them while there are any.
const QUEUE_REPORT_PERIOD: Duration = Duration::from_millis(200);

/// A running application: its proxies' addresses, handles to its
/// deployments, and [`ServeInstance::shutdown`].
pub struct ServeInstance {
    controller: ServeControllerHandle,
    app: String,
    addresses: Vec<SocketAddr>,
}

/// Deploys `app` behind proxies on port 8000 of every alive node.
pub fn run(cluster: &Cluster, app: Application) -> Result<ServeInstance> {
    run_with(cluster, app, HttpOptions::default())
}

/// Deploys `app`, starting Serve with the given HTTP options (port 0 for
/// any free port) if it is not running yet; a running Serve keeps its
/// own. Deploying an application of the same name again updates it: new
/// replicas start, take over the traffic, and the old ones drain, with no
/// request dropped. A deploy that fails (a replica that cannot be built,
/// three times in a row) is deleted again, and the error says why.
///
/// While it waits, what keeps the application from running (replicas that
/// wait for resources and what for, proxies that fail to start) is logged
/// as a warning each time it changes (on stderr when the program installs
/// no `tracing` subscriber), and named in the error if the wait times out.
/// When no proxy can start (its port is taken), it fails with
/// [`ServeError::NoProxy`] once one has failed twice in a row; the
/// application stays deployed and the proxy is tried again with back-off.
pub fn run_with(cluster: &Cluster, app: Application, http: HttpOptions) -> Result<ServeInstance> {
    run_reporting(cluster, app, http, &mut warn)
}

/// How many times in a row a proxy fails to start before a deploy with no
/// proxy running fails.
const PROXY_ATTEMPTS: u32 = 2;

/// Logs `line` as a warning, on stderr when no subscriber would show it.
fn warn(line: &str) {
    match tracing::dispatcher::has_been_set() {
        true => tracing::warn!("{line}"),
        false => eprintln!("raylet serve: {line}"),
    }
}

/// [`run_with`], handing each new line of what keeps the application from
/// running to `report`.
pub(crate) fn run_reporting(
    cluster: &Cluster,
    app: Application,
    http: HttpOptions,
    report: &mut dyn FnMut(&str),
) -> Result<ServeInstance> {
    app.validate()?;
    let controller = controller::get_or_start(cluster, &http)?;
    let name = app.name.clone();
    controller.deploy(app).get_timeout(READY_TIMEOUT)?;
    let status = wait_until_settled(&controller, &name, report)?;
    let app_status = status.app(&name).ok_or_else(|| ServeError::NoSuchApp(name.clone()))?;
    if app_status.state == AppState::DeployFailed {
        let message = app_status.message.clone();
        delete_app(&controller, &name)?;
        return Err(ServeError::DeployFailed { app: name, message });
    }
    follow_routes(cluster, &controller)?;
    let addresses = status
        .proxies
        .iter()
        .filter_map(|proxy| proxy.address.parse().ok())
        .collect();
    Ok(ServeInstance {
        controller,
        app: name,
        addresses,
    })
}

/// Polls the status until application `name` runs behind installed
/// routes, or failed; reports each new line of what keeps it; fails when
/// no proxy can start, or after [`READY_TIMEOUT`].
fn wait_until_settled(
    controller: &ServeControllerHandle,
    name: &str,
    report: &mut dyn FnMut(&str),
) -> Result<ServeStatus> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut reported = Vec::new();
    loop {
        let status = controller.status().get_timeout(READY_TIMEOUT)?;
        let problems = status.problems(name);
        for line in problems.iter().filter(|line| !reported.contains(*line)) {
            report(line);
        }
        reported = problems;
        match settled(&status, name) {
            Settled::Yes => return Ok(status),
            Settled::NoProxy(problem) => {
                return Err(ServeError::NoProxy {
                    app: name.to_string(),
                    problem,
                });
            }
            Settled::No => {}
        }
        if Instant::now() >= deadline {
            let why = match reported.is_empty() {
                true => vec!["`raylet serve status` shows where it is".to_string()],
                false => reported,
            };
            return Err(ServeError::NotRunning {
                app: name.to_string(),
                after: READY_TIMEOUT,
                why,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where a deploy of application `name` is.
enum Settled {
    /// It runs behind installed routes, or failed.
    Yes,
    No,
    /// It runs, but no proxy does and one keeps failing to start.
    NoProxy(String),
}

fn settled(status: &ServeStatus, name: &str) -> Settled {
    match status.app(name).map(|app| app.state) {
        Some(AppState::DeployFailed) => Settled::Yes,
        Some(AppState::Running) if !status.proxies.is_empty() => match status.routes_installed {
            true => Settled::Yes,
            false => Settled::No,
        },
        Some(AppState::Running) => {
            let failing = status.proxy_failures.iter().find(|p| p.failures >= PROXY_ATTEMPTS);
            failing.map_or(Settled::No, |failure| Settled::NoProxy(failure.describe()))
        }
        _ => Settled::No,
    }
}

/// What Serve runs on the cluster.
pub fn status(cluster: &Cluster) -> Result<ServeStatus> {
    let controller = controller::find(cluster)?;
    Ok(controller.status().get_timeout(READY_TIMEOUT)?)
}

/// Deletes application `app` and waits until its replicas have stopped.
pub fn delete(cluster: &Cluster, app: &str) -> Result<()> {
    delete_app(&controller::find(cluster)?, app)
}

fn delete_app(controller: &ServeControllerHandle, app: &str) -> Result<()> {
    if !controller.delete(app.to_string()).get_timeout(DELETE_TIMEOUT)? {
        return Err(ServeError::NoSuchApp(app.to_string()));
    }
    let what = format!("stopping application `{app}`");
    controller::wait_for_status(controller, DELETE_TIMEOUT, &what, |status| status.app(app).is_none())?;
    Ok(())
}

/// Deletes every application, then stops the proxies and the controller.
pub fn shutdown(cluster: &Cluster) -> Result<()> {
    let Ok(controller) = controller::find(cluster) else {
        return Ok(());
    };
    let status = controller.status().get_timeout(DELETE_TIMEOUT)?;
    for app in &status.apps {
        delete_app(&controller, &app.name)?;
    }
    for proxy in &status.proxies {
        let name = format!("proxy:{}", proxy.node_id);
        if let Ok(proxy) = cluster.get_actor_in::<HttpProxy>(controller::NAMESPACE, &name) {
            cluster.kill(&proxy, true)?;
        }
    }
    cluster.kill(&controller, true)?;
    Ok(())
}

/// Installs the controller's routing table in this process and keeps it
/// current from a thread (one per process), so that handles made here
/// route like the proxies; another thread reports the requests waiting in
/// this process's routers.
fn follow_routes(cluster: &Cluster, controller: &ServeControllerHandle) -> Result<()> {
    let (version, table) = controller.routes(0).get_timeout(READY_TIMEOUT)?;
    routes::install(table);
    static FOLLOWING: Once = Once::new();
    let cluster = cluster.clone();
    FOLLOWING.call_once(move || {
        let reporting = cluster.clone();
        let follow = move || follow(&cluster, version);
        if let Err(e) = std::thread::Builder::new().name("serve-routes".into()).spawn(follow) {
            tracing::warn!("following Serve's routing table: {e}");
        }
        let report = move || report_queues(&reporting);
        if let Err(e) = std::thread::Builder::new().name("serve-queues".into()).spawn(report) {
            tracing::warn!("reporting the requests waiting in this driver: {e}");
        }
    });
    Ok(())
}

/// Reports the requests waiting in this process's routers to the
/// controller while there are any, for the rest of the process's life.
fn report_queues(cluster: &Cluster) {
    let driver = format!("{} pid {}", cluster.node_ip(), std::process::id());
    loop {
        std::thread::sleep(QUEUE_REPORT_PERIOD);
        let waiting: Vec<QueueReport> = routes::queued().into_iter().filter(|queue| queue.waiting > 0).collect();
        if waiting.is_empty() {
            continue;
        }
        let reported = controller::find(cluster).and_then(|controller| {
            let report = controller.report_queues(driver.clone(), waiting);
            Ok(report.get_timeout(Duration::from_secs(5))?)
        });
        if let Err(e) = reported {
            tracing::debug!("reporting the requests waiting in this driver: {e}");
        }
    }
}

/// Long-polls the controller for new tables, finding it again after a
/// restart, for the rest of the process's life.
fn follow(cluster: &Cluster, mut version: u64) {
    loop {
        let polled = controller::find(cluster)
            .and_then(|controller| Ok(controller.routes(version).get_timeout(Duration::from_secs(30))?));
        match polled {
            Ok((newer, table)) => {
                if newer != version {
                    routes::install(table);
                    version = newer;
                }
            }
            Err(e) => {
                tracing::debug!("polling Serve's routing table: {e}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
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

    /// The application's name.
    pub fn name(&self) -> &str {
        &self.app
    }

    /// A handle to deployment `name` of this application, which must be a
    /// `D`; it routes like the proxies.
    pub fn handle<D: Deployment>(&self, name: &str) -> Result<DeploymentHandle<D>> {
        DeploymentHandle::new(&self.app, name).resolve()
    }

    /// What Serve runs now.
    pub fn status(&self) -> Result<ServeStatus> {
        Ok(self.controller.status().get_timeout(READY_TIMEOUT)?)
    }

    /// Deletes the application and waits until its replicas have stopped.
    pub fn shutdown(self) -> Result<()> {
        delete_app(&self.controller, &self.app)
    }
}
