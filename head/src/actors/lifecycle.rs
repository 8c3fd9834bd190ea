//! One actor's life, run by the head: place it on a node, lease a worker
//! there, run its constructor, hold the worker's task stream open as long
//! as the actor lives, and when that stream ends (the process died) or a
//! kill order comes, restart it or record its death. A head that restarted
//! takes over the actors it had: it adopts the lease of each one's worker,
//! which its node manager held meanwhile, and restarts those whose worker
//! is gone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use raylet_common::Backoff;
use raylet_common::auth::AuthToken;
use raylet_placement::{Choice, Placer};
use raylet_proto::task_stream::{self, EventReader, TaskSender};
use raylet_proto::v1::{
    ActorCreation, ActorDeathKind, FailureKind, LeaseRefusalKind, ObjectOutcome, TaskBatch, TaskFailure, TaskSpec,
    object_outcome,
};
use raylet_proto::{PlacementGroupId, SchedulingStrategy, TaskId};
use tokio::sync::watch;

use super::leases::{Grant, HeadLeases, LeaseAnswer};
use super::table::{ActorSpec, ActorTable, KillOrder, RecoveredActor};
use crate::NodeTable;
use crate::placement_groups::{GroupManager, GroupState, NodeManagerBundles};

/// A leased worker answers at once; if it does not, it is gone.
const WORKER_PATIENCE: Duration = Duration::from_secs(2);
/// How many times a lease may be passed on to another node.
const MAX_SPILLBACKS: usize = 8;
/// How long a killed worker's stream may take to end.
const KILL_PATIENCE: Duration = Duration::from_secs(5);
const FIRST_PLACEMENT_BACKOFF: Duration = Duration::from_millis(100);
const MAX_PLACEMENT_BACKOFF: Duration = Duration::from_secs(1);
/// How long a restarted head waits for the owners of the actors it
/// recovered to open their sessions again before it kills their actors
/// that are not detached; owners try again every 200 ms.
const OWNER_RETURN_GRACE: Duration = Duration::from_secs(10);

/// What every actor's life needs from the head.
pub(crate) struct ActorRuntime {
    pub(crate) table: Arc<Mutex<ActorTable>>,
    pub(crate) nodes: Arc<Mutex<NodeTable>>,
    pub(crate) leases: HeadLeases,
    pub(crate) placer: Mutex<Placer>,
    pub(crate) groups: Arc<GroupManager<NodeManagerBundles>>,
    /// Turns over the bundles of a group for actors that name no bundle.
    pub(crate) next_bundle: AtomicUsize,
    pub(crate) token: AuthToken,
    /// Set when the head stops: the streams it serves end, so that its
    /// server can finish.
    pub(crate) stopping: watch::Sender<bool>,
}

impl ActorRuntime {
    pub(crate) fn table(&self) -> MutexGuard<'_, ActorTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stop_streams(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once the head stops.
    pub(crate) async fn stopped(&self) {
        let mut stopping = self.stopping.subscribe();
        let _ = stopping.wait_for(|stopping| *stopping).await;
    }
}

/// How an attempt to host the actor ended.
enum Ended {
    /// For good: it cannot run.
    Dead(ActorDeathKind, String),
    /// Its process is gone; it may restart.
    ProcessDied(String),
}

/// An actor constructed on a worker, with the stream that stays open while
/// the worker lives.
struct Hosted {
    grant: Grant,
    events: EventReader,
    _tasks: TaskSender,
}

/// Runs the actors a restarted head recovered: each adopts its worker, or
/// is placed again. Once owners had time to come back, the actors of those
/// that did not are killed.
pub(crate) fn resume_actors(runtime: &Arc<ActorRuntime>, recovered: Vec<RecoveredActor>) {
    if recovered.is_empty() {
        return;
    }
    tracing::info!(actors = recovered.len(), "taking over the actors the head had");
    let ids: Vec<_> = recovered.iter().map(|actor| actor.spec.id).collect();
    for actor in recovered {
        tokio::spawn(run_actor(runtime.clone(), actor.spec, actor.kill, actor.host));
    }
    let runtime = runtime.clone();
    tokio::spawn(async move {
        tokio::time::sleep(OWNER_RETURN_GRACE).await;
        runtime.table().kill_orphans(&ids);
    });
}

