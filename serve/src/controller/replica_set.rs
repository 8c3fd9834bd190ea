//! One deployment's replicas over their lives, apart from the cluster:
//! each round [`converge`] acts on the [plan](super::deployment_state)
//! (starting, draining and stopping replicas), feeds the autoscaler, sends
//! the health and load probes that are due and stops draining replicas
//! once they are out of routing and idle; the `built`, `health`, `load`
//! and `stopped` methods take in what the probes found.
//!
//! Every effect on a replica goes through a [`ReplicaLauncher`]: the
//! controller's launches actors and probes them on its runtime, the tests'
//! records the calls and lets them answer as the cluster would.
//!
//! **Failure.** A replica that fails to build is stopped and counts as a
//! failed start of its version; one that fails a health check, or whose
//! reconfigure fails, is stopped; one that is gone is forgotten. Each is
//! replaced by the next round's plan.

use std::time::{Duration, Instant};

use crate::config::DeploymentConfig;
use crate::deployment::ReplicaContext;
use crate::error::ServeError;
use crate::replica::ReplicaLoad;
use crate::status::{ReplicaState, RequestCounts};

use super::deployment_state::{Action, DeploymentState, ReplicaSlot};

#[cfg(test)]
mod tests;

/// How often running replicas report their load, at most.
pub(super) const LOAD_PERIOD: Duration = Duration::from_secs(1);
/// How often a draining replica is asked whether it is idle.
const DRAIN_PROBE_PERIOD: Duration = Duration::from_millis(100);
/// How long a draining replica must have seen no request before it stops:
/// longer than a routed call takes to arrive.
const DRAIN_IDLE: Duration = Duration::from_millis(300);
/// How long a draining replica waits for every proxy and replica to
/// install the table without it.
const ACK_PATIENCE: Duration = Duration::from_secs(5);

/// What starts, stops and probes replicas. A probe's answer comes back
/// later, through the matching method of [`DeploymentState`].
pub(super) trait ReplicaLauncher {
    /// What calls one replica.
    type Handle: Clone;

    /// Creates replica `replica` of `version`, then waits for it to be
    /// built and healthy: `built` follows.
    fn start(
        &mut self,
        replica: ReplicaContext,
        config: &DeploymentConfig,
        version: &str,
    ) -> Result<Self::Handle, ServeError>;

    /// Kills the replica in the background: `stopped` follows.
    fn stop(&mut self, name: &str, handle: &Self::Handle);

    /// Runs its health check within `timeout`: `health` follows.
    fn probe_health(&mut self, name: &str, handle: &Self::Handle, timeout: Duration);

    /// Asks for its load: `load` follows.
    fn probe_load(&mut self, name: &str, handle: &Self::Handle);

    /// Applies `user_config` in place; a failure comes back as a failed
    /// `health` check.
    fn reconfigure(&mut self, name: &str, handle: &Self::Handle, user_config: Vec<u8>);
}

/// Why a probe of a replica (or of a proxy) gave no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProbeError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("reconfigure: {0}")]
    Reconfigure(#[source] raylet::Error),
    #[error(transparent)]
    Cluster(#[from] raylet::Error),
}

/// What a round of converging one deployment sees besides the deployment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Round {
    pub now: Instant,
    /// Its application is being deleted: it converges to no replica.
    pub deleting: bool,
    /// Requests waiting for it in routers.
    pub queued: u32,
    /// The version of the routing table sent last.
    pub table_version: u64,
    /// The newest table version every proxy and running replica has
    /// installed.
    pub installed_everywhere: u64,
}

/// Converges one deployment of application `app` for a round; returns
/// whether the routing table must change.
pub(super) fn converge<L: ReplicaLauncher>(
    state: &mut DeploymentState<L::Handle>,
    app: &str,
    round: &Round,
    launcher: &mut L,
) -> bool {
    sample_load(state, round);
    let mut table_changed = false;
    for action in state.plan(round.deleting, round.now) {
        table_changed |= act(state, app, action, round, launcher);
    }
    table_changed | probe_replicas(state, round, launcher)
}

