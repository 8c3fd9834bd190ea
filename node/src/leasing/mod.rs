//! Worker leases: owners ask for a worker with a resource shape and a
//! scheduling strategy; the placement policy over this node and the others
//! the head reported decides: the node grants an idle or new worker when the
//! shape fits here, queues the request until it does, sends it to another
//! node (spillback), or refuses it when no node can ever fit it.
//!
//! One [`LeaseManager`] holds all of it under one lock; each part of its
//! work is a module of its own: the lease sessions, their queue of requests,
//! the placement decision, the worker pool and its workers' lives, the
//! leases held for adoption, the bundles and driver holds on the ledger, the
//! demand reported to the head, and the out-of-memory victims.

mod adoption;
mod bundle_ledger;
mod demand;
mod events;
mod lease_queue;
mod oom_victims;
mod sessions;
mod spillback;
mod worker_lifecycle;
mod worker_pool;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use raylet_placement::{ClusterResources, LaunchableNodes, NodeIndex, Placer};
use raylet_proto::{Labels, NodeId, ResourceSet, Scheduling, WorkerId};

use super::binary_cache::BinaryCache;
use super::ledger::ResourceLedger;
use super::worker_launcher::WorkerLauncher;
use super::worker_process::WorkerEnd;

pub(crate) use events::EventSender;

use demand::RefusedDemand;
use sessions::Session;
use spillback::cluster_of;
use worker_pool::Worker;

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

impl LeaseState {
    /// A node with `total` resources, no sessions, no workers and no view
    /// of the others yet.
    fn new(context: &WorkerContext, total: ResourceSet, placer: Placer) -> Self {
        let (cluster, local) = cluster_of(context, &total, Vec::new());
        LeaseState {
            ledger: ResourceLedger::new(total),
            cluster,
            local,
            placer,
            sessions: HashMap::new(),
            next_session: NO_SESSION + 1,
            workers: HashMap::new(),
            queue: VecDeque::new(),
            exits: HashMap::new(),
            infeasible: Vec::new(),
            view: 0,
            launchable: LaunchableNodes::default(),
            backlogs: HashMap::new(),
        }
    }

    /// Whether `worker_id` is a worker of `session` here.
    fn is_of_session(&self, worker_id: WorkerId, session: u64) -> bool {
        self.workers
            .get(&worker_id)
            .is_some_and(|worker| worker.session == session)
    }
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
        let seed = u64::from_le_bytes(context.node_id.as_bytes()[..8].try_into().expect("ids are 16 bytes"));
        let state = LeaseState::new(&context, total, Placer::new(seed));
        Arc::new(LeaseManager {
            context,
            launcher,
            binaries: BinaryCache::default(),
            adoption_grace,
            state: Mutex::new(state),
        })
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
