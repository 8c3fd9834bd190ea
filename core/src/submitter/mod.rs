//! The task submitter of a process: it resolves arguments, leases workers
//! from node managers per resource shape, pushes tasks to leased workers over
//! one stream each with several in flight, retries tasks whose worker or
//! node died, and returns leases that stay idle. One tokio task owns all of
//! its state and reacts to one [`SubmitterEvent`] at a time; a caller's
//! submission and a worker's results are handled at once on the thread
//! they come from, under the same lock (`handle.rs`).
//!
//! Its parts, each an `impl Submitter` over that state:
//! - `events.rs`: the events and the loop that takes them;
//! - `handle.rs`: how the process reaches the submitter, by event or at once;
//! - `submission.rs`: a submitted task's arguments resolved, then queued;
//! - `dispatch.rs`: queued tasks sent to the leased workers of their
//!   class, in order, and the lease requests (and backlog) the rest need;
//!   `pipelining.rs` decides how many go ahead to one worker;
//! - `leases.rs`: lease sessions with node managers: grants, refusals,
//!   spillback, and idle leases given back;
//! - `worker_stream.rs`: the task stream to a leased worker;
//! - `retries.rs`: what a finished attempt does: its value kept, its
//!   failure run again or made final;
//! - `worker_deaths.rs`: the tasks of a worker or node that died run again
//!   or fail;
//! - `lineage.rs` and `reconstruction.rs`: the tasks kept to make lost
//!   objects again, and that run;
//! - `cancellation.rs`: a queued task dropped, a running one stopped.
//!
//! What it works with, beside it: `task.rs` (a call's options and
//! arguments, as the user makes them) and `resources.rs` (the resources a
//! call asks for), `pending_gate.rs` (the bound on pending tasks that
//! holds back submission), `group_routes.rs` (where the lease requests of
//! work in a placement group go) and `node_watch.rs` (node deaths, from the
//! head).
//!
//! Node managers and workers are reached through `crate::links`, which unit
//! tests replace with a virtual cluster (`tests/`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use raylet_proto::v1::LeaseSessionRequest;
use raylet_proto::{NodeId, ObjectId, PlacementGroupId, ResourceSet, Scheduling, SchedulingStrategy, TaskId, WorkerId};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub(crate) use self::events::SubmitterEvent;
pub(crate) use self::handle::{SubmitterHandle, SubmitterInbox, submitter_channel};
use self::lineage::Lineage;
use self::pipelining::RunTimes;
use self::queued_task::QueuedTask;
pub(crate) use self::queued_task::{QueuedOptions, TaskTemplate, TemplateCache};
pub(crate) use self::submission::{pinned_by, resolve_arg};
use self::worker_stream::WorkerOutbox;
pub(crate) use self::worker_stream::{complete_values, print_log_lines};
use crate::objects::owner::Owner;
use crate::submitter::group_routes::GroupRoutes;
use crate::submitter::pending_gate::PendingPermit;
use crate::submitter::task::Arg;

mod cancellation;
mod dispatch;
mod events;
pub(crate) mod group_routes;
mod handle;
mod leases;
mod lineage;
mod node_watch;
pub(crate) mod pending_gate;
mod pipelining;
mod queued_task;
mod reconstruction;
pub(crate) mod resources;
mod retries;
mod submission;
pub(crate) mod task;
mod worker_deaths;
mod worker_stream;

#[cfg(test)]
mod tests;

/// A task as the caller submitted it.
pub(crate) struct Submission {
    pub(crate) task_id: TaskId,
    pub(crate) template: Arc<TaskTemplate>,
    pub(crate) args: Vec<Arg>,
    /// Its place among the process's pending tasks, until it is done.
    pub(crate) permit: PendingPermit,
}

/// Why a lost object cannot be made again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotRebuilt {
    #[error("it was stored with put, and put objects cannot be rebuilt")]
    Put,
    #[error("its task {function} cannot run again: it ran {runs} time(s) and max_retries is {max_retries}")]
    RetriesSpent {
        function: String,
        runs: u32,
        max_retries: u32,
    },
    #[error("this process is shutting down")]
    ShuttingDown,
}

