//! The replica set on a virtual launcher and a virtual clock: every round,
//! the harness answers each call the launcher got as the cluster would
//! (builds and health checks pass unless a test says otherwise, replicas
//! report themselves idle, stops complete), and the routing table a round
//! changes is installed everywhere at once unless a test holds it back.

use std::collections::BTreeSet;

use super::*;
use crate::config::AutoscalingConfig;

/// What the launcher was asked, by replica name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Start(String),
    Stop(String),
    Health(String),
    Load(String),
    Reconfigure(String),
}

/// A launcher that runs nothing: it records each call, and the harness
/// answers it. A replica's handle is its name.
#[derive(Default)]
struct VirtualReplicas {
    calls: Vec<Call>,
    /// Every start fails at once, as when no actor can be created.
    refuse_starts: bool,
}

impl ReplicaLauncher for VirtualReplicas {
    type Handle = String;

    fn start(&mut self, replica: ReplicaContext, _: &DeploymentConfig, _: &str) -> Result<String, ServeError> {
        if self.refuse_starts {
            return Err(ServeError::InvalidConfig("no node has room".into()));
        }
        self.calls.push(Call::Start(replica.replica.clone()));
        Ok(replica.replica)
    }

    fn stop(&mut self, name: &str, handle: &String) {
        assert_eq!(name, handle);
        self.calls.push(Call::Stop(name.to_string()));
    }

    fn probe_health(&mut self, name: &str, _: &String, _: Duration) {
        self.calls.push(Call::Health(name.to_string()));
    }

    fn probe_load(&mut self, name: &str, _: &String) {
        self.calls.push(Call::Load(name.to_string()));
    }

    fn reconfigure(&mut self, name: &str, _: &String, _: Vec<u8>) {
        self.calls.push(Call::Reconfigure(name.to_string()));
    }
}

/// One deployment of application `app`, its virtual replicas and clock.
struct Harness {
    state: DeploymentState<String>,
    replicas: VirtualReplicas,
    now: Instant,
    deleting: bool,
    queued: u32,
    table_version: u64,
    /// Routers install each new table at once; when false, none does.
    installs: bool,
    installed_everywhere: u64,
    /// Replicas whose build or health check fails.
    unhealthy: BTreeSet<String>,
    /// The version whose replicas fail to build.
    broken_version: Option<String>,
    /// Replicas report a request running.
    busy: bool,
    /// Every call answered, in order.
    log: Vec<Call>,
}

impl Harness {
    fn new(config: DeploymentConfig) -> Self {
        Harness {
            state: DeploymentState::new(config),
            replicas: VirtualReplicas::default(),
            now: Instant::now(),
            deleting: false,
            queued: 0,
            table_version: 0,
            installs: true,
            installed_everywhere: 0,
            unhealthy: BTreeSet::new(),
            broken_version: None,
            busy: false,
            log: Vec::new(),
        }
    }

    /// One round, its calls answered, then a tick of the clock.
    fn step(&mut self) {
        let round = Round {
            now: self.now,
            deleting: self.deleting,
            queued: self.queued,
            table_version: self.table_version,
            installed_everywhere: self.installed_everywhere,
        };
        let changed = converge(&mut self.state, "app", &round, &mut self.replicas);
        self.table_changed(changed);
        while !self.replicas.calls.is_empty() {
            for call in std::mem::take(&mut self.replicas.calls) {
                self.answer(&call);
                self.log.push(call);
            }
        }
        self.now += Duration::from_millis(100);
    }

    fn answer(&mut self, call: &Call) {
        let now = self.now;
        let changed = match call {
            Call::Start(name) => {
                let result = match self.fails(name) {
                    true => Err(ProbeError::Timeout(Duration::from_secs(1))),
                    false => Ok(self.load(name)),
                };
                self.state.built(name, result, now, &mut self.replicas)
            }
            Call::Health(name) => {
                let result = match self.unhealthy.contains(name) {
                    true => Err(ProbeError::Timeout(Duration::from_secs(1))),
                    false => Ok(()),
                };
                self.state.health(name, result, now, &mut self.replicas)
            }
            Call::Load(name) => {
                let load = self.load(name);
                self.state.load(name, Some(load), now);
                false
            }
            Call::Stop(name) => self.state.stopped(name),
            Call::Reconfigure(_) => false,
        };
        self.table_changed(changed);
    }

    fn table_changed(&mut self, changed: bool) {
        self.table_version += u64::from(changed);
        if self.installs {
            self.installed_everywhere = self.table_version;
        }
    }

    /// Whether replica `name`'s build fails.
    fn fails(&self, name: &str) -> bool {
        let version = self
            .state
            .replicas
            .iter()
            .find(|slot| slot.name == name)
            .map(|slot| &slot.version);
        self.unhealthy.contains(name) || version.is_some_and(|version| Some(version) == self.broken_version.as_ref())
    }

    /// What replica `name` reports: its version, idle or busy.
    fn load(&self, name: &str) -> ReplicaLoad {
        let slot = self.state.replicas.iter().find(|slot| slot.name == name);
        ReplicaLoad {
            version: slot.map(|slot| slot.version.clone()).unwrap_or_default(),
            ongoing: u32::from(self.busy),
            idle_ms: if self.busy { 0 } else { 1_000 },
            answered: 0,
            errors: 0,
            figures: Vec::new(),
            queued: Vec::new(),
        }
    }

