//! The routing table the reconciler sends: every application's route and
//! every deployment's running replicas, pushed to each proxy and running
//! replica (and to drivers, which follow it by long poll) whenever it
//! changes; and how far the installs have come, which says when a draining
//! replica is out of routing everywhere.

use std::sync::Arc;

use super::super::replica_set::ProbeError;
use super::probes::PROBE_TIMEOUT;
use super::{Event, Reconciler};
use crate::proxy::HttpProxyHandle;
use crate::replica::ReplicaHandle;
use crate::routes::{AppRoute, DeploymentRoutes, RoutingTable};
use crate::status::ReplicaState;

/// Where a routing table is installed.
enum Target {
    Proxy(HttpProxyHandle),
    Replica(ReplicaHandle),
}

impl Reconciler {
    /// Sends a new routing table to every proxy and running replica, and
    /// to drivers that follow it.
    pub(super) fn push_table(&mut self) {
        self.table_dirty = false;
        self.table_version += 1;
        let version = self.table_version;
        let table = self.routing_table();
        self.shared.table.send_replace(Arc::new((version, table.clone())));
        for (name, target) in self.install_targets() {
            let table = table.clone();
            let install = async move {
                let installed = match target {
                    Target::Proxy(proxy) => proxy.install_routes(table).get_async().await,
                    Target::Replica(replica) => replica.install_routes(table).get_async().await,
                };
                installed.map_err(ProbeError::from)
            };
            self.launcher
                .probe(PROBE_TIMEOUT, install, move |result| Event::Installed {
                    target: name,
                    version: if result.is_ok() { version } else { 0 },
                });
        }
    }

    /// Every ready proxy (by node id) and running replica (by name).
    fn install_targets(&self) -> Vec<(String, Target)> {
        let proxies = (self.proxies.values())
            .filter(|proxy| proxy.address.is_some())
            .map(|proxy| (proxy.node_id.clone(), Target::Proxy(proxy.handle.clone())));
        let replicas = (self.apps.values())
            .flat_map(|app| &app.deployments)
            .flat_map(|deployment| &deployment.replicas)
            .filter(|slot| slot.state == ReplicaState::Running)
            .map(|slot| (slot.name.clone(), Target::Replica(slot.handle.clone())));
        proxies.chain(replicas).collect()
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
                streaming: crate::registry::find(&app.config.deployments[0].class).is_ok_and(|class| class.streaming),
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

    /// A proxy (by node id) or a replica (by name) installed table
    /// `version` (0 when the install failed).
    pub(super) fn installed(&mut self, target: &str, version: u64) {
        if let Some(proxy) = self.proxies.get_mut(target) {
            proxy.acked = proxy.acked.max(version);
        } else if let Some(slot) = self.replica_mut(target) {
            slot.acked = slot.acked.max(version);
        }
    }

    /// The newest table version that every proxy and running replica has
    /// installed (`u64::MAX` when there is none of either).
    pub(super) fn installed_everywhere(&self) -> u64 {
        let proxies = self.proxies.values().map(|proxy| proxy.acked);
        let replicas = (self.apps.values())
            .flat_map(|app| &app.deployments)
            .flat_map(|deployment| &deployment.replicas)
            .filter(|slot| slot.state == ReplicaState::Running)
            .map(|slot| slot.acked);
        proxies.chain(replicas).min().unwrap_or(u64::MAX)
    }
}