/// What decides where a task may run: its resources and its scheduling.
/// Tasks of one class share leased workers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SchedulingClass {
    pub(crate) demand: ResourceSet,
    pub(crate) scheduling: Scheduling,
}

impl SchedulingClass {
    /// The placement group the work runs in, if any.
    fn group(&self) -> Option<PlacementGroupId> {
        match self.scheduling.strategy {
            SchedulingStrategy::PlacementGroup { group, .. } => Some(group),
            _ => None,
        }
    }
}

/// The tasks of one resource shape and the workers leased for them.
#[derive(Default)]
struct Shape {
    queue: VecDeque<QueuedTask>,
    pending_leases: usize,
    workers: Vec<WorkerId>,
    /// The backlog last reported to the local node manager.
    reported_backlog: usize,
}

/// A worker leased for the tasks of one class, and the tasks sent to it.
struct LeasedWorker {
    /// Tells this lease of the worker from earlier ones: events of an
    /// earlier lease's stream must not touch this one.
    lease: u64,
    shape: SchedulingClass,
    node: Arc<str>,
    node_id: Option<NodeId>,
    /// The node's incarnation when it granted the lease: the worker dies with it.
    incarnation: u64,
    pid: u32,
    tasks: WorkerOutbox,
    in_flight: HashMap<TaskId, QueuedTask>,
    idle_since: Option<Instant>,
    dying: bool,
}

/// A lease session with one node manager.
struct LeaseSession {
    /// Tells this session from earlier ones with the same node manager:
    /// their late events are ignored.
    id: u64,
    requests: mpsc::UnboundedSender<LeaseSessionRequest>,
    /// The node incarnation that last granted a lease through it.
    granted_by: Option<(NodeId, u64)>,
}

/// A lease request sent and not yet answered.
struct PendingRequest {
    shape: SchedulingClass,
    node: Arc<str>,
    cancelled: bool,
}

/// The state of a process's task submission, owned by one tokio task.
pub(crate) struct Submitter {
    owner: Arc<Owner>,
    run_times: RunTimes,
    /// Its own way in: the loop's channel for its parts' events, and the
    /// handle the readers of worker streams take results in through.
    handle: SubmitterHandle,
    /// When the loop wakes next to give back idle leases.
    armed_linger: Instant,
    shapes: HashMap<SchedulingClass, Shape>,
    workers: HashMap<WorkerId, LeasedWorker>,
    sessions: HashMap<Arc<str>, LeaseSession>,
    next_session: u64,
    /// Whether node deaths are watched: from the first lease session on.
    watching_nodes: bool,
    requests: HashMap<u64, PendingRequest>,
    next_request: u64,
    next_lease: u64,
    cancelled: HashSet<ObjectId>,
    /// The tasks that made objects now in a node's store, to run again if
    /// that node dies.
    lineage: Lineage,
    groups: GroupRoutes,
}

impl Submitter {
    /// Starts the submitter of `owner`'s tasks, which takes the events of
    /// `inbox`.
    pub(crate) fn spawn(owner: Arc<Owner>, inbox: SubmitterInbox) {
        let submitter = Submitter {
            handle: inbox.handle.clone(),
            armed_linger: Instant::now(),
            owner: owner.clone(),
            run_times: RunTimes::default(),
            shapes: HashMap::new(),
            workers: HashMap::new(),
            sessions: HashMap::new(),
            next_session: 1,
            watching_nodes: false,
            requests: HashMap::new(),
            next_request: 1,
            next_lease: 1,
            cancelled: HashSet::new(),
            lineage: Lineage::default(),
            groups: GroupRoutes::default(),
        };
        *inbox.state.lock() = Some(submitter);
        owner.ctx.runtime.spawn(events::run(inbox));
    }

    /// The state of the tasks of `class`, made on first use (without
    /// cloning the class for a shape that exists).
    fn shape_mut(&mut self, class: &SchedulingClass) -> &mut Shape {
        if !self.shapes.contains_key(class) {
            self.shapes.insert(class.clone(), Shape::default());
        }
        self.shapes.get_mut(class).expect("the shape was just made")
    }
}