/// Runs an actor until it is dead for good; `adopted` is the lease of the
/// worker that hosted it before the head restarted.
pub(crate) async fn run_actor(
    runtime: Arc<ActorRuntime>,
    spec: Arc<ActorSpec>,
    mut kill: watch::Receiver<Option<KillOrder>>,
    mut adopted: Option<Grant>,
) {
    loop {
        let restarts = runtime.table().record(spec.id).map(|r| r.restarts).unwrap_or_default();
        let hosted = match adopted.take() {
            Some(host) => adopt(&runtime, &spec, host).await,
            None => self::host(&runtime, &spec, restarts, &mut kill).await,
        };
        let cause = match hosted {
            Ok(hosted) => {
                let grant = hosted.grant.clone();
                let stored = runtime.table().store_alive(spec.id, &grant);
                if let Err(error) = stored.await {
                    tracing::error!(actor = %spec.id, %error, "where the actor runs is not on disk");
                }
                runtime.table().alive(spec.id, &grant);
                let cause = until_gone(&runtime, &spec, hosted, &mut kill).await;
                runtime.leases.forget(&grant, &spec.binary);
                cause
            }
            Err(Ended::ProcessDied(cause)) => cause,
            Err(Ended::Dead(kind, cause)) => {
                runtime.table().dead(spec.id, kind, &cause);
                return;
            }
        };
        if !runtime.table().process_died(spec.id, &cause) {
            return;
        }
        tracing::info!(actor = %spec.id, %cause, "restarting an actor");
    }
}

/// Takes over the worker that hosted the actor before the head restarted:
/// adopts its lease from its node manager and opens a task stream to it.
async fn adopt(runtime: &ActorRuntime, spec: &ActorSpec, host: Grant) -> Result<Hosted, Ended> {
    let lost = |why: String| Ended::ProcessDied(format!("its worker was lost while the head was down: {why}"));
    let grant = match runtime.leases.adopt(&host, &spec.binary).await {
        Ok(LeaseAnswer::Granted(grant)) => grant,
        Ok(LeaseAnswer::Refused { reason, .. }) => return Err(lost(reason)),
        Ok(LeaseAnswer::Spillback(node)) => return Err(lost(format!("its node passed it on to {node}"))),
        Err(error) => return Err(lost(format!("its node {} is unreachable ({error})", host.node))),
    };
    match task_stream::open(&grant.address, &runtime.token, WORKER_PATIENCE).await {
        Ok((tasks, events)) => {
            tracing::info!(actor = %spec.id, worker = %grant.worker_id, "adopted the actor's worker");
            Ok(Hosted {
                grant,
                events,
                _tasks: tasks,
            })
        }
        Err(error) => {
            runtime.leases.end_worker(&grant, &spec.binary).await;
            Err(lost(format!(
                "its worker at {} is unreachable ({error})",
                grant.address
            )))
        }
    }
}

/// Places the actor and runs its constructor; a kill order stops that.
async fn host(
    runtime: &ActorRuntime,
    spec: &ActorSpec,
    restarts: u32,
    kill: &mut watch::Receiver<Option<KillOrder>>,
) -> Result<Hosted, Ended> {
    if let Some(order) = kill.borrow_and_update().clone() {
        return Err(Ended::ProcessDied(order.cause));
    }
    let grant = tokio::select! {
        placed = place(runtime, spec) => placed?,
        order = ordered(kill) => return Err(Ended::ProcessDied(order.cause)),
    };
    tokio::select! {
        constructed = construct(runtime, spec, &grant, restarts) => match constructed {
            Ok(hosted) => Ok(hosted),
            Err(ended) => {
                runtime.leases.end_worker(&grant, &spec.binary).await;
                Err(ended)
            }
        },
        order = ordered(kill) => {
            runtime.leases.end_worker(&grant, &spec.binary).await;
            Err(Ended::ProcessDied(order.cause))
        }
    }
}

/// Leases a worker on a node that fits the actor. A node that does not
/// answer is asked again, or another one chosen once the head has marked it
/// dead, for up to twice the time that takes: a node's death costs the
/// actor one restart, not one per attempt to place it.
async fn place(runtime: &ActorRuntime, spec: &ActorSpec) -> Result<Grant, Ended> {
    let heartbeat_timeout = runtime
        .nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .heartbeat_timeout();
    let patience = 2 * heartbeat_timeout + MAX_PLACEMENT_BACKOFF;
    let started = Instant::now();
    let mut backoff = Backoff::new(FIRST_PLACEMENT_BACKOFF, MAX_PLACEMENT_BACKOFF);
    loop {
        match lease_on_a_fitting_node(runtime, spec).await {
            Ok(grant) => return Ok(grant),
            Err(Unplaced::Ended(ended)) => return Err(ended),
            Err(Unplaced::Unreachable(reason)) if started.elapsed() + backoff.step() >= patience => {
                return Err(Ended::ProcessDied(reason));
            }
            Err(Unplaced::Unreachable(reason)) => {
                tracing::debug!(actor = %spec.id, %reason, "placing the actor again");
                backoff.wait().await;
            }
        }
    }
}

