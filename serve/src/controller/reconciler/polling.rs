//! The reconciler's once-a-second look at the cluster: which applications
//! are still recorded, which replicas and proxies died, which unplaced
//! replicas wait for resources (see [`waiting`]), and which nodes need a
//! proxy (started again after a back-off when the last one failed to
//! start); and, when the controller starts, taking back what a previous one
//! left.

use std::collections::BTreeMap;
use std::time::Instant;

use raylet::ResourceSet;
use raylet::status::ClusterStatus;
use raylet::{ActorState, SchedulingStrategy};

use super::super::deployment_state::ReplicaSlot;
use super::super::proxies::{ProxyFailure, ProxySlot, proxy_name};
use super::super::waiting::{self, Unplaced};
use super::super::{NAMESPACE, store};
use super::probes::BUILD_TIMEOUT;
use super::{Event, Reconciler};
use crate::error::Result;
use crate::proxy::HttpProxy;
use crate::replica::Replica;
use crate::status::ReplicaState;

impl Reconciler {
    /// Reads what should run (an application deleted from the key-value
    /// store is torn down), which replicas and proxies died, and which
    /// nodes need a proxy.
    pub(super) fn poll_cluster(&mut self) {
        match store::names(&self.cluster) {
            Ok(recorded) => {
                for app in self.apps.values_mut().filter(|app| !app.deleting) {
                    if !recorded.contains(&app.config.name) {
                        tracing::info!(app = %app.config.name, "deleted from the key-value store: tearing it down");
                        app.deleting = true;
                        self.table_dirty = true;
                    }
                }
            }
            Err(e) => tracing::warn!("reading the recorded applications: {e}"),
        }
        match self.cluster.list_actors() {
            Ok(actors) => self.note_actors(&actors),
            Err(e) => tracing::warn!("listing the actors: {e}"),
        }
        let cluster = match self.cluster.status() {
            Ok(cluster) => cluster,
            Err(e) => {
                tracing::warn!("reading the cluster's status: {e}");
                return;
            }
        };
        self.note_waiting(&cluster);
        if let Err(e) = self.ensure_proxies(&cluster) {
            tracing::warn!("starting proxies: {e}");
        }
    }

    /// Says which unplaced replicas wait for room, and what for; logs when
    /// one starts or stops waiting.
    fn note_waiting(&mut self, cluster: &ClusterStatus) {
        let deployments = self.apps.values_mut().flat_map(|app| &mut app.deployments);
        let mut slots: Vec<(&mut ReplicaSlot, ResourceSet)> = Vec::new();
        for deployment in deployments {
            let shape = waiting::shape(deployment.config.num_cpus, deployment.config.num_gpus);
            slots.extend(deployment.replicas.iter_mut().map(|slot| (slot, shape.clone())));
        }
        let unplaced: Vec<Unplaced<'_>> = slots
            .iter()
            .filter(|(slot, _)| slot.state == ReplicaState::Starting && slot.pending)
            .map(|(slot, shape)| Unplaced {
                name: &slot.name,
                shape,
                since: slot.since,
            })
            .collect();
        let mut reasons = waiting::waiting(cluster, &unplaced);
        for (slot, _) in slots {
            let reason = reasons.remove(&slot.name);
            match (&slot.waiting, &reason) {
                (None, Some(reason)) => tracing::warn!(replica = %slot.name, "{reason}"),
                (Some(_), None) => tracing::info!(
                    replica = %slot.name,
                    "no longer waits for resources, {:.1} s after it was created",
                    slot.since.elapsed().as_secs_f64()
                ),
                _ => {}
            }
            slot.waiting = reason;
        }
    }

    /// Takes each replica's and proxy's node and pid, and drops the dead.
    fn note_actors(&mut self, actors: &[raylet::ActorInfo]) {
        let serve = |actor: &&raylet::ActorInfo| actor.namespace == NAMESPACE;
        let by_name: BTreeMap<&str, &raylet::ActorInfo> =
            actors.iter().filter(serve).map(|a| (a.name.as_str(), a)).collect();
        if let Some(me) = actors.iter().filter(serve).find(|a| a.pid == self.controller.pid) {
            self.controller.node_id = me.node_id.map(|id| id.to_string()).unwrap_or_default();
        }
        let mut dead = Vec::new();
        for slot in self
            .apps
            .values_mut()
            .flat_map(|app| &mut app.deployments)
            .flat_map(|d| &mut d.replicas)
        {
            match by_name.get(slot.name.as_str()) {
                Some(actor) if actor.state == ActorState::Dead => {
                    dead.push((slot.name.clone(), actor.death_cause.clone()))
                }
                Some(actor) => {
                    slot.pid = actor.pid;
                    slot.node_id = actor.node_id.map(|id| id.to_string()).unwrap_or_default();
                    slot.pending = actor.state != ActorState::Alive;
                }
                None => {}
            }
        }
        for (replica, cause) in dead {
            tracing::warn!(replica, "a replica died: {cause}");
            self.stopped(&replica);
        }
        let dead_proxies: Vec<(String, String)> = self
            .proxies
            .keys()
            .filter_map(|node| {
                let actor = by_name.get(proxy_name(node).as_str())?;
                (actor.state == ActorState::Dead).then(|| (node.clone(), actor.death_cause.clone()))
            })
            .collect();
        for (node, cause) in dead_proxies {
            let ready = self.proxies.remove(&node).is_some_and(|proxy| proxy.address.is_some());
            match ready {
                true => tracing::warn!(node, "a serve proxy died ({cause}); starting another"),
                false => self.proxy_failed(&node, cause),
            }
        }
    }

