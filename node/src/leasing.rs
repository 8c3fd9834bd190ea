//! Worker leases: owners ask for a worker with a resource shape and a
//! scheduling strategy; the placement policy over this node and the others
//! the head reported decides: the node grants an idle or new worker when the
//! shape fits here, queues the request until it does, sends it to another
//! node (spillback), or refuses it when no node can ever fit it.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use raylet_cluster_status::ResourceDemand;
use raylet_placement::{Choice, ClusterResources, LaunchableNodes, NodeIndex, Placer, Request};
use raylet_proto::peer_stream::PeerSender;
use raylet_proto::v1::lease_session_event::Kind as EventKind;
use raylet_proto::v1::{
    LeaseGranted, LeaseRefusalKind, LeaseRefused, LeaseSessionEvent, LeaseSpillback, WorkerBinary, WorkerExitKind,
};
use raylet_proto::worker_env::WorkerBootstrap;
use raylet_proto::{Error, Labels, NodeId, ResourceSet, Result, Scheduling, WorkerId};
use tokio::time::Instant;

use super::binary_cache::BinaryCache;
use super::bundle_ops::{BundleError, BundleOperation};
use super::ledger::ResourceLedger;
use super::worker_launcher::{LaunchedWorker, WorkerExited, WorkerLauncher};
use super::worker_process::WorkerEnd;

/// Where a session's lease events go.
pub(crate) type EventSender = PeerSender<LeaseSessionEvent>;

/// Workers started at once for a new session, so its first tasks need not wait.
const PRESTARTED_WORKERS: usize = 2;
/// A worker that has not registered by then is killed.
pub(super) const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(30);
/// A session whose workers die this often before registering is refused.
pub(super) const MAX_STARTUP_FAILURES: u32 = 3;
const MAX_REMEMBERED_EXITS: usize = 4096;
/// How long an infeasible request stays listed in `raylet status`.
const INFEASIBLE_MEMORY: Duration = Duration::from_secs(300);
/// The most infeasible shapes listed at once.
const MAX_INFEASIBLE_SHAPES: usize = 50;
/// The session of a lease that outlived its own; sessions count from 1.
const NO_SESSION: u64 = 0;

/// Another node, as the head last reported it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub node_id: NodeId,
    pub address: String,
    pub total: ResourceSet,
    pub available: ResourceSet,
    pub labels: Labels,
}

/// A lease request waiting for room.
#[derive(Clone, Debug)]
pub(crate) struct PendingLease {
    pub(crate) session: u64,
    pub(crate) request_id: u64,
    pub(crate) demand: ResourceSet,
    pub(crate) scheduling: Scheduling,
    pub(crate) allow_spillback: bool,
    /// The work is retried if its worker dies.
    pub(crate) retriable: bool,
    /// The lease is held for a while when its session ends, for a new
    /// session to adopt (the worker hosts an actor of the head).
    pub(crate) outlives_session: bool,
    /// The cluster view current when the request was queued (set by the
    /// lease manager): only a later view may call it infeasible.
    pub(crate) view: u64,
}

enum WorkerState {
    /// Started; reserved for a request when `request` is set.
    Starting {
        request: Option<PendingLease>,
    },
    Idle {
        address: String,
    },
    Leased {
        address: String,
        since: Instant,
        /// Its work is retried if the worker dies.
        retriable: bool,
        /// Held when its session ends, for a new session to adopt.
        outlives_session: bool,
    },
}

struct Worker {
    /// [`NO_SESSION`] while its lease waits to be adopted.
    session: u64,
    /// When its session ended and left its lease to be adopted.
    orphaned_at: Option<Instant>,
    pid: u32,
    /// The GPUs in its `CUDA_VISIBLE_DEVICES`: it serves only leases given these.
    gpu_ids: Vec<u32>,
    state: WorkerState,
    /// It owns objects still referenced: ending it would lose them.
    owns_objects: bool,
}

struct Session {
    binary: PathBuf,
    binary_hash: String,
    namespace: String,
    events: EventSender,
    startup_failures: u32,
}

struct LeaseState {
    ledger: ResourceLedger,
    /// This node (fresh from the ledger) and the others (as the head last
    /// reported them, less what was spilled to them since).
    cluster: ClusterResources,
    local: NodeIndex,
    placer: Placer,
    sessions: HashMap<u64, Session>,
    next_session: u64,
    workers: HashMap<WorkerId, Worker>,
    queue: VecDeque<PendingLease>,
    exits: HashMap<WorkerId, WorkerEnd>,
    /// Requests refused lately because no node could ever fit them.
    infeasible: Vec<RefusedDemand>,
    /// How many cluster views the head has sent.
    view: u64,
    /// The node types the cluster's autoscaler may launch, as the head
    /// last sent them.
    launchable: LaunchableNodes,
    /// Tasks queued at owners beyond their lease requests, by session and
    /// shape, as they last reported.
    backlogs: HashMap<(u64, ResourceSet, Scheduling), u64>,
}

/// Requests of one shape refused as infeasible, for `raylet status`.
struct RefusedDemand {
    demand: ResourceSet,
    scheduling: Scheduling,
    count: u64,
    reason: String,
    last: Instant,
}

/// What a node needs to know to start workers that can find it.
#[derive(Clone, Debug)]
pub(crate) struct WorkerContext {
    pub(crate) node_id: NodeId,
    /// The node's incarnation, set as it registers.
    pub(crate) incarnation: Arc<AtomicU64>,
    pub(crate) node_manager_address: String,
    pub(crate) head_address: String,
    pub(crate) token: String,
    pub(crate) bind_ip: String,
    pub(crate) labels: Labels,
    /// Where workers write their output.
    pub(crate) log_dir: std::path::PathBuf,
}