/// Why one attempt to place an actor failed.
enum Unplaced {
    /// The chosen node did not answer; it may be dying.
    Unreachable(String),
    Ended(Ended),
}

/// Leases a worker on the node the placement policy chooses, following
/// spillbacks.
async fn lease_on_a_fitting_node(runtime: &ActorRuntime, spec: &ActorSpec) -> Result<Grant, Unplaced> {
    let mut node = match &spec.scheduling.strategy {
        SchedulingStrategy::PlacementGroup { group, bundle } => {
            bundle_node(runtime, *group, *bundle).await.map_err(Unplaced::Ended)?
        }
        _ => choose_node(runtime, spec).map_err(Unplaced::Ended)?,
    };
    for _ in 0..=MAX_SPILLBACKS {
        let answer = runtime
            .leases
            .request(&node, &spec.binary, &spec.placement, &spec.scheduling)
            .await;
        match answer {
            Ok(LeaseAnswer::Granted(grant)) => return Ok(grant),
            Ok(LeaseAnswer::Spillback(other)) => node = other,
            Ok(LeaseAnswer::Refused { reason, kind }) => {
                let ended = match kind {
                    LeaseRefusalKind::WorkerStartFailed | LeaseRefusalKind::WorkerGone => Ended::ProcessDied(reason),
                    LeaseRefusalKind::Infeasible | LeaseRefusalKind::Unschedulable => {
                        Ended::Dead(ActorDeathKind::Infeasible, reason)
                    }
                };
                return Err(Unplaced::Ended(ended));
            }
            Err(error) => {
                return Err(Unplaced::Unreachable(format!(
                    "its node {node} is unreachable ({error})"
                )));
            }
        }
    }
    Err(Unplaced::Ended(Ended::ProcessDied(format!(
        "its lease was passed on {MAX_SPILLBACKS} times without a grant"
    ))))
}

/// The node of the actor's bundle, once its placement group is created; any
/// bundle's node in turn when the actor names none.
async fn bundle_node(runtime: &ActorRuntime, group: PlacementGroupId, bundle: Option<u32>) -> Result<String, Ended> {
    let dead = |cause: String| Ended::Dead(ActorDeathKind::Infeasible, cause);
    let record = runtime
        .groups
        .wait_placed(group)
        .await
        .map_err(|e| dead(e.to_string()))?;
    if record.state == GroupState::Removed {
        return Err(dead(format!("its placement group {group} was removed")));
    }
    let count = record.locations.len();
    let index = match bundle {
        Some(index) => index as usize,
        None => runtime.next_bundle.fetch_add(1, Ordering::Relaxed) % count.max(1),
    };
    match record.locations.get(index) {
        Some(Some(location)) => Ok(location.address.clone()),
        Some(None) => Err(Ended::ProcessDied(format!(
            "bundle {index} of placement group {group} has no node"
        ))),
        None => Err(dead(format!(
            "bundle index {index} is out of range: placement group {group} has {count} bundles"
        ))),
    }
}

/// The node the head's placement policy chooses for the actor; its demand
/// counts against that node until the node's next heartbeat. An actor
/// that waits for the autoscaler to launch a node is queued on any alive
/// node, which lists it as demand and passes it on once the node joins.
fn choose_node(runtime: &ActorRuntime, spec: &ActorSpec) -> Result<String, Ended> {
    let mut nodes = runtime.nodes.lock().unwrap_or_else(|p| p.into_inner());
    let mut placer = runtime.placer.lock().unwrap_or_else(|p| p.into_inner());
    match nodes.choose(&mut placer, &spec.placement, &spec.scheduling) {
        Choice::Run(index) | Choice::Queue(index) => Ok(nodes.placement_view().node(index).address.clone()),
        Choice::AwaitLaunch(reason) => match nodes.alive_resources().first() {
            Some(node) => Ok(node.address.clone()),
            None => Err(Ended::Dead(
                ActorDeathKind::Infeasible,
                format!("{reason}, but no node is alive to queue it on"),
            )),
        },
        Choice::Infeasible(reason) | Choice::Unschedulable(reason) => {
            Err(Ended::Dead(ActorDeathKind::Infeasible, reason))
        }
    }
}

