//! What the controller reports: its [`ServeStatus`], recomputed every
//! tick, kept for the actor's `status` method and published to the
//! dashboard when it changed (and once a second), with the metrics.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::super::deployment_state::{DeploymentState, ReplicaSlot};
use super::super::proxies::ProxySlot;
use super::{App, PUBLISH_PERIOD, Reconciler};
use crate::figures;
use crate::metrics;
use crate::status::{AppState, AppStatus, DeploymentStatus, ReplicaState, RequestCounts, ServeStatus};

impl Reconciler {
    /// Recomputes the status; publishes it when it changed, when `now`,
    /// or once a second.
    pub(super) fn refresh_status(&mut self, now: bool) {
        let status = self.status();
        metrics::record_controller(&status);
        let changed = {
            let mut compared = status.clone();
            compared.updated_at_ms = self.published.updated_at_ms;
            compared != self.published
        };
        *self.shared.status.lock().unwrap_or_else(|p| p.into_inner()) = status.clone();
        if !(changed || now || self.last_publish.elapsed() >= PUBLISH_PERIOD) {
            return;
        }
        self.last_publish = Instant::now();
        if let Err(e) = self.cluster.publish_to_dashboard("serve", "status", &status) {
            tracing::debug!("publishing the serve status: {e}");
        }
        self.published = status;
    }

    fn status(&self) -> ServeStatus {
        let now = Instant::now();
        ServeStatus {
            updated_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_millis() as u64),
            routes_version: self.table_version,
            routes_installed: self.installed_everywhere() >= self.table_version,
            controller: self.controller.clone(),
            proxies: self.proxies.values().filter_map(ProxySlot::status).collect(),
            proxy_failures: (self.proxy_failures.iter())
                .map(|(node, failure)| failure.status(node, now))
                .collect(),
            apps: self.apps.values().map(|app| app_status(app, now)).collect(),
        }
    }
}

fn app_status(app: &App, now: Instant) -> AppStatus {
    let failed = app.deployments.iter().find_map(|d| d.failed.clone());
    let unhealthy = (app.deployments.iter())
        .find_map(|d| d.unhealthy.as_ref())
        .map(|(message, next)| {
            let next = next.saturating_duration_since(now).as_secs_f64();
            format!("{message} (starting another in {next:.0} s)")
        });
    let state = match (&failed, &unhealthy, app.deleting) {
        (_, _, true) => AppState::Deleting,
        (Some(_), _, false) => AppState::DeployFailed,
        (None, Some(_), false) => AppState::Unhealthy,
        (None, None, false) if app.deployments.iter().all(|d| d.converged(false)) => AppState::Running,
        (None, None, false) => AppState::Deploying,
    };
    AppStatus {
        name: app.config.name.clone(),
        route_prefix: app.config.route_prefix.clone(),
        public: app.config.public,
        state,
        message: failed.or(unhealthy).unwrap_or_default(),
        deployments: app
            .deployments
            .iter()
            .map(|d| deployment_status(d, app.deleting, now))
            .collect(),
    }
}

fn deployment_status(deployment: &DeploymentState, deleting: bool, now: Instant) -> DeploymentStatus {
    let live = deployment.replicas.iter().map(|slot| slot.counts);
    let requests = live.fold(deployment.retired, |sum, counts| RequestCounts {
        total: sum.total + counts.total,
        errors: sum.errors + counts.errors,
    });
    DeploymentStatus {
        name: deployment.config.name.clone(),
        class: deployment.config.class.clone(),
        version: deployment.version.clone(),
        target_replicas: deployment.target(deleting),
        max_ongoing_requests: deployment.config.max_ongoing_requests,
        replicas: deployment.replicas.iter().map(ReplicaSlot::status).collect(),
        requests,
        autoscaling: deployment.autoscaler.as_ref().map(|scaler| scaler.status(now)),
        figures: figures::combine(
            (deployment.replicas.iter())
                .filter(|slot| slot.state == ReplicaState::Running)
                .map(|slot| slot.figures.as_slice()),
        ),
    }
}