    /// Starts a proxy on every alive node that has none, unless the last
    /// one there failed to start and its back-off is not over.
    fn ensure_proxies(&mut self, status: &ClusterStatus) -> Result<()> {
        let alive: Vec<String> = status.alive().map(|node| node.node_id.to_string()).collect();
        self.proxies.retain(|node, _| alive.contains(node));
        self.proxy_failures.retain(|node, _| alive.contains(node));
        let now = Instant::now();
        for node in status.alive() {
            let node_id = node.node_id.to_string();
            let backing_off = self.proxy_failures.get(&node_id).is_some_and(|f| !f.due(now));
            if self.proxies.contains_key(&node_id) || backing_off {
                continue;
            }
            let handle = match self.cluster.get_actor_in::<HttpProxy>(NAMESPACE, &proxy_name(&node_id)) {
                Ok(found) => found,
                Err(_) => HttpProxy::remote(&self.cluster, self.http.clone())
                    .num_cpus(0.0)
                    .scheduling_strategy(SchedulingStrategy::NodeAffinity {
                        node_id: node.node_id,
                        soft: false,
                    })
                    .name(&proxy_name(&node_id))
                    .namespace(NAMESPACE)
                    .detached()
                    .spawn()?,
            };
            let mut slot = ProxySlot::new(node_id.clone(), handle.clone());
            slot.probing = true;
            self.proxies.insert(node_id.clone(), slot);
            let address = async move { Ok(handle.address().get_async().await?) };
            self.launcher
                .probe(BUILD_TIMEOUT, address, move |result| Event::ProxyReady {
                    node_id,
                    result,
                });
        }
        Ok(())
    }

    /// Takes back what a previous controller recorded and started.
    pub(super) fn recover(&mut self) -> Result<()> {
        for app in store::load_all(&self.cluster)? {
            self.adopt_config(app);
        }
        let actors = self.cluster.list_actors()?;
        let replicas = actors
            .iter()
            .filter(|a| a.namespace == NAMESPACE && a.state != ActorState::Dead && a.name.starts_with("replica:"));
        for actor in replicas {
            self.adopt_replica(&actor.name);
        }
        Ok(())
    }

    /// Takes back replica `name` (`replica:<app>:<deployment>:<index>`), or
    /// kills it when its deployment is gone.
    fn adopt_replica(&mut self, name: &str) {
        let Ok(handle) = self.cluster.get_actor_in::<Replica>(NAMESPACE, name) else {
            return;
        };
        let parts: Vec<&str> = name.splitn(4, ':').collect();
        let index = parts.get(3).and_then(|index| index.parse::<u32>().ok());
        let (Some(app), Some(deployment), Some(index)) = (parts.get(1), parts.get(2), index) else {
            return;
        };
        let Some(state) = self.deployment_mut(app, deployment) else {
            tracing::info!(replica = name, "stopping a replica of a deployment that is gone");
            let _ = self.cluster.kill(&handle, true);
            return;
        };
        state.next_index = state.next_index.max(index + 1);
        let mut slot = ReplicaSlot::new(name.to_string(), handle.clone(), String::new(), Instant::now());
        slot.probing = true;
        state.replicas.push(slot);
        self.launcher.probe_build(name.to_string(), handle);
    }

    /// Counts a failed start of the proxy on `node_id`; the next waits.
    pub(super) fn proxy_failed(&mut self, node_id: &str, error: String) {
        let now = Instant::now();
        let failure = ProxyFailure::after(self.proxy_failures.get(node_id), error, now);
        tracing::error!(
            node = node_id,
            failures = failure.failures,
            "the serve proxy failed to start; next try in {:?}: {}",
            failure.retry_at - now,
            failure.last_error
        );
        self.proxy_failures.insert(node_id.to_string(), failure);
    }
}