#[cfg(test)]
impl WorkerContext {
    /// A node at "a:1" (incarnation 1) whose workers nothing ever reaches.
    pub(crate) fn for_tests() -> Self {
        WorkerContext {
            node_id: NodeId::random(),
            incarnation: Arc::new(AtomicU64::new(1)),
            node_manager_address: "a:1".into(),
            head_address: "h:1".into(),
            token: String::new(),
            bind_ip: "127.0.0.1".into(),
            labels: Labels::new(),
            log_dir: std::env::temp_dir(),
        }
    }
}

/// The node's leases and worker processes.
pub(crate) struct LeaseManager {
    context: WorkerContext,
    /// Starts and kills the workers: processes, or virtual ones in tests.
    launcher: Arc<dyn WorkerLauncher>,
    binaries: BinaryCache,
    state: Mutex<LeaseState>,
    /// How long a lease that outlives its session waits to be adopted
    /// before its worker is killed.
    adoption_grace: Duration,
}

impl LeaseManager {
    pub(crate) fn new(
        context: WorkerContext,
        total: ResourceSet,
        adoption_grace: Duration,
        launcher: Arc<dyn WorkerLauncher>,
    ) -> Arc<Self> {
        let (cluster, local) = cluster_of(&context, &total, Vec::new());
        let seed = u64::from_le_bytes(context.node_id.as_bytes()[..8].try_into().expect("ids are 16 bytes"));
        Arc::new(LeaseManager {
            context,
            launcher,
            binaries: BinaryCache::default(),
            adoption_grace,
            state: Mutex::new(LeaseState {
                ledger: ResourceLedger::new(total),
                cluster,
                local,
                placer: Placer::new(seed),
                sessions: HashMap::new(),
                next_session: NO_SESSION + 1,
                workers: HashMap::new(),
                queue: VecDeque::new(),
                exits: HashMap::new(),
                infeasible: Vec::new(),
                view: 0,
                launchable: LaunchableNodes::default(),
                backlogs: HashMap::new(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The requests waiting here and the backlogs owners reported, by
    /// shape, and those refused lately because no node could ever fit them.
    pub(crate) fn demands(&self) -> Vec<ResourceDemand> {
        let mut state = self.state();
        state
            .infeasible
            .retain(|refused| refused.last.elapsed() < INFEASIBLE_MEMORY);
        let mut demands: Vec<ResourceDemand> = Vec::new();
        let queued = state
            .queue
            .iter()
            .map(|pending| (&pending.demand, &pending.scheduling, 1));
        let backlogged = state
            .backlogs
            .iter()
            .map(|((_, demand, scheduling), count)| (demand, scheduling, *count));
        for (shape, scheduling, count) in queued.chain(backlogged) {
            add_waiting(&mut demands, shape, scheduling, count);
        }
        demands.extend(state.infeasible.iter().map(|refused| ResourceDemand {
            shape: refused.demand.clone(),
            constraint: refused.scheduling.to_string(),
            count: refused.count,
            infeasible: true,
            reason: refused.reason.clone(),
            scheduling: refused.scheduling.clone(),
            group: None,
        }));
        demands
    }

    /// Records the tasks `session`'s owner has queued beyond its requests.
    pub(crate) fn set_backlog(&self, session: u64, demand: ResourceSet, scheduling: Scheduling, backlog: u64) {
        let mut state = self.state();
        let key = (session, demand, scheduling);
        match backlog {
            0 => state.backlogs.remove(&key),
            count => state.backlogs.insert(key, count),
        };
    }

    /// The machine's resources and what of them is free, as the head is told.
    pub(crate) fn reported(&self) -> (ResourceSet, ResourceSet) {
        self.state().ledger.reported()
    }

    /// Applies bundle operations in order under one lock, each on its own,
    /// ends the workers leased in released bundles, then grants what the
    /// changes let run.
    pub(crate) fn apply_bundle_ops(
        self: &Arc<Self>,
        ops: Vec<Result<BundleOperation, BundleError>>,
    ) -> Vec<Result<(), BundleError>> {
        let mut ended = Vec::new();
        let results = {
            let mut state = self.state();
            ops.into_iter()
                .map(|op| op.and_then(|op| apply_bundle_op(&mut state, op, &mut ended)))
                .collect()
        };
        if !ended.is_empty() {
            tracing::info!(workers = ?ended, "placement group bundles released; ending their workers");
        }
        ended.into_iter().for_each(|pid| self.launcher.kill(pid));
        self.pump();
        results
    }

    /// Sets `demand` aside for a job's driver under a holder id of its own,
    /// if it fits now.
    pub(crate) fn hold_for_driver(&self, demand: ResourceSet) -> Option<WorkerId> {
        let mut state = self.state();
        if !state.ledger.fits_now(&demand) {
            return None;
        }
        let holder = WorkerId::random();
        state.ledger.hold(holder, demand);
        Some(holder)
    }

    /// Gives back what a job's driver held, and grants what that lets run.
    pub(crate) fn release_driver(self: &Arc<Self>, holder: WorkerId) {
        self.state().ledger.release(holder);
        self.pump();
    }

    pub(crate) fn set_cluster_view(self: &Arc<Self>, view: Vec<NodeView>, launchable: LaunchableNodes) {
        {
            let mut state = self.state();
            state.launchable = launchable;
            let (cluster, local) = cluster_of(&self.context, state.ledger.total(), view);
            state.cluster = cluster;
            state.local = local;
            state.view += 1;
        }
        self.pump();
    }

    /// Opens a session whose workers run `binary`, after checking that the
    /// file there is the build the owner runs. Pre-starts a few workers; a
    /// session whose workers cannot be started is not opened.
    pub(crate) fn open_session(self: &Arc<Self>, binary: WorkerBinary, events: EventSender) -> Result<u64> {
        let path = PathBuf::from(&binary.path);
        let actual = self.binaries.hash(&path)?;
        if actual != binary.hash {
            return Err(Error::FailedPrecondition(format!(
                "the binary at {} has hash {actual}, but the caller runs a build with hash {}; \
                 was it rebuilt while the program ran?",
                path.display(),
                binary.hash
            )));
        }
        let session = {
            let mut state = self.state();
            let session = state.next_session;
            state.next_session += 1;
            state.sessions.insert(
                session,
                Session {
                    binary: path,
                    binary_hash: actual,
                    namespace: binary.namespace,
                    events,
                    startup_failures: 0,
                },
            );
            session
        };
        for _ in 0..PRESTARTED_WORKERS {
            if let Err(error) = self.spawn_worker(WorkerId::random(), session, None, Vec::new()) {
                self.close_session(session);
                return Err(error);
            }
        }
        Ok(session)
    }

    /// Kills the session's workers, frees their resources and drops its
    /// requests; leases that outlive the session are held for adoption for
    /// the adoption grace instead.
    pub(crate) fn close_session(self: &Arc<Self>, session: u64) {
        let doomed: Vec<u32> = {
            let mut state = self.state();
            state.sessions.remove(&session);
            state.queue.retain(|p| p.session != session);
            state.backlogs.retain(|(owner, _, _), _| *owner != session);
            let orphaned = self.orphan_outliving_leases(&mut state, session);
            let ids: Vec<WorkerId> = state
                .workers
                .iter()
                .filter(|(_, w)| w.session == session)
                .map(|(id, _)| *id)
                .collect();
            if orphaned > 0 {
                tracing::info!(
                    session,
                    orphaned,
                    "lease session closed; holding its actors' workers for adoption"
                );
            }
            ids.iter()
                .filter_map(|id| {
                    state.ledger.release(*id);
                    state.workers.remove(id).map(|w| w.pid)
                })
                .collect()
        };
        tracing::debug!(session, workers = ?doomed, "lease session closed; killing its workers");
        doomed.into_iter().for_each(|pid| self.launcher.kill(pid));
        self.pump();
    }

    /// Moves the session's leases that outlive it to [`NO_SESSION`] and has
    /// them killed unless adopted within the adoption grace; returns how many.
    fn orphan_outliving_leases(self: &Arc<Self>, state: &mut LeaseState, session: u64) -> usize {
        let now = Instant::now();
        let orphans = state.workers.values_mut().filter(|w| {
            w.session == session
                && matches!(
                    w.state,
                    WorkerState::Leased {
                        outlives_session: true,
                        ..
                    }
                )
        });
        let count = orphans
            .map(|worker| {
                worker.session = NO_SESSION;
                worker.orphaned_at = Some(now);
            })
            .count();
        if count > 0 {
            let (manager, grace) = (Arc::downgrade(self), self.adoption_grace);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                if let Some(manager) = manager.upgrade() {
                    manager.kill_unadopted();
                }
            });
        }
        count
    }

    /// Kills the workers whose leases waited the adoption grace in vain.
    fn kill_unadopted(self: &Arc<Self>) {
        let grace = self.adoption_grace;
        let doomed: Vec<(WorkerId, u32)> = {
            let mut state = self.state();
            let expired: Vec<(WorkerId, u32)> = state
                .workers
                .iter()
                .filter(|(_, w)| w.orphaned_at.is_some_and(|at| at.elapsed() >= grace))
                .map(|(id, w)| (*id, w.pid))
                .collect();
            for (worker_id, _) in &expired {
                let reason = format!("was not adopted within {grace:?} after its lease session ended");
                state
                    .exits
                    .insert(*worker_id, WorkerEnd::new(WorkerExitKind::LeaseRevoked, reason));
            }
            expired
        };
        for (worker_id, pid) in doomed {
            tracing::warn!(%worker_id, pid, "killing a worker whose lease nobody adopted");
            self.launcher.kill(pid);
        }
    }

    /// Hands a lease that outlives its session to `session`: granted under
    /// `request_id` when the worker is still leased here, refused when not.
    pub(crate) fn adopt_lease(&self, session: u64, request_id: u64, worker_id: WorkerId) {
        let mut guard = self.state();
        let state = &mut *guard;
        let grace = self.adoption_grace;
        let adoptable = state.workers.get_mut(&worker_id).filter(|worker| {
            let leased = matches!(
                worker.state,
                WorkerState::Leased {
                    outlives_session: true,
                    ..
                }
            );
            leased && worker.orphaned_at.is_none_or(|at| at.elapsed() < grace)
        });
        let event = match adoptable {
            Some(worker) => {
                worker.session = session;
                worker.orphaned_at = None;
                let WorkerState::Leased { address, .. } = &worker.state else {
                    unreachable!("filtered for leased workers")
                };
                granted(request_id, worker_id, worker, address, &self.context)
            }
            None => {
                let exit = state
                    .exits
                    .get(&worker_id)
                    .map_or("is not held here", |end| end.description.as_str());
                let reason = format!("worker {worker_id} {exit}");
                refused_event(request_id, LeaseRefusalKind::WorkerGone, &reason)
            }
        };
        send_to_session(state, session, event);
    }

    pub(crate) fn request(self: &Arc<Self>, mut pending: PendingLease) {
        let mut state = self.state();
        pending.view = state.view;
        state.queue.push_back(pending);
        drop(state);
        self.pump();
    }

    /// Answers a request that could not be decoded, so its owner is not left waiting.
    pub(crate) fn refuse_malformed(&self, session: u64, request_id: u64, error: &Error) {
        let reason = format!("the lease request is malformed: {error}");
        let event = refused_event(request_id, LeaseRefusalKind::Unschedulable, &reason);
        send_to_session(&self.state(), session, event);
    }

    pub(crate) fn cancel_request(self: &Arc<Self>, session: u64, request_id: u64) {
        let mut state = self.state();
        state
            .queue
            .retain(|p| !(p.session == session && p.request_id == request_id));
        let reserved = state.workers.iter_mut().find_map(|(id, worker)| match &worker.state {
            WorkerState::Starting { request: Some(p) } if p.session == session && p.request_id == request_id => {
                worker.state = WorkerState::Starting { request: None };
                Some(*id)
            }
            _ => None,
        });
        if let Some(worker) = reserved {
            state.ledger.release(worker);
        }
        drop(state);
        self.pump();
    }

    /// The owner is done with `worker`: it becomes idle, or is killed when
    /// it failed or the session already has enough idle workers (unless it
    /// owns objects that are still referenced). A worker of another session
    /// is left alone.
    pub(crate) fn return_lease(self: &Arc<Self>, session: u64, worker_id: WorkerId, failed: bool) {
        let kill_pid = {
            let mut state = self.state();
            if state
                .workers
                .get(&worker_id)
                .is_none_or(|worker| worker.session != session)
            {
                return;
            }
            state.ledger.release(worker_id);
            let max_idle = state
                .ledger
                .total()
                .get(raylet_proto::resources::CPU)
                .as_f64()
                .ceil()
                .max(2.0) as usize;
            let idle = state
                .workers
                .values()
                .filter(|w| w.session == session && matches!(w.state, WorkerState::Idle { .. }))
                .count();
            match state.workers.get_mut(&worker_id) {
                Some(worker) if worker.session == session => match &worker.state {
                    WorkerState::Leased { address, .. } if !failed && (idle < max_idle || worker.owns_objects) => {
                        worker.state = WorkerState::Idle {
                            address: address.clone(),
                        };
                        None
                    }
                    _ => Some(worker.pid),
                },
                _ => None,
            }
        };
        if let Some(pid) = kill_pid {
            tracing::debug!(%worker_id, pid, failed, "killing a returned worker");
            self.launcher.kill(pid);
        }
        self.pump();
    }

    /// A started worker reports its address: it takes the request it was
    /// started for, or waits idle.
    pub(crate) fn register_worker(self: &Arc<Self>, worker_id: WorkerId, address: String) -> Result<()> {
        let mut guard = self.state();
        let state = &mut *guard;
        let worker = state
            .workers
            .get_mut(&worker_id)
            .ok_or_else(|| Error::NotFound(format!("worker {worker_id} was not started by this node manager")))?;
        let session = worker.session;
        let grant = match std::mem::replace(
            &mut worker.state,
            WorkerState::Idle {
                address: address.clone(),
            },
        ) {
            WorkerState::Starting { request: Some(pending) } => {
                worker.state = WorkerState::Leased {
                    address: address.clone(),
                    since: Instant::now(),
                    retriable: pending.retriable,
                    outlives_session: pending.outlives_session,
                };
                Some(pending.request_id)
            }
            _ => None,
        };
        if let Some(session) = state.sessions.get_mut(&session) {
            session.startup_failures = 0;
            if let (Some(request_id), Some(worker)) = (grant, state.workers.get(&worker_id)) {
                let event = granted(request_id, worker_id, worker, &address, &self.context);
                send(&session.events, event);
            }
        }
        drop(guard);
        self.pump();
        Ok(())
    }

    pub(crate) fn set_owns_objects(&self, worker_id: WorkerId, owns: bool) {
        if let Some(worker) = self.state().workers.get_mut(&worker_id) {
            worker.owns_objects = owns;
        }
    }

    /// Changes what a lease of `session` holds; freed resources go to
    /// waiting requests. Leases of other sessions are left alone.
    pub(crate) fn resize_lease(self: &Arc<Self>, session: u64, worker_id: WorkerId, resources: ResourceSet) {
        {
            let mut state = self.state();
            if state
                .workers
                .get(&worker_id)
                .is_none_or(|worker| worker.session != session)
            {
                return;
            }
            state.ledger.resize(worker_id, resources);
        }
        self.pump();
    }

    pub(crate) fn set_blocked(self: &Arc<Self>, worker_id: WorkerId, blocked: bool) {
        self.state().ledger.set_blocked(worker_id, blocked);
        self.pump();
    }

    /// Ends the worker of the newest lease, retriable work first, because
    /// the node's memory use (`usage`) is past the threshold. Returns the
    /// worker it ended, if any lease is held.
    pub(crate) fn end_newest_for_memory(&self, usage: &str) -> Option<WorkerId> {
        let mut state = self.state();
        let (worker, pid) = state
            .workers
            .iter()
            .filter_map(|(id, worker)| match worker.state {
                WorkerState::Leased { since, retriable, .. } => Some(((retriable, since), *id, worker.pid)),
                _ => None,
            })
            .max_by_key(|(newest_retriable, _, _)| *newest_retriable)
            .map(|(_, id, pid)| (id, pid))?;
        let reason = format!("was killed by the out-of-memory monitor: {usage}");
        tracing::warn!(%worker, pid, %reason, "ending a worker to free memory");
        state
            .exits
            .insert(worker, WorkerEnd::new(WorkerExitKind::OomKilled, reason));
        drop(state);
        self.launcher.kill(pid);
        Some(worker)
    }

    /// How `worker_id` exited, waiting up to `patience` for it to be reaped.
    pub(crate) async fn worker_exit(&self, worker_id: WorkerId, patience: Duration) -> Option<WorkerEnd> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(exit) = self.state().exits.get(&worker_id) {
                return Some(exit.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Ends every lease session (their owners see their streams end) and
    /// kills every worker, as the node shuts down.
    pub(crate) fn shut_down(&self) {
        let pids: Vec<u32> = {
            let mut state = self.state();
            state.sessions.clear();
            state.workers.values().map(|w| w.pid).collect()
        };
        pids.into_iter().for_each(|pid| self.launcher.kill(pid));
    }

    /// Kills every worker, keeping the sessions: the node's old incarnation
    /// was counted dead and its work failed or retried elsewhere. Returns
    /// how many there were.
    pub(crate) fn kill_all_workers(&self) -> usize {
        let pids: Vec<u32> = self.state().workers.values().map(|w| w.pid).collect();
        pids.iter().for_each(|pid| self.launcher.kill(*pid));
        pids.len()
    }

    /// Records how the worker ended, unless the node ended it and recorded
    /// why already.
    fn worker_exited(self: &Arc<Self>, worker_id: WorkerId, end: WorkerEnd) {
        let mut state = self.state();
        state.ledger.release(worker_id);
        if state.exits.len() >= MAX_REMEMBERED_EXITS {
            state.exits.clear();
        }
        let description = state.exits.entry(worker_id).or_insert(end).description.clone();
        let Some(worker) = state.workers.remove(&worker_id) else {
            return;
        };
        tracing::debug!(%worker_id, pid = worker.pid, %description, "worker exited");
        if let WorkerState::Starting { request } = worker.state {
            self.startup_failed(&mut state, worker.session, request, &description);
        }
        drop(state);
        self.pump();
    }

    /// A worker died before registering: retry its request, or refuse the
    /// session's requests when its workers keep dying.
    fn startup_failed(&self, state: &mut LeaseState, session: u64, request: Option<PendingLease>, description: &str) {
        let Some(entry) = state.sessions.get_mut(&session) else {
            return;
        };
        entry.startup_failures += 1;
        tracing::warn!(binary = %entry.binary.display(), %description, "a worker died before it registered");
        if entry.startup_failures < MAX_STARTUP_FAILURES {
            if let Some(pending) = request {
                state.queue.push_front(pending);
            }
            return;
        }
        let reason = format!(
            "{} workers in a row started from {} ended before they registered; the last {description}",
            entry.startup_failures,
            entry.binary.display(),
        );
        let events = entry.events.clone();
        let refused: Vec<u64> = request
            .into_iter()
            .map(|p| p.request_id)
            .chain(
                state
                    .queue
                    .iter()
                    .filter(|p| p.session == session)
                    .map(|p| p.request_id),
            )
            .collect();
        state.queue.retain(|p| p.session != session);
        for request_id in refused {
            send(
                &events,
                refused_event(request_id, LeaseRefusalKind::WorkerStartFailed, &reason),
            );
        }
    }

    /// Grants, spills back or refuses whatever queued requests it can.
    fn pump(self: &Arc<Self>) {
        let mut to_spawn = Vec::new();
        {
            let mut guard = self.state();
            let state = &mut *guard;
            let available = state.ledger.available();
            state.cluster.set_available(state.local, &available);
            let mut waiting: Vec<(ResourceSet, Scheduling)> = Vec::new();
            let mut index = 0;
            while index < state.queue.len() {
                let pending = state.queue[index].clone();
                let class = (pending.demand.clone(), pending.scheduling.clone());
                let decision = match waiting.contains(&class) {
                    true => Decision::Wait,
                    false => decide(state, &pending),
                };
                if matches!(decision, Decision::Wait) {
                    waiting.push(class);
                    index += 1;
                    continue;
                }
                state.queue.remove(index);
                match decision {
                    Decision::Grant => {
                        let demand = state.cluster.demand(&pending.demand);
                        state.cluster.subtract(state.local, &demand);
                        if let Some(pending) = self.grant_idle(state, pending) {
                            let worker_id = WorkerId::random();
                            let gpu_ids = state.ledger.hold(worker_id, pending.demand.clone());
                            to_spawn.push((worker_id, pending, gpu_ids));
                        }
                    }
                    Decision::Spill(address) => {
                        LEASE_REPLIES.with_label_values(&["spilled_back"]).inc();
                        let event = EventKind::Spillback(LeaseSpillback {
                            request_id: pending.request_id,
                            node_address: address,
                        });
                        send_to_session(state, pending.session, event);
                    }
                    Decision::Refuse(kind, reason) => {
                        if kind == LeaseRefusalKind::Infeasible {
                            remember_infeasible(&mut state.infeasible, &pending, &reason);
                        }
                        send_to_session(state, pending.session, refused_event(pending.request_id, kind, &reason));
                    }
                    Decision::Wait => unreachable!("waiting requests stay queued"),
                }
            }
        }
        for (worker_id, pending, gpu_ids) in to_spawn {
            let session = pending.session;
            let request_id = pending.request_id;
            if let Err(error) = self.spawn_worker(worker_id, session, Some(pending), gpu_ids) {
                self.state().ledger.release(worker_id);
                let state = self.state();
                let event = refused_event(request_id, LeaseRefusalKind::WorkerStartFailed, &error.to_string());
                send_to_session(&state, session, event);
            }
        }
    }

    /// Leases an idle worker of the session that sees the GPUs the request
    /// is given, or hands the request back.
    fn grant_idle(&self, state: &mut LeaseState, pending: PendingLease) -> Option<PendingLease> {
        let gpu_ids = state.ledger.gpu_ids_for(&pending.demand).unwrap_or_default();
        let idle = state.workers.iter_mut().find(|(_, w)| {
            w.session == pending.session && w.gpu_ids == gpu_ids && matches!(w.state, WorkerState::Idle { .. })
        });
        let Some((worker_id, worker)) = idle else {
            return Some(pending);
        };
        let worker_id = *worker_id;
        let WorkerState::Idle { address } = &worker.state else {
            unreachable!("filtered for idle workers")
        };
        let address = address.clone();
        worker.state = WorkerState::Leased {
            address: address.clone(),
            since: Instant::now(),
            retriable: pending.retriable,
            outlives_session: pending.outlives_session,
        };
        state.ledger.hold(worker_id, pending.demand);
        let event = granted(pending.request_id, worker_id, worker, &address, &self.context);
        send_to_session(state, pending.session, event);
        None
    }

    /// Starts a worker for `session`, reserved for `request` when given,
    /// and watches it: its exit is recorded, and it is killed if it does not
    /// register in time.
    fn spawn_worker(
        self: &Arc<Self>,
        worker_id: WorkerId,
        session: u64,
        request: Option<PendingLease>,
        gpu_ids: Vec<u32>,
    ) -> Result<()> {
        let (binary, bootstrap) = self.bootstrap(worker_id, session, gpu_ids.clone())?;
        let LaunchedWorker { pid, exited } = self.launcher.launch(&binary, &bootstrap)?;
        self.state().workers.insert(
            worker_id,
            Worker {
                session,
                orphaned_at: None,
                pid,
                gpu_ids,
                state: WorkerState::Starting { request },
                owns_objects: false,
            },
        );
        self.record_exit(worker_id, exited);
        self.kill_if_unregistered(worker_id, pid);
        Ok(())
    }

    /// The session's binary, and what tells a worker started from it who
    /// it is and where its node is.
    fn bootstrap(&self, worker_id: WorkerId, session: u64, gpu_ids: Vec<u32>) -> Result<(PathBuf, WorkerBootstrap)> {
        let state = self.state();
        let entry = state
            .sessions
            .get(&session)
            .ok_or_else(|| Error::NotFound(format!("lease session {session} is closed")))?;
        let bootstrap = WorkerBootstrap {
            node_manager_address: self.context.node_manager_address.clone(),
            head_address: self.context.head_address.clone(),
            node_id: self.context.node_id.to_string(),
            worker_id: worker_id.to_string(),
            token: self.context.token.clone(),
            binary_hash: entry.binary_hash.clone(),
            bind_ip: self.context.bind_ip.clone(),
            gpu_ids,
            namespace: entry.namespace.clone(),
            log_dir: self.context.log_dir.to_string_lossy().into_owned(),
        };
        Ok((entry.binary.clone(), bootstrap))
    }

    /// Records how the worker ended once it is gone.
    fn record_exit(self: &Arc<Self>, worker_id: WorkerId, exited: WorkerExited) {
        let manager = Arc::clone(self);
        tokio::spawn(async move {
            let end = exited.await;
            manager.worker_exited(worker_id, end);
        });
    }

    /// Kills the worker if it has not registered within [`REGISTRATION_TIMEOUT`].
    fn kill_if_unregistered(self: &Arc<Self>, worker_id: WorkerId, pid: u32) {
        let manager = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(REGISTRATION_TIMEOUT).await;
            let mut state = manager.state();
            let stuck = matches!(
                state.workers.get(&worker_id),
                Some(Worker {
                    state: WorkerState::Starting { .. },
                    ..
                })
            );
            if stuck {
                tracing::warn!(%worker_id, pid, "worker did not register in time; killing it");
                let reason = format!("did not register within {REGISTRATION_TIMEOUT:?} of its start");
                let end = WorkerEnd::new(WorkerExitKind::StartTimedOut, reason);
                state.exits.insert(worker_id, end);
                drop(state);
                manager.launcher.kill(pid);
            }
        });
    }
}

enum Decision {
    Grant,
    Wait,
    Spill(String),
    Refuse(LeaseRefusalKind, String),
}

/// Applies one bundle operation to the ledger; the pids of workers leased in
/// released bundles go to `ended`.
fn apply_bundle_op(state: &mut LeaseState, op: BundleOperation, ended: &mut Vec<u32>) -> Result<(), BundleError> {
    match op {
        BundleOperation::Reserve { group, bundles, commit } => {
            state.ledger.reserve_bundles(group, &bundles)?;
            let indexes: Vec<u32> = bundles.iter().map(|(index, _)| *index).collect();
            match commit {
                true => state.ledger.commit_bundles(group, &indexes),
                false => Ok(()),
            }
        }
        BundleOperation::Commit { group, indexes } => state.ledger.commit_bundles(group, &indexes),
        BundleOperation::Release { group, indexes } => {
            let workers = state.ledger.release_bundles(group, &indexes);
            let reason = format!("was ended: its placement group {group} was removed");
            for worker in &workers {
                let end = WorkerEnd::new(WorkerExitKind::LeaseRevoked, reason.clone());
                state.exits.insert(*worker, end);
            }
            ended.extend(
                workers
                    .iter()
                    .filter_map(|worker| state.workers.remove(worker).map(|w| w.pid)),
            );
            Ok(())
        }
    }
}

/// What to do with a request now. A request spilled here (no further
/// spillback) runs here when it ever can, unless, while it waits, another
/// node has room first (one that joined, or whose work ended); any other
/// asks the policy, with this node preferred. A request no node fits waits for the head's next
/// view of the cluster before it is refused: nodes may have joined since
/// the last one.
fn decide(state: &mut LeaseState, pending: &PendingLease) -> Decision {
    if !state.sessions.contains_key(&pending.session) {
        return Decision::Refuse(
            LeaseRefusalKind::WorkerStartFailed,
            "the lease session is closed".into(),
        );
    }
    let local = state.local;
    let labels_match = pending
        .scheduling
        .label_selector
        .matches(&state.cluster.node(local).labels);
    let demand = state.cluster.demand(&pending.demand);
    let request = Request {
        demand: &demand,
        scheduling: &pending.scheduling,
        preferred: Some(local),
    };
    if !pending.allow_spillback && labels_match && state.ledger.feasible(&pending.demand) {
        if state.ledger.fits_now(&pending.demand) {
            return Decision::Grant;
        }
        return match state.placer.choose(&state.cluster, &request) {
            Choice::Run(index) if index != local => {
                state.cluster.subtract(index, &demand);
                Decision::Spill(state.cluster.node(index).address.clone())
            }
            _ => Decision::Wait,
        };
    }
    let choice = state.placer.choose(&state.cluster, &request);
    let choice = state
        .launchable
        .await_launch(choice, &pending.demand, &pending.scheduling.label_selector);
    match choice {
        Choice::Run(index) | Choice::Queue(index) if index == local => match state.ledger.fits_now(&pending.demand) {
            true => Decision::Grant,
            false => Decision::Wait,
        },
        Choice::Run(index) | Choice::Queue(index) => {
            state.cluster.subtract(index, &demand);
            Decision::Spill(state.cluster.node(index).address.clone())
        }
        Choice::AwaitLaunch(_) => Decision::Wait,
        Choice::Infeasible(_) if pending.view == state.view => Decision::Wait,
        Choice::Infeasible(reason) => Decision::Refuse(LeaseRefusalKind::Infeasible, reason),
        Choice::Unschedulable(reason) => Decision::Refuse(LeaseRefusalKind::Unschedulable, reason),
    }
}

/// Counts `count` waiting tasks of a shape with the others of that shape.
fn add_waiting(demands: &mut Vec<ResourceDemand>, shape: &ResourceSet, scheduling: &Scheduling, count: u64) {
    let constraint = scheduling.to_string();
    match demands
        .iter_mut()
        .find(|d| d.shape == *shape && d.constraint == constraint)
    {
        Some(demand) => demand.count += count,
        None => demands.push(ResourceDemand {
            shape: shape.clone(),
            constraint,
            count,
            infeasible: false,
            reason: String::new(),
            scheduling: scheduling.clone(),
            group: None,
        }),
    }
}

/// Counts an infeasible refusal with the others of its shape.
fn remember_infeasible(refused: &mut Vec<RefusedDemand>, pending: &PendingLease, reason: &str) {
    let same = refused
        .iter()
        .position(|r| r.demand == pending.demand && r.scheduling == pending.scheduling);
    match same {
        Some(index) => {
            refused[index].count += 1;
            refused[index].last = Instant::now();
        }
        None if refused.len() < MAX_INFEASIBLE_SHAPES => refused.push(RefusedDemand {
            demand: pending.demand.clone(),
            scheduling: pending.scheduling.clone(),
            count: 1,
            reason: reason.to_string(),
            last: Instant::now(),
        }),
        None => {}
    }
}

/// The placement view: this node, with its labels and total, and the
/// others (which the heartbeat reply lists without this one).
fn cluster_of(context: &WorkerContext, total: &ResourceSet, others: Vec<NodeView>) -> (ClusterResources, NodeIndex) {
    let mut cluster = ClusterResources::new();
    let local = cluster.upsert(context.node_id, &context.node_manager_address, &context.labels, total);
    for node in others {
        let index = cluster.upsert(node.node_id, &node.address, &node.labels, &node.total);
        cluster.set_available(index, &node.available);
    }
    (cluster, local)
}

/// Lease requests this process's node manager answered, by how.
static LEASE_REPLIES: std::sync::LazyLock<prometheus::IntCounterVec> = std::sync::LazyLock::new(|| {
    raylet_proto::metrics::counter(
        "raylet_node_lease_replies_total",
        "Lease requests this node answered: granted, refused or spilled back to another node",
        &["outcome"],
    )
});

fn granted(request_id: u64, worker_id: WorkerId, worker: &Worker, address: &str, node: &WorkerContext) -> EventKind {
    LEASE_REPLIES.with_label_values(&["granted"]).inc();
    EventKind::Granted(LeaseGranted {
        request_id,
        worker_id: worker_id.as_bytes().to_vec(),
        worker_address: address.to_string(),
        node_id: node.node_id.as_bytes().to_vec(),
        pid: worker.pid,
        incarnation: node.incarnation.load(Ordering::Acquire),
    })
}

fn refused_event(request_id: u64, kind: LeaseRefusalKind, reason: &str) -> EventKind {
    LEASE_REPLIES.with_label_values(&["refused"]).inc();
    EventKind::Refused(LeaseRefused {
        request_id,
        reason: reason.to_string(),
        kind: kind as i32,
    })
}

fn send_to_session(state: &LeaseState, session: u64, event: EventKind) {
    if let Some(entry) = state.sessions.get(&session) {
        send(&entry.events, event);
    }
}

fn send(events: &EventSender, event: EventKind) {
    let _ = events.send(Ok(LeaseSessionEvent { kind: Some(event) }));
}

#[cfg(test)]
mod tests {
    use raylet_proto::Amount;
    use raylet_proto::resources::CPU;

    use super::*;

    fn cpus(n: u64) -> ResourceSet {
        ResourceSet::new().with(CPU, Amount::whole(n))
    }

    fn node(address: &str, total: u64, available: u64) -> NodeView {
        NodeView {
            node_id: NodeId::random(),
            address: address.into(),
            total: cpus(total),
            available: cpus(available),
            labels: Labels::new(),
        }
    }

    /// A node with `local` CPUs, `used` of them leased, one open session,
    /// and the given other nodes.
    fn state(local: u64, used: u64, others: Vec<NodeView>) -> LeaseState {
        let context = WorkerContext::for_tests();
        let mut ledger = ResourceLedger::new(cpus(local));
        if used > 0 {
            ledger.hold(WorkerId::random(), cpus(used));
        }
        let (mut cluster, local) = cluster_of(&context, ledger.total(), others);
        cluster.set_available(local, &ledger.available());
        let (events, _) = raylet_proto::peer_stream::peer_stream("lease session events", "a test owner");
        let session = Session {
            binary: PathBuf::from("/bin/true"),
            binary_hash: String::new(),
            namespace: String::new(),
            events,
            startup_failures: 0,
        };
        LeaseState {
            ledger,
            cluster,
            local,
            placer: Placer::new(1),
            sessions: HashMap::from([(1, session)]),
            next_session: 2,
            workers: HashMap::new(),
            queue: VecDeque::new(),
            exits: HashMap::new(),
            infeasible: Vec::new(),
            view: 1,
            launchable: LaunchableNodes::default(),
            backlogs: HashMap::new(),
        }
    }

    fn request(demand: u64, allow_spillback: bool) -> PendingLease {
        PendingLease {
            session: 1,
            request_id: 7,
            demand: cpus(demand),
            scheduling: Scheduling::default(),
            allow_spillback,
            retriable: true,
            outlives_session: false,
            view: 0,
        }
    }

    #[tokio::test]
    async fn reported_backlogs_count_as_demand_with_the_queued_requests_until_the_session_ends() {
        let manager = LeaseManager::new(
            WorkerContext::for_tests(),
            cpus(1),
            Duration::ZERO,
            Arc::new(crate::worker_process::ProcessLauncher),
        );
        manager.state().queue.push_back(request(1, true));
        manager.set_backlog(1, cpus(1), Scheduling::default(), 40);
        manager.set_backlog(2, cpus(1), Scheduling::default(), 9);
        manager.set_backlog(2, cpus(4), Scheduling::default(), 3);
        let counts = |manager: &LeaseManager| {
            let mut counts: Vec<(String, u64)> = manager
                .demands()
                .iter()
                .map(|d| (format!("{:?}", d.shape), d.count))
                .collect();
            counts.sort();
            counts
        };
        let (one, four) = (format!("{:?}", cpus(1)), format!("{:?}", cpus(4)));
        assert_eq!(counts(&manager), [(one.clone(), 50), (four.clone(), 3)]);
        manager.set_backlog(1, cpus(1), Scheduling::default(), 0);
        assert_eq!(counts(&manager), [(one, 10), (four, 3)], "a zero backlog clears it");
        manager.close_session(2);
        assert!(
            counts(&manager).iter().all(|(_, count)| *count <= 1),
            "the session's backlogs end with it: {:?}",
            counts(&manager)
        );
    }

    #[test]
    fn a_request_that_fits_is_granted_here() {
        let mut state = state(2, 0, vec![node("b:1", 8, 8)]);
        assert!(matches!(decide(&mut state, &request(1, true)), Decision::Grant));
    }

    #[test]
    fn a_full_node_spills_to_the_least_utilized_node_with_room() {
        let mut state = state(2, 2, vec![node("b:1", 8, 1), node("c:1", 8, 6), node("d:1", 8, 0)]);
        assert!(matches!(decide(&mut state, &request(1, true)), Decision::Spill(a) if a == "c:1"));
    }

    #[test]
    fn spilled_work_counts_against_the_node_it_went_to() {
        let mut state = state(1, 1, vec![node("b:1", 2, 2), node("c:1", 2, 2)]);
        let mut targets: Vec<String> = (0..4)
            .map(|_| match decide(&mut state, &request(1, true)) {
                Decision::Spill(address) => address,
                _ => panic!("the local node is full"),
            })
            .collect();
        targets.sort();
        assert_eq!(targets, ["b:1", "b:1", "c:1", "c:1"]);
    }

    #[test]
    fn a_spilled_request_waits_here_unless_another_node_has_room_now() {
        let mut state = state(2, 2, vec![node("b:1", 8, 0)]);
        assert!(matches!(decide(&mut state, &request(1, false)), Decision::Wait));
        let mut state = self::state(2, 2, vec![node("b:1", 8, 8)]);
        assert!(matches!(decide(&mut state, &request(1, false)), Decision::Spill(a) if a == "b:1"));
    }

    #[test]
    fn a_request_only_another_node_can_ever_fit_goes_there() {
        let mut state = state(2, 0, vec![node("b:1", 16, 0)]);
        assert!(matches!(decide(&mut state, &request(8, true)), Decision::Spill(a) if a == "b:1"));
    }

    #[test]
    fn a_request_no_node_can_ever_fit_is_refused_saying_why() {
        let mut state = state(2, 0, vec![node("b:1", 4, 4)]);
        let Decision::Refuse(LeaseRefusalKind::Infeasible, reason) = decide(&mut state, &request(64, true)) else {
            panic!("an infeasible request must be refused");
        };
        assert!(
            reason.contains("CPU: 64.0") && reason.contains("the most CPU any node has is 4.0"),
            "{reason}"
        );
    }

    #[test]
    fn a_request_only_a_launchable_node_type_fits_waits_for_the_launch_then_goes_there() {
        let mut state = state(2, 0, vec![node("b:1", 4, 4)]);
        state.launchable = LaunchableNodes::new(vec![raylet_placement::LaunchableNode {
            name: "cpu8".into(),
            total: cpus(8),
            labels: Labels::new(),
        }]);
        assert!(matches!(decide(&mut state, &request(8, true)), Decision::Wait));
        assert!(matches!(decide(&mut state, &request(64, true)), Decision::Refuse(..)));

        let joined = vec![node("b:1", 4, 4), node("c:1", 8, 8)];
        let (cluster, local) = cluster_of(&WorkerContext::for_tests(), &cpus(2), joined);
        (state.cluster, state.local) = (cluster, local);
        assert!(matches!(decide(&mut state, &request(8, true)), Decision::Spill(a) if a == "c:1"));
    }

    #[test]
    fn a_request_no_node_fits_waits_for_a_view_newer_than_itself() {
        let mut state = state(2, 0, vec![node("b:1", 4, 4)]);
        let mut pending = request(64, true);
        pending.view = state.view;
        assert!(matches!(decide(&mut state, &pending), Decision::Wait));
    }
}
