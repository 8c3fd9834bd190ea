//! One deployment as the controller sees it: its replicas with their
//! states, and [`DeploymentState::plan`], which says, without touching
//! the cluster, what to start, drain and stop to converge on the target:
//! - too few replicas of the current version: start more; while replicas
//!   of an older version still run, at most a fifth of the target (at
//!   least 1) starts at a time, so a rollout goes in batches;
//! - an old replica is drained once enough current ones are running to
//!   stand in for it, so capacity never drops below the target during a
//!   rollout;
//! - too many: stop replicas that are still starting first, then drain
//!   running ones.
//!
//! **Failed starts.** A version none of whose replicas ever ran fails its
//! deploy after [`START_ATTEMPTS`] failed starts in a row, and nothing
//! more is started. A version that has run (replacing a replica that died,
//! scaling up) never gives up: each failed start delays the next by a
//! back-off (1 s doubling to [`MAX_RESTART_DELAY`]), and the deployment
//! reports why until a replica runs again.

use std::time::{Duration, Instant};

use raylet_common::Backoff;

use crate::config::DeploymentConfig;
use crate::figures::Figure;
use crate::replica::ReplicaHandle;
use crate::routes::QueueReport;
use crate::status::{ReplicaState, ReplicaStatus, RequestCounts};

use super::autoscaler::Autoscaler;

/// How many replica starts in a row may fail before the deployment counts
/// as failed.
const START_ATTEMPTS: u32 = 3;
/// The first delay before starting again after a version that has run
/// failed to start a replica.
const FIRST_RESTART_DELAY: Duration = Duration::from_secs(1);
/// The longest such delay.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

/// One replica, called through `H` (a [`ReplicaHandle`] but in tests).
pub(super) struct ReplicaSlot<H = ReplicaHandle> {
    pub name: String,
    pub handle: H,
    pub version: String,
    pub state: ReplicaState,
    pub since: Instant,
    pub ongoing: u32,
    pub idle_ms: u64,
    pub counts: RequestCounts,
    pub node_id: String,
    pub pid: u32,
    /// A probe is out: no second one is sent.
    pub probing: bool,
    pub last_health: Instant,
    pub last_load: Instant,
    /// The routing table version that no longer lists it (draining).
    pub left_in: u64,
    /// The newest routing table version it has installed.
    pub acked: u64,
    /// Its actor is not placed yet (or again).
    pub pending: bool,
    /// What it waits for before it can be placed.
    pub waiting: Option<String>,
    /// The deployment's figures, as it last reported them.
    pub figures: Vec<Figure>,
    /// Requests waiting in its process's routers (its handles').
    pub queues: Vec<QueueReport>,
}

impl<H> ReplicaSlot<H> {
    pub(super) fn new(name: String, handle: H, version: String, now: Instant) -> Self {
        ReplicaSlot {
            name,
            handle,
            version,
            state: ReplicaState::Starting,
            since: now,
            ongoing: 0,
            idle_ms: 0,
            counts: RequestCounts::default(),
            node_id: String::new(),
            pid: 0,
            probing: false,
            last_health: now,
            last_load: now,
            left_in: 0,
            acked: 0,
            pending: true,
            waiting: None,
            figures: Vec::new(),
            queues: Vec::new(),
        }
    }

    pub(super) fn enter(&mut self, state: ReplicaState, now: Instant) {
        self.state = state;
        self.since = now;
    }

    pub(super) fn status(&self) -> ReplicaStatus {
        ReplicaStatus {
            name: self.name.clone(),
            state: self.state,
            version: self.version.clone(),
            node_id: self.node_id.clone(),
            pid: self.pid,
            ongoing: self.ongoing,
            waiting: self.waiting.clone().unwrap_or_default(),
        }
    }
}

/// What converging needs done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Start one replica of the current version.
    Start,
    /// Take the replica out of routing and stop it once idle.
    Drain(String),
    /// Stop it now (it gets no traffic yet).
    Stop(String),
}