/// Gives the autoscaler, when a sample is due, the requests running at
/// the replicas and waiting in routers.
fn sample_load<H>(state: &mut DeploymentState<H>, round: &Round) {
    let Some(scaler) = &mut state.autoscaler else {
        return;
    };
    if !scaler.sample_due(round.now, round.queued) {
        return;
    }
    let running = state.replicas.iter().filter(|slot| slot.state == ReplicaState::Running);
    scaler.record(round.now, running.map(|slot| slot.ongoing).sum(), round.queued);
}

/// Does one planned action; returns whether the routing table changed.
fn act<L: ReplicaLauncher>(
    state: &mut DeploymentState<L::Handle>,
    app: &str,
    action: Action,
    round: &Round,
    launcher: &mut L,
) -> bool {
    match action {
        Action::Start => {
            start(state, app, round.now, launcher);
            false
        }
        Action::Drain(name) => state
            .slot_mut(&name)
            .is_some_and(|slot| drain(slot, round.table_version + 1, round.now)),
        Action::Stop(name) => state
            .slot_mut(&name)
            .is_some_and(|slot| stop(slot, round.now, launcher)),
    }
}

/// Starts a replica of the current version; a failure counts as a failed
/// start.
fn start<L: ReplicaLauncher>(state: &mut DeploymentState<L::Handle>, app: &str, now: Instant, launcher: &mut L) {
    let name = state.next_name(app);
    let context = ReplicaContext {
        app: app.to_string(),
        deployment: state.config.name.clone(),
        replica: name.clone(),
    };
    match launcher.start(context, &state.config, &state.version) {
        Ok(handle) => {
            let mut slot = ReplicaSlot::new(name, handle, state.version.clone(), now);
            slot.probing = true;
            state.replicas.push(slot);
        }
        Err(e) => {
            tracing::warn!(app, deployment = %state.config.name, "starting a replica: {e}");
            state.start_failed(format!("starting a replica: {e}"), now);
        }
    }
}

/// Takes a running replica out of routing from table `version` on; it
/// stops once idle. Returns whether the routing table changed.
fn drain<H>(slot: &mut ReplicaSlot<H>, version: u64, now: Instant) -> bool {
    if slot.state != ReplicaState::Running {
        return false;
    }
    slot.enter(ReplicaState::Draining, now);
    slot.left_in = version;
    true
}

/// Kills a replica in the background; it leaves routing at once. Returns
/// whether it was routed.
fn stop<L: ReplicaLauncher>(slot: &mut ReplicaSlot<L::Handle>, now: Instant, launcher: &mut L) -> bool {
    if slot.state == ReplicaState::Stopping {
        return false;
    }
    let was_routed = slot.state == ReplicaState::Running;
    slot.enter(ReplicaState::Stopping, now);
    launcher.stop(&slot.name, &slot.handle);
    was_routed
}

/// What a replica with no probe out needs this round.
enum Due {
    Health,
    Load,
    Stop,
    Nothing,
}

/// Sends the health and load probes that are due, and stops draining
/// replicas that are idle; returns whether the routing table changed.
fn probe_replicas<L: ReplicaLauncher>(state: &mut DeploymentState<L::Handle>, round: &Round, launcher: &mut L) -> bool {
    let config = &state.config;
    let load_period =
        (config.autoscaling.as_ref()).map_or(LOAD_PERIOD, |autoscaling| autoscaling.metrics_interval.min(LOAD_PERIOD));
    let mut table_changed = false;
    for slot in state.replicas.iter_mut().filter(|slot| !slot.probing) {
        match due(slot, config, load_period, round) {
            Due::Health => launcher.probe_health(&slot.name, &slot.handle, config.health_check_timeout),
            Due::Load => launcher.probe_load(&slot.name, &slot.handle),
            Due::Stop => {
                table_changed |= stop(slot, round.now, launcher);
                continue;
            }
            Due::Nothing => continue,
        }
        slot.probing = true;
    }
    table_changed
}

