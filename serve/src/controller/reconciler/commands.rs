//! What the controller actor's methods ask of the reconciler: deploying
//! an application (recorded in the key-value store, then converged on),
//! deleting one (its replicas drain in the background), and the requests
//! waiting in a driver's routers.

use std::sync::mpsc::SyncSender;
use std::time::Instant;

use super::super::deployment_state::DeploymentState;
use super::super::store;
use super::{App, Reconciler};
use crate::config::Application;
use crate::error::{Result, ServeError};
use crate::routes::QueueReport;

/// What the actor's methods ask of the thread.
pub(in crate::controller) enum Command {
    Deploy {
        app: Application,
        done: SyncSender<Result<()>>,
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

impl Reconciler {
    pub(super) fn command(&mut self, command: Command) {
        match command {
            Command::Deploy { app, done } => {
                let result = self.deploy(app);
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
    pub(super) fn adopt_config(&mut self, config: Application) {
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
        if let Some(app) = self.apps.get(app)
            && let Some(state) = app.deployments.iter().find(|d| d.config.name == deployment)
        {
            state.reconfigure(&mut self.launcher);
        }
    }
}
