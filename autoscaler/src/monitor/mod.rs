//! The autoscaler's loop, run beside the head: each round it reads the
//! cluster from the head and the instances from the provider, asks the
//! scheduler's [`Autoscaler`] what to do, and does it. Failed instances are
//! terminated and their type backed off; launches go to the provider;
//! idle nodes are drained (no new work, their objects copied elsewhere)
//! before their instance is terminated. Every decision is logged with its
//! reason, kept in the report `raylet status` shows, and counted on
//! `/metrics`. When the loop stops, it terminates every instance it manages.

mod drain;
mod observe;
mod report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use raylet_cluster_status::ClusterStatus;
use raylet_common::auth::AuthToken;
use raylet_placement::autoscaler::{Autoscaler, Plan, RemovalCause};
use raylet_proto::{NodeId, Result};

pub use report::{AutoscalerReport, Event, ManagedNode, REPORT_KEY, REPORT_NAMESPACE};

use crate::provider::{Instance, InstanceId, InstanceState, LaunchRequest, NodeProvider};
use observe::{Drain, Managed, Observation, Tracker};
use report::{LAUNCH_FAILURES, LAUNCHES, NODES, REMOVALS, WAITING};

/// How long a drained node may keep running work before it is removed
/// anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
const STATUS_PATIENCE: Duration = Duration::from_secs(5);

/// The loop's settings.
pub struct MonitorConfig {
    /// The head's gRPC address, `HOST:PORT`, as launched nodes reach it.
    pub head_address: String,
    pub token: AuthToken,
    /// How often a round runs.
    pub interval: Duration,
    /// The provider's kind, for the report.
    pub provider_kind: String,
}

/// The autoscaler's loop and what it remembers between rounds.
pub struct Monitor {
    autoscaler: Autoscaler,
    provider: Arc<dyn NodeProvider>,
    config: MonitorConfig,
    tracker: Tracker,
    report: AutoscalerReport,
}

impl Monitor {
    pub fn new(autoscaler: Autoscaler, provider: Arc<dyn NodeProvider>, config: MonitorConfig) -> Self {
        let report = AutoscalerReport {
            provider: config.provider_kind.clone(),
            ..AutoscalerReport::default()
        };
        Monitor {
            autoscaler,
            provider,
            config,
            tracker: Tracker::default(),
            report,
        }
    }

