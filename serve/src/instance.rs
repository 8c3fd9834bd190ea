//! Deploying from Rust: [`run`] hands an application to the cluster's
//! Serve controller (started on first use) and waits until it runs
//! behind every proxy; [`status`], [`delete`] and [`shutdown`] are the
//! rest of the API, as `serve.run`, `serve.status`, `serve.delete` and
//! `serve.shutdown` are in Ray. The controller and everything it starts
//! are detached: on a started cluster an application keeps serving after
//! the program that deployed it exits.

use std::net::SocketAddr;
use std::sync::Once;
use std::time::Duration;

use raylet::Cluster;

use crate::config::{Application, HttpOptions};
use crate::controller::{self, ServeControllerHandle};
use crate::deployment::Deployment;
use crate::error::{Result, ServeError};
use crate::handle::DeploymentHandle;
use crate::proxy::HttpProxy;
use crate::routes;
use crate::status::{AppState, ServeStatus};

/// How long a deploy may take to run (replicas loading models included).
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a deleted application may take to stop.
const DELETE_TIMEOUT: Duration = Duration::from_secs(120);

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
pub fn run_with(cluster: &Cluster, app: Application, http: HttpOptions) -> Result<ServeInstance> {
    app.validate()?;
    let controller = controller::get_or_start(cluster, &http)?;
    let name = app.name.clone();
    controller.deploy(app).get_timeout(READY_TIMEOUT)?;
    let status = controller::wait_for_status(&controller, READY_TIMEOUT, "the deploy", |status| {
        settled(status, &name)
    })?;
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

/// Whether application `name` runs behind installed routes, or failed.
fn settled(status: &ServeStatus, name: &str) -> bool {
    match status.app(name).map(|app| app.state) {
        Some(AppState::DeployFailed) => true,
        Some(AppState::Running) => status.routes_installed && !status.proxies.is_empty(),
        _ => false,
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
/// route like the proxies.
fn follow_routes(cluster: &Cluster, controller: &ServeControllerHandle) -> Result<()> {
    let (version, table) = controller.routes(0).get_timeout(READY_TIMEOUT)?;
    routes::install(table);
    static FOLLOWING: Once = Once::new();
    let cluster = cluster.clone();
    FOLLOWING.call_once(move || {
        let follow = move || follow(&cluster, version);
        if let Err(e) = std::thread::Builder::new().name("serve-routes".into()).spawn(follow) {
            tracing::warn!("following Serve's routing table: {e}");
        }
    });
    Ok(())
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