/// One deployment of an application, its replicas called through `H`.
pub(super) struct DeploymentState<H = ReplicaHandle> {
    pub config: DeploymentConfig,
    pub version: String,
    pub replicas: Vec<ReplicaSlot<H>>,
    pub autoscaler: Option<Autoscaler>,
    /// Starts of the current version that failed in a row.
    pub start_failures: u32,
    /// Why the current version cannot start; nothing more is started.
    pub failed: Option<String>,
    /// A replica of the current version has run: failed starts are retried
    /// after a back-off instead of failing the deploy.
    pub ran: bool,
    /// Why the last start of a version that has run failed, and when the
    /// next may begin; cleared once a replica runs.
    pub unhealthy: Option<(String, Instant)>,
    /// No longer in its application: converging to none.
    pub removed: bool,
    /// What stopped replicas had answered.
    pub retired: RequestCounts,
    /// The index of the next replica's name.
    pub next_index: u32,
}

impl<H> DeploymentState<H> {
    pub(super) fn new(config: DeploymentConfig) -> Self {
        DeploymentState {
            version: config.version(),
            autoscaler: config.autoscaling.clone().map(Autoscaler::new),
            config,
            replicas: Vec::new(),
            start_failures: 0,
            failed: None,
            ran: false,
            unhealthy: None,
            removed: false,
            retired: RequestCounts::default(),
            next_index: 0,
        }
    }

    /// Takes a new config of the same name. A new version starts a
    /// rollout and forgets earlier failures; returns whether the user
    /// config changed, for replicas to reconfigure.
    pub(super) fn update(&mut self, config: DeploymentConfig) -> bool {
        let user_config_changed = config.user_config != self.config.user_config;
        let version = config.version();
        if version != self.version {
            self.version = version;
            self.start_failures = 0;
            self.failed = None;
            self.ran = false;
            self.unhealthy = None;
        }
        match (&mut self.autoscaler, &config.autoscaling) {
            (Some(scaler), Some(autoscaling)) => scaler.reconfigure(autoscaling.clone()),
            (scaler, autoscaling) => *scaler = autoscaling.clone().map(Autoscaler::new),
        }
        self.config = config;
        self.removed = false;
        user_config_changed
    }

    /// The count of current replicas to converge on.
    pub(super) fn target(&self, deleting: bool) -> u32 {
        if deleting || self.removed {
            return 0;
        }
        self.autoscaler
            .as_ref()
            .map_or(self.config.num_replicas, Autoscaler::target)
    }

    /// The next replica's actor name.
    pub(super) fn next_name(&mut self, app: &str) -> String {
        let name = format!("replica:{app}:{}:{}", self.config.name, self.next_index);
        self.next_index += 1;
        name
    }

    pub(super) fn slot_mut(&mut self, name: &str) -> Option<&mut ReplicaSlot<H>> {
        self.replicas.iter_mut().find(|slot| slot.name == name)
    }

    /// Counts a failed start: past [`START_ATTEMPTS`] in a row a version
    /// that never ran fails with `message`; one that has run starts again
    /// after a back-off. Returns the delay before the next start, if any.
    pub(super) fn start_failed(&mut self, message: String, now: Instant) -> Option<Duration> {
        self.start_failures += 1;
        if self.ran {
            let attempt = self.start_failures - 1;
            let delay = Backoff::delay_for_attempt(FIRST_RESTART_DELAY, MAX_RESTART_DELAY, attempt);
            self.unhealthy = Some((message, now + delay));
            return Some(delay);
        }
        if self.start_failures >= START_ATTEMPTS {
            self.failed = Some(message);
        }
        None
    }

    /// A replica of the current version runs: earlier failures are over.
    pub(super) fn replica_ran(&mut self) {
        self.start_failures = 0;
        self.ran = true;
        self.unhealthy = None;
    }

    /// Whether replicas may be started at `now`.
    fn can_start(&self, now: Instant) -> bool {
        self.failed.is_none() && self.unhealthy.as_ref().is_none_or(|(_, next)| now >= *next)
    }

    /// Whether it runs its target of current replicas and nothing else.
    pub(super) fn converged(&self, deleting: bool) -> bool {
        let only_current = self
            .replicas
            .iter()
            .all(|slot| slot.version == self.version && slot.state == ReplicaState::Running);
        only_current && self.replicas.len() == self.target(deleting) as usize
    }