    /// Runs a round every interval until `shutdown` resolves, then
    /// terminates every instance the provider lists.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = &mut shutdown => break,
            }
            if let Err(error) = self.round().await {
                tracing::warn!(%error, "autoscaler round failed; trying again next round");
            }
        }
        self.terminate_all().await;
    }

    /// One round: observe, decide, act, report.
    pub async fn round(&mut self) -> Result<()> {
        let (head, token) = (&self.config.head_address, &self.config.token);
        let status = ClusterStatus::fetch(head, token, STATUS_PATIENCE).await?;
        let instances = self.provider.instances().await.map_err(provider_error)?;
        self.reap_failed(&instances).await;
        let now = Instant::now();
        let observation = self.tracker.observe(self.autoscaler.config(), &status, &instances, now);
        self.note_joins(&observation);
        let plan = self.autoscaler.decide(&observation.view, &observation.demand);
        let launched = self.launch(&plan).await;
        self.remove(&plan, &observation).await;
        self.finish_drains(&status, &observation).await;
        self.fill_report(&plan, &observation, &launched, now);
        let (head, token) = (&self.config.head_address, &self.config.token);
        self.report.publish(head, token).await
    }

    /// Terminates instances that ended on their own, backing their type off.
    async fn reap_failed(&mut self, instances: &[Instance]) {
        for instance in instances {
            let InstanceState::Failed(reason) = &instance.state else {
                continue;
            };
            REMOVALS.with_label_values(&[&instance.node_type, "failed"]).inc();
            let what = format!(
                "instance {} of type '{}' failed: {reason}",
                instance.id, instance.node_type
            );
            self.back_off(&instance.node_type, reason.clone(), what);
            self.terminate(&instance.id).await;
        }
    }

    /// Holds `node_type`'s launches back after a failure, counts it, and
    /// reports `what` happened with how long the type waits.
    fn back_off(&mut self, node_type: &str, error: String, what: String) {
        let delay = self.tracker.launch_failed(node_type, error, Instant::now());
        LAUNCH_FAILURES.with_label_values(&[node_type]).inc();
        self.report
            .event(format!("{what}; the type's launches wait {}s", delay.as_secs()));
    }

    /// Clears the backoff of every type a node of which has joined.
    fn note_joins(&mut self, observation: &Observation) {
        for managed in observation.managed.iter().filter(|m| m.node.is_some()) {
            self.tracker.joined(&managed.node_type);
        }
    }

    /// Asks the provider for the plan's nodes; returns those it launched.
    async fn launch(&mut self, plan: &Plan) -> Vec<Managed> {
        let mut launched = Vec::new();
        for launch in &plan.launches {
            let Some(node_type) = self
                .autoscaler
                .config()
                .node_types
                .iter()
                .find(|t| t.name == launch.node_type)
            else {
                continue;
            };
            let request = LaunchRequest {
                node_type: node_type.clone(),
                head_address: self.config.head_address.clone(),
                token: self.config.token.expose().to_string(),
            };
            self.report.event(format!(
                "launching {} node(s) of type '{}': {}",
                launch.count, launch.node_type, launch.reason
            ));
            for _ in 0..launch.count {
                match self.provider.launch(&request).await {
                    Ok(instance) => {
                        LAUNCHES.with_label_values(&[&launch.node_type]).inc();
                        self.tracker.first_seen.insert(instance.clone(), Instant::now());
                        launched.push(Managed {
                            instance,
                            node_type: launch.node_type.clone(),
                            node: None,
                            view_id: NodeId::random(),
                        });
                    }
                    Err(error) => {
                        self.back_off(&launch.node_type, error.to_string(), error.to_string());
                        break;
                    }
                }
            }
        }
        launched
    }

    /// Terminates nodes that did not join, and starts draining idle ones.
    async fn remove(&mut self, plan: &Plan, observation: &Observation) {
        for removal in &plan.removals {
            let Some(managed) = observation.managed.iter().find(|m| m.view_id == removal.node) else {
                continue;
            };
            match removal.cause {
                RemovalCause::DidNotJoin => {
                    REMOVALS.with_label_values(&[&managed.node_type, "did_not_join"]).inc();
                    let what = format!("terminating instance {}: {}", managed.instance, removal.reason);
                    self.back_off(&managed.node_type, removal.reason.clone(), what);
                    self.terminate(&managed.instance).await;
                }
                RemovalCause::Idle => self.start_drain(managed, &removal.reason).await,
            }
        }
    }

    async fn start_drain(&mut self, managed: &Managed, reason: &str) {
        let Some(node) = &managed.node else {
            return;
        };
        let (head, token) = (&self.config.head_address, &self.config.token);
        if let Err(error) = drain::stop_placing(head, token, node.node_id, reason).await {
            tracing::warn!(node = %node.node_id, %error, "cannot drain a node; trying again next round");
            return;
        }
        self.report.event(format!(
            "draining node {} (instance {}, type '{}'): {reason}",
            node.node_id.short(),
            managed.instance,
            managed.node_type
        ));
        let drain = Drain {
            instance: managed.instance.clone(),
            node_type: managed.node_type.clone(),
            since: Instant::now(),
            reason: reason.to_string(),
        };
        self.tracker.draining.insert(node.node_id, drain);
    }

    /// Removes each draining node once nothing runs there (or the drain
    /// timeout passed), after copying its objects to another node.
    async fn finish_drains(&mut self, status: &ClusterStatus, observation: &Observation) {
        let draining: Vec<(NodeId, Drain)> = self.tracker.draining.iter().map(|(id, d)| (*id, d.clone())).collect();
        for (node_id, drain) in draining {
            let node = observation
                .managed
                .iter()
                .find(|m| m.view_id == node_id)
                .and_then(|m| m.node.clone());
            let timed_out = drain.since.elapsed() > DRAIN_TIMEOUT;
            if let Some(node) = &node {
                if !observe::is_idle(node) && !timed_out {
                    continue;
                }
                self.move_objects(status, node).await;
            }
            REMOVALS.with_label_values(&[&drain.node_type, "idle"]).inc();
            self.report.event(format!(
                "removing node {} (instance {}, type '{}'): {}",
                node_id.short(),
                drain.instance,
                drain.node_type,
                match timed_out {
                    true => "the drain timed out with work still running".to_string(),
                    false => drain.reason.clone(),
                }
            ));
            self.terminate(&drain.instance).await;
            self.tracker.draining.remove(&node_id);
        }
    }

    async fn move_objects(&mut self, status: &ClusterStatus, node: &raylet_cluster_status::NodeStatus) {
        let draining: Vec<NodeId> = self.tracker.draining.keys().copied().collect();
        match drain::move_objects(status, node, &draining, &self.config.token).await {
            Ok(moved) if moved.objects == 0 && moved.failed.is_empty() => {}
            Ok(moved) => {
                self.report.event(format!(
                    "copied {} objects ({} bytes) off node {} before removing it{}",
                    moved.objects,
                    moved.bytes,
                    node.node_id.short(),
                    match moved.failed.is_empty() {
                        true => String::new(),
                        false => format!("; not copied: {}", moved.failed.join("; ")),
                    }
                ));
            }
            Err(error) => self.report.event(format!(
                "cannot list the objects of node {} before removing it: {error}",
                node.node_id.short()
            )),
        }
    }

    async fn terminate(&mut self, instance: &InstanceId) {
        if let Err(error) = self.provider.terminate(instance).await {
            self.report
                .event(format!("terminating instance {instance} failed: {error}"));
        }
    }

    /// Terminates every instance the provider lists, then tears down what
    /// the provider set up: the loop is stopping.
    async fn terminate_all(&mut self) {
        let instances = match self.provider.instances().await {
            Ok(instances) => instances,
            Err(error) => {
                tracing::warn!(%error, "cannot list the instances to terminate them");
                return;
            }
        };
        for instance in instances {
            tracing::info!(instance = %instance.id, "the autoscaler is stopping: terminating instance");
            self.terminate(&instance.id).await;
        }
        if let Err(error) = self.provider.tear_down().await {
            tracing::warn!(%error, "the autoscaler is stopping");
        }
    }

    fn fill_report(&mut self, plan: &Plan, observation: &Observation, launched: &[Managed], now: Instant) {
        let config = self.autoscaler.config();
        NODES.reset();
        self.report.nodes = (observation.managed.iter().chain(launched))
            .map(|managed| {
                let node = report_node(&self.tracker, config, managed, now);
                NODES.with_label_values(&[&node.node_type, &node.state]).inc();
                node
            })
            .collect();
        self.report.launched = plan
            .launches
            .iter()
            .map(|launch| format!("{} x '{}': {}", launch.count, launch.node_type, launch.reason))
            .collect();
        WAITING.reset();
        self.report.waiting = plan
            .unmet
            .iter()
            .map(|unmet| {
                WAITING
                    .with_label_values(&[&unmet.reason.to_string()])
                    .add(unmet.count as i64);
                unmet.describe(&observation.demand)
            })
            .collect();
        self.report.backing_off = self
            .tracker
            .backoff
            .iter()
            .filter(|(_, backoff)| backoff.until > now)
            .map(|(name, backoff)| {
                format!(
                    "'{name}': {} failed launches, next try in {}s; last: {}",
                    backoff.failures,
                    backoff.until.saturating_duration_since(now).as_secs(),
                    backoff.last_error
                )
            })
            .collect();
    }
}