    /// Steps until it runs its target and nothing else (at most a minute
    /// of its clock).
    fn settle(&mut self) {
        for _ in 0..600 {
            if self.state.converged(self.deleting) {
                return;
            }
            self.step();
        }
        panic!("it did not converge: {:?}", self.states());
    }

    /// Steps through `seconds` of its clock.
    fn run_for(&mut self, seconds: u64) {
        for _ in 0..seconds * 10 {
            self.step();
        }
    }

    fn states(&self) -> Vec<(String, ReplicaState)> {
        (self.state.replicas.iter())
            .map(|slot| (slot.name.clone(), slot.state))
            .collect()
    }

    fn count(&self, state: ReplicaState) -> usize {
        self.state.replicas.iter().filter(|slot| slot.state == state).count()
    }

    fn names(&self) -> Vec<String> {
        self.state.replicas.iter().map(|slot| slot.name.clone()).collect()
    }

    fn calls(&self, matches: impl Fn(&Call) -> bool) -> usize {
        self.log.iter().filter(|call| matches(call)).count()
    }
}

fn config(replicas: u32) -> DeploymentConfig {
    let init = raylet::codec::encode(&()).expect("() encodes");
    DeploymentConfig::from_parts("echo", "demo::Echo", init).num_replicas(replicas)
}

fn starts(call: &Call) -> bool {
    matches!(call, Call::Start(_))
}

fn stops(call: &Call) -> bool {
    matches!(call, Call::Stop(_))
}

#[test]
fn a_deployment_scales_up_and_down_to_its_replica_count() {
    let mut harness = Harness::new(config(2));
    harness.settle();
    assert_eq!(harness.count(ReplicaState::Running), 2);
    harness.state.update(config(4));
    harness.settle();
    assert_eq!(harness.count(ReplicaState::Running), 4);
    assert_eq!(harness.calls(starts), 4);
    harness.state.update(config(1));
    harness.settle();
    assert_eq!(harness.states().len(), 1);
    assert_eq!(harness.calls(starts), 4, "scaling down starts nothing");
    assert_eq!(harness.calls(stops), 3);
}

#[test]
fn a_replica_scaled_away_is_drained_before_it_stops() {
    let mut harness = Harness::new(config(2));
    harness.settle();
    harness.state.update(config(1));
    harness.step();
    assert_eq!(harness.count(ReplicaState::Draining), 1, "{:?}", harness.states());
    assert_eq!(harness.calls(stops), 0, "it may still have requests on their way");
    harness.settle();
    assert_eq!(harness.calls(stops), 1);
}

#[test]
fn a_replica_that_dies_is_replaced() {
    let mut harness = Harness::new(config(2));
    harness.settle();
    let dead = harness.names()[0].clone();
    assert!(harness.state.stopped(&dead), "a running replica leaves routing");
    assert!(!harness.state.stopped(&dead), "it is forgotten once");
    harness.settle();
    assert_eq!(harness.count(ReplicaState::Running), 2);
    assert_eq!(harness.calls(starts), 3);
    assert!(!harness.names().contains(&dead));
}

#[test]
fn a_replica_that_fails_its_health_check_is_replaced() {
    let period = Duration::from_secs(1);
    let mut harness = Harness::new(config(2).health_check(period, period));
    harness.settle();
    let sick = harness.names()[0].clone();
    harness.unhealthy.insert(sick.clone());
    harness.run_for(3);
    assert!(harness.log.contains(&Call::Health(sick.clone())));
    assert!(harness.log.contains(&Call::Stop(sick.clone())));
    assert!(!harness.names().contains(&sick));
    assert_eq!(harness.count(ReplicaState::Running), 2, "{:?}", harness.states());
    assert!(
        harness.state.failed.is_none(),
        "a version that ran never fails its deploy"
    );
}

#[test]
fn a_passing_health_check_keeps_the_replica() {
    let period = Duration::from_secs(1);
    let mut harness = Harness::new(config(2).health_check(period, period));
    harness.settle();
    harness.run_for(3);
    assert!(harness.calls(|call| matches!(call, Call::Health(_))) >= 4);
    assert_eq!(harness.calls(stops), 0);
    assert_eq!(harness.calls(starts), 2);
}

#[test]
fn a_rolling_update_replaces_every_replica_without_routing_fewer_than_the_target() {
    let mut harness = Harness::new(config(5));
    harness.settle();
    let old_version = harness.state.version.clone();
    let old = harness.names();
    let mut new_config = config(5);
    new_config.init = raylet::codec::encode(&1u32).expect("a u32 encodes");
    harness.state.update(new_config);
    assert_ne!(harness.state.version, old_version);
    for _ in 0..600 {
        if harness.state.converged(false) {
            break;
        }
        let answered = harness.log.len();
        harness.step();
        let running = harness.count(ReplicaState::Running);
        assert!(
            running >= 5,
            "{running} routed during the rollout: {:?}",
            harness.states()
        );
        let started = harness.log[answered..].iter().filter(|call| starts(call)).count();
        assert!(started <= 1, "a fifth of 5 starts at a time, not {started}");
    }
    assert!(harness.state.converged(false), "{:?}", harness.states());
    let versions: BTreeSet<&str> = harness
        .state
        .replicas
        .iter()
        .map(|slot| slot.version.as_str())
        .collect();
    assert_eq!(versions, BTreeSet::from([harness.state.version.as_str()]));
    assert!(old.iter().all(|name| harness.log.contains(&Call::Stop(name.clone()))));
}