    /// What to start, drain and stop at `now`.
    pub(super) fn plan(&self, deleting: bool, now: Instant) -> Vec<Action> {
        let replicas: Vec<ReplicaView<'_>> = self.replicas.iter().map(ReplicaSlot::view).collect();
        let target = self.target(deleting) as usize;
        plan(target, &self.version, self.can_start(now), &replicas)
    }
}

impl<H> ReplicaSlot<H> {
    fn view(&self) -> ReplicaView<'_> {
        ReplicaView {
            name: &self.name,
            version: &self.version,
            state: self.state,
            since: self.since,
        }
    }
}

/// What planning looks at of a replica.
pub(super) struct ReplicaView<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub state: ReplicaState,
    pub since: Instant,
}

/// What to start, drain and stop so that `target` replicas of `version`
/// run; nothing starts unless `can_start`.
pub(super) fn plan(target: usize, version: &str, can_start: bool, replicas: &[ReplicaView<'_>]) -> Vec<Action> {
    let live = |replica: &&ReplicaView<'_>| matches!(replica.state, ReplicaState::Starting | ReplicaState::Running);
    let (current, old): (Vec<&ReplicaView<'_>>, Vec<&ReplicaView<'_>>) = replicas
        .iter()
        .filter(live)
        .partition(|replica| replica.version == version);
    let mut actions = Vec::new();
    if can_start {
        plan_starts(target, &current, !old.is_empty(), &mut actions);
    }
    plan_extras(target, &current, &mut actions);
    let running_current = current.iter().filter(|r| r.state == ReplicaState::Running).count();
    plan_old(target.saturating_sub(running_current), &old, &mut actions);
    actions
}

/// Starts current replicas up to the target; while old ones still run, at
/// most a fifth of the target (at least 1) may be starting at once.
fn plan_starts(target: usize, current: &[&ReplicaView<'_>], rolling: bool, actions: &mut Vec<Action>) {
    if current.len() >= target {
        return;
    }
    let starting = current.iter().filter(|r| r.state == ReplicaState::Starting).count();
    let room = match rolling {
        true => target.div_ceil(5).max(1).saturating_sub(starting),
        false => usize::MAX,
    };
    let starts = (target - current.len()).min(room);
    actions.extend(std::iter::repeat_n(Action::Start, starts));
}

/// Stops current replicas beyond the target: starting ones first, then
/// the newest running ones.
fn plan_extras(target: usize, current: &[&ReplicaView<'_>], actions: &mut Vec<Action>) {
    let extra = current.len().saturating_sub(target);
    let mut by_preference: Vec<&&ReplicaView<'_>> = current.iter().collect();
    by_preference.sort_by_key(|r| (r.state == ReplicaState::Running, std::cmp::Reverse(r.since)));
    for replica in by_preference.into_iter().take(extra) {
        actions.push(match replica.state {
            ReplicaState::Starting => Action::Stop(replica.name.to_string()),
            _ => Action::Drain(replica.name.to_string()),
        });
    }
}

/// Stops old replicas still starting, and drains old running ones beyond
/// the `keep` that stand in for current replicas not yet running.
fn plan_old(keep: usize, old: &[&ReplicaView<'_>], actions: &mut Vec<Action>) {
    for replica in old.iter().filter(|r| r.state == ReplicaState::Starting) {
        actions.push(Action::Stop(replica.name.to_string()));
    }
    let running: Vec<&&ReplicaView<'_>> = old.iter().filter(|r| r.state == ReplicaState::Running).collect();
    for replica in running.iter().take(running.len().saturating_sub(keep)) {
        actions.push(Action::Drain(replica.name.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replicas as planning sees them, owned.
    #[derive(Default)]
    struct Replicas(Vec<(String, String, ReplicaState, Instant)>);

    impl Replicas {
        fn add(&mut self, version: &str, state: ReplicaState) -> String {
            let name = format!("replica:app:echo:{}", self.0.len());
            self.0.push((name.clone(), version.to_string(), state, Instant::now()));
            name
        }

        fn set(&mut self, name: &str, state: ReplicaState) {
            let replica = self.0.iter_mut().find(|r| r.0 == name).unwrap();
            replica.2 = state;
        }

        fn plan(&self, target: usize, version: &str, can_start: bool) -> Vec<Action> {
            let views: Vec<ReplicaView<'_>> = self
                .0
                .iter()
                .map(|(name, version, state, since)| ReplicaView {
                    name,
                    version,
                    state: *state,
                    since: *since,
                })
                .collect();
            plan(target, version, can_start, &views)
        }
    }

    #[test]
    fn a_new_deployment_starts_every_replica_at_once() {
        let replicas = Replicas::default();
        assert_eq!(
            replicas.plan(3, "v1", true),
            [Action::Start, Action::Start, Action::Start]
        );
    }

    #[test]
    fn a_rollout_starts_in_batches_and_drains_an_old_replica_per_new_one_running() {
        let mut replicas = Replicas::default();
        let old = [
            replicas.add("v1", ReplicaState::Running),
            replicas.add("v1", ReplicaState::Running),
        ];
        assert_eq!(
            replicas.plan(2, "v2", true),
            [Action::Start],
            "one at a time, nothing drained yet"
        );
        let first = replicas.add("v2", ReplicaState::Starting);
        assert_eq!(
            replicas.plan(2, "v2", true),
            [],
            "the batch is full and no new replica runs yet"
        );
        replicas.set(&first, ReplicaState::Running);
        assert_eq!(
            replicas.plan(2, "v2", true),
            [Action::Start, Action::Drain(old[0].clone())]
        );
        replicas.set(&old[0], ReplicaState::Draining);
        let second = replicas.add("v2", ReplicaState::Starting);
        replicas.set(&second, ReplicaState::Running);
        assert_eq!(replicas.plan(2, "v2", true), [Action::Drain(old[1].clone())]);
    }

    #[test]
    fn a_version_that_cannot_start_keeps_the_old_replicas_serving() {
        let mut replicas = Replicas::default();
        replicas.add("v1", ReplicaState::Running);
        replicas.add("v1", ReplicaState::Running);
        assert_eq!(
            replicas.plan(2, "v2", false),
            [],
            "nothing starts and nothing is drained"
        );
    }

    fn deployment() -> DeploymentState {
        let init = raylet::codec::encode(&()).unwrap();
        DeploymentState::new(DeploymentConfig::from_parts("echo", "demo::Echo", init))
    }

    #[test]
    fn a_version_that_never_ran_fails_after_three_failed_starts() {
        let mut state = deployment();
        let now = Instant::now();
        for _ in 0..2 {
            assert_eq!(state.start_failed("no checkpoint".into(), now), None);
            assert!(state.can_start(now));
        }
        assert_eq!(state.start_failed("no checkpoint".into(), now), None);
        assert_eq!(state.failed.as_deref(), Some("no checkpoint"));
        assert!(!state.can_start(now + Duration::from_secs(3600)));
    }

    #[test]
    fn a_version_that_ran_retries_failed_starts_after_a_growing_capped_delay() {
        let mut state = deployment();
        state.replica_ran();
        let now = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..10 {
            let delay = state.start_failed("node gone".into(), now).expect("a retry");
            assert!(!state.can_start(now), "not before the delay");
            assert!(state.can_start(now + delay));
            delays.push(delay);
        }
        assert!(state.failed.is_none(), "it never gives up");
        assert!(
            delays[0] <= FIRST_RESTART_DELAY && delays[3] >= 4 * FIRST_RESTART_DELAY,
            "{delays:?}"
        );
        assert!(delays.iter().all(|delay| *delay <= MAX_RESTART_DELAY), "{delays:?}");
        assert!(delays[9] >= MAX_RESTART_DELAY / 2, "{delays:?}");
        state.replica_ran();
        assert!(state.unhealthy.is_none() && state.can_start(now));
    }

    #[test]
    fn scaling_down_stops_starting_replicas_before_draining_running_ones() {
        let mut replicas = Replicas::default();
        replicas.add("v1", ReplicaState::Running);
        replicas.add("v1", ReplicaState::Running);
        let starting = replicas.add("v1", ReplicaState::Starting);
        let plan = replicas.plan(1, "v1", true);
        assert_eq!(plan.len(), 2);
        assert_eq!(plan[0], Action::Stop(starting));
        assert!(matches!(plan[1], Action::Drain(_)), "{plan:?}");
        assert_eq!(replicas.plan(0, "v1", true).len(), 3, "deleting drains or stops all");
    }
}