/// One managed node as the report lists it.
fn report_node(
    tracker: &Tracker,
    config: &raylet_placement::autoscaler::AutoscalerConfig,
    managed: &Managed,
    now: Instant,
) -> ManagedNode {
    let since = |at: Option<&Instant>| at.map_or(0.0, |at| now.saturating_duration_since(*at).as_secs_f64());
    let mut node = ManagedNode {
        instance: managed.instance.0.clone(),
        node_type: managed.node_type.clone(),
        state: "launching".into(),
        node_id: managed.node.as_ref().map(|n| n.node_id.to_string()),
        for_s: since(tracker.first_seen.get(&managed.instance)),
        removed_in_s: None,
    };
    let Some(joined) = &managed.node else {
        return node;
    };
    if let Some(drain) = tracker.draining.get(&joined.node_id) {
        node.state = "draining".into();
        node.for_s = since(Some(&drain.since));
        return node;
    }
    match tracker.idle_for(joined.node_id, now) {
        Some(idle) => {
            node.state = "idle".into();
            node.for_s = idle.as_secs_f64();
            let timeout = config
                .node_types
                .iter()
                .find(|t| t.name == managed.node_type)
                .map(|t| t.idle_timeout);
            node.removed_in_s = timeout.map(|t| t.saturating_sub(idle).as_secs_f64());
        }
        None => {
            node.state = "running".into();
            node.for_s = 0.0;
        }
    }
    node
}

fn provider_error(error: crate::provider::ProviderError) -> raylet_proto::Error {
    raylet_proto::Error::Unavailable(error.to_string())
}