/// What replica `slot` needs this round: a running one a health check or a
/// load report when due; a draining one to stop once no table routes to
/// it (or [`ACK_PATIENCE`] passed) and it reported itself idle, or its
/// graceful shutdown timeout passed, and a load report meanwhile.
fn due<H>(slot: &ReplicaSlot<H>, config: &DeploymentConfig, load_period: Duration, round: &Round) -> Due {
    let now = round.now;
    match slot.state {
        ReplicaState::Running if now.duration_since(slot.last_health) >= config.health_check_period => Due::Health,
        ReplicaState::Running if now.duration_since(slot.last_load) >= load_period => Due::Load,
        ReplicaState::Draining => {
            let patience_over = now.duration_since(slot.since) >= ACK_PATIENCE;
            let installed = round.installed_everywhere >= slot.left_in || patience_over;
            let out_of_routing = slot.left_in <= round.table_version && installed;
            let quiet = slot.ongoing == 0 && slot.idle_ms >= DRAIN_IDLE.as_millis() as u64;
            let overdue = now.duration_since(slot.since) >= config.graceful_shutdown_timeout;
            if (out_of_routing && quiet && slot.last_load > slot.since) || overdue {
                Due::Stop
            } else if now.duration_since(slot.last_load) >= DRAIN_PROBE_PERIOD {
                Due::Load
            } else {
                Due::Nothing
            }
        }
        _ => Due::Nothing,
    }
}

impl<H: Clone> DeploymentState<H> {
    /// Takes in whether replica `name` was built and passed its first
    /// health check: it runs, or it is stopped and counts as a failed start
    /// of its version. Returns whether the routing table must change.
    pub(super) fn built<L>(
        &mut self,
        name: &str,
        result: Result<ReplicaLoad, ProbeError>,
        now: Instant,
        launcher: &mut L,
    ) -> bool
    where
        L: ReplicaLauncher<Handle = H>,
    {
        let current = self.version.clone();
        let Some(slot) = self.slot_mut(name) else {
            return false;
        };
        slot.probing = false;
        let error = match result {
            Ok(load) => {
                slot.version = load.version;
                if slot.state != ReplicaState::Starting {
                    return false;
                }
                slot.enter(ReplicaState::Running, now);
                slot.last_health = now;
                if slot.version == current {
                    self.replica_ran();
                }
                return true;
            }
            Err(error) => error,
        };
        tracing::warn!(replica = name, "a replica failed to start: {error}");
        if slot.version == current
            && let Some(delay) = self.start_failed(format!("replica {name} failed to start: {error}"), now)
        {
            tracing::warn!(replica = name, "starting another in {delay:?}");
        }
        self.slot_mut(name).is_some_and(|slot| stop(slot, now, launcher))
    }

    /// Takes in a health check's result: a running replica that failed it
    /// is stopped. Returns whether the routing table must change.
    pub(super) fn health<L>(
        &mut self,
        name: &str,
        result: Result<(), ProbeError>,
        now: Instant,
        launcher: &mut L,
    ) -> bool
    where
        L: ReplicaLauncher<Handle = H>,
    {
        let Some(slot) = self.slot_mut(name) else {
            return false;
        };
        slot.probing = false;
        slot.last_health = now;
        match result {
            Err(error) if slot.state == ReplicaState::Running => {
                tracing::warn!(replica = name, "replacing an unhealthy replica: {error}");
                stop(slot, now, launcher)
            }
            _ => false,
        }
    }

    /// Takes in a replica's load, or that it did not answer.
    pub(super) fn load(&mut self, name: &str, load: Option<ReplicaLoad>, now: Instant) {
        let Some(slot) = self.slot_mut(name) else {
            return;
        };
        slot.probing = false;
        slot.last_load = now;
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

    /// Forgets replica `name`, which stopped or died, keeping the count of
    /// what it answered; returns whether it was routed.
    pub(super) fn stopped(&mut self, name: &str) -> bool {
        let Some(index) = self.replicas.iter().position(|slot| slot.name == name) else {
            return false;
        };
        let slot = self.replicas.remove(index);
        self.retired.total += slot.counts.total;
        self.retired.errors += slot.counts.errors;
        slot.state == ReplicaState::Running
    }

    /// Applies the user config to every replica of the current version in
    /// place.
    pub(super) fn reconfigure<L>(&self, launcher: &mut L)
    where
        L: ReplicaLauncher<Handle = H>,
    {
        let Some(user_config) = &self.config.user_config else {
            return;
        };
        for slot in self.replicas.iter().filter(|slot| slot.version == self.version) {
            launcher.reconfigure(&slot.name, &slot.handle, user_config.clone());
        }
    }
}