#[test]
fn a_new_version_that_never_builds_fails_and_the_old_replicas_keep_serving() {
    let mut harness = Harness::new(config(2));
    harness.settle();
    let old = harness.names();
    let mut broken = config(2);
    broken.init = raylet::codec::encode(&"missing checkpoint").expect("a str encodes");
    harness.state.update(broken);
    harness.broken_version = Some(harness.state.version.clone());
    harness.run_for(5);
    let failed = harness.state.failed.as_deref().unwrap_or_default();
    assert!(failed.contains("failed to start"), "{failed:?}");
    assert_eq!(harness.calls(starts), 2 + 3, "three attempts, then no more");
    assert_eq!(harness.names(), old);
    assert_eq!(harness.count(ReplicaState::Running), 2);
}

#[test]
fn a_launcher_that_cannot_start_replicas_fails_the_deploy() {
    let mut harness = Harness::new(config(1));
    harness.replicas.refuse_starts = true;
    harness.run_for(1);
    let failed = harness.state.failed.as_deref().unwrap_or_default();
    assert!(failed.contains("no node has room"), "{failed:?}");
    assert!(harness.names().is_empty());
}

#[test]
fn a_deployment_scaled_to_zero_wakes_for_a_waiting_request_and_sleeps_when_idle() {
    let autoscaling = AutoscalingConfig {
        min_replicas: 0,
        max_replicas: 2,
        target_ongoing_requests: 1.0,
        upscale_delay: Duration::from_secs(1),
        downscale_delay: Duration::from_secs(2),
        metrics_interval: Duration::from_secs(1),
        look_back_period: Duration::from_secs(1),
        ..AutoscalingConfig::default()
    };
    let mut harness = Harness::new(config(1).autoscaling(autoscaling));
    harness.run_for(1);
    assert_eq!(harness.calls(starts), 0, "nothing waits: nothing runs");
    harness.step();
    harness.queued = 1;
    harness.step();
    assert_eq!(
        harness.calls(starts),
        1,
        "a waiting request starts a replica at once, not at the next sample"
    );
    harness.queued = 0;
    harness.settle();
    assert_eq!(harness.count(ReplicaState::Running), 1);
    harness.run_for(8);
    assert!(harness.names().is_empty(), "{:?}", harness.states());
    assert_eq!(harness.calls(stops), 1);
}

#[test]
fn a_deleted_deployment_stops_every_replica() {
    let mut harness = Harness::new(config(3));
    harness.settle();
    harness.deleting = true;
    harness.settle();
    assert!(harness.names().is_empty());
    assert_eq!(harness.calls(stops), 3);
    harness.run_for(1);
    assert_eq!(harness.calls(starts), 3, "nothing starts again");
}

#[test]
fn a_draining_replica_waits_for_routers_to_install_the_table_without_it() {
    let mut harness = Harness::new(config(2));
    harness.settle();
    harness.installs = false;
    harness.state.update(config(1));
    harness.run_for(2);
    assert_eq!(harness.count(ReplicaState::Draining), 1, "{:?}", harness.states());
    assert_eq!(harness.calls(stops), 0);
    harness.installs = true;
    harness.installed_everywhere = harness.table_version;
    harness.run_for(1);
    assert_eq!(harness.calls(stops), 1);
    assert_eq!(harness.names().len(), 1);
}

#[test]
fn a_busy_draining_replica_stops_at_its_graceful_shutdown_timeout() {
    let timeout = Duration::from_secs(3);
    let mut harness = Harness::new(config(2).graceful_shutdown_timeout(timeout));
    harness.settle();
    harness.busy = true;
    harness.state.update(config(1).graceful_shutdown_timeout(timeout));
    harness.run_for(2);
    assert_eq!(harness.count(ReplicaState::Draining), 1, "it still runs a request");
    assert_eq!(harness.calls(stops), 0);
    harness.run_for(2);
    assert_eq!(harness.calls(stops), 1, "{:?}", harness.states());
}

#[test]
fn a_changed_user_config_reconfigures_the_current_replicas_in_place() {
    let mut harness = Harness::new(config(2));
    harness.settle();
    let mut reconfigured = config(2);
    reconfigured.user_config = Some(vec![1]);
    assert!(harness.state.update(reconfigured), "the user config changed");
    harness.state.reconfigure(&mut harness.replicas);
    harness.step();
    assert_eq!(harness.calls(|call| matches!(call, Call::Reconfigure(_))), 2);
    assert_eq!(harness.calls(starts), 2, "no replica is replaced");
}