/// Runs the constructor on the leased worker and waits for its result.
async fn construct(runtime: &ActorRuntime, spec: &ActorSpec, grant: &Grant, restarts: u32) -> Result<Hosted, Ended> {
    let gone = |error: String| Ended::ProcessDied(format!("its worker at {} is unreachable ({error})", grant.address));
    let (tasks, mut events) = task_stream::open(&grant.address, &runtime.token, WORKER_PATIENCE)
        .await
        .map_err(|e| gone(e.to_string()))?;
    let creation = TaskBatch {
        tasks: vec![creation_spec(spec, restarts)],
        ..TaskBatch::default()
    };
    tasks.send(&creation).map_err(|_| gone("the stream closed".into()))?;
    loop {
        let Ok(Some(batch)) = events.message().await else {
            return Err(Ended::ProcessDied(runtime.leases.worker_exit(grant).await));
        };
        let Some(result) = batch.results.into_iter().next() else {
            continue;
        };
        if let Some(failure) = failure_of(result.outcome) {
            return Err(Ended::Dead(ActorDeathKind::CreationFailed, creation_failure(failure)));
        }
        if let Err(error) = runtime.leases.resize(grant, &spec.binary, &spec.running).await {
            tracing::warn!(actor = %spec.id, %error, "the actor keeps its placement resources");
        }
        return Ok(Hosted {
            grant: grant.clone(),
            events,
            _tasks: tasks,
        });
    }
}

fn creation_spec(spec: &ActorSpec, restarts: u32) -> TaskSpec {
    TaskSpec {
        task_id: TaskId::random().as_bytes().to_vec(),
        function: spec.class_name.clone(),
        binary_hash: spec.binary.hash.clone(),
        args: spec.args.clone(),
        attempt: restarts,
        owner_address: spec.owner.clone(),
        actor_id: spec.id.as_bytes().to_vec(),
        actor_creation: Some(ActorCreation {
            max_concurrency: spec.max_concurrency,
        }),
        ..TaskSpec::default()
    }
}

fn failure_of(outcome: Option<ObjectOutcome>) -> Option<TaskFailure> {
    match outcome?.outcome? {
        object_outcome::Outcome::Failure(failure) => Some(failure),
        object_outcome::Outcome::Value(_) => None,
    }
}

fn creation_failure(failure: TaskFailure) -> String {
    match failure.kind() {
        FailureKind::Application => format!("its constructor returned an error: {}", failure.message),
        FailureKind::Panic => format!("its constructor panicked: {}", failure.message),
        _ => format!("its constructor could not run: {}", failure.message),
    }
}

/// Waits until the actor's process is gone, ending it first on a kill
/// order; returns why it is gone.
async fn until_gone(
    runtime: &ActorRuntime,
    spec: &ActorSpec,
    mut hosted: Hosted,
    kill: &mut watch::Receiver<Option<KillOrder>>,
) -> String {
    let ended = async { while let Ok(Some(_)) = hosted.events.message().await {} };
    tokio::select! {
        () = ended => runtime.leases.worker_exit(&hosted.grant).await,
        cause = node_death(runtime, &hosted.grant) => cause,
        order = ordered(kill) => {
            runtime.leases.end_worker(&hosted.grant, &spec.binary).await;
            let drained = async { while let Ok(Some(_)) = hosted.events.message().await {} };
            let _ = tokio::time::timeout(KILL_PATIENCE, drained).await;
            order.cause
        }
    }
}

/// Resolves, saying why, once the head counts the grant's node
/// incarnation dead: a node cut off keeps its connections open, and its
/// actors must restart elsewhere all the same.
async fn node_death(runtime: &ActorRuntime, grant: &Grant) -> String {
    let nodes = || runtime.nodes.lock().unwrap_or_else(|p| p.into_inner());
    let mut deaths = nodes().watch_deaths();
    loop {
        if let Some(reason) = nodes().death_of(grant.node_id, grant.incarnation) {
            return format!("its node {} died: {reason}", grant.node_id);
        }
        if deaths.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The next kill order; pending forever when none comes.
async fn ordered(kill: &mut watch::Receiver<Option<KillOrder>>) -> KillOrder {
    loop {
        if let Some(order) = kill.borrow_and_update().clone() {
            return order;
        }
        if kill.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
