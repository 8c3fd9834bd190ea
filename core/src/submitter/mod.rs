//! The task submitter of a process: it resolves arguments, leases workers
//! from node managers per resource shape, pushes tasks to leased workers over
//! one stream each with several in flight, retries tasks whose worker or
//! node died, and returns leases that stay idle. One tokio task owns all of
//! its state.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{
    self, CancelLeaseRequest, CancelTask, LeaseRefusalKind, LeaseSessionEvent, LeaseSessionRequest, ReportBacklog,
    RequestLease, ReturnLease, TaskArg, TaskBatch, TaskKind, WorkerExit, WorkerExitKind, task_arg,
};
use raylet_proto::{
    Backoff, NodeId, ObjectId, PlacementGroupId, ResourceSet, Scheduling, SchedulingStrategy, TaskId, WorkerId,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use self::lineage::{Lineage, TaskObject};
pub(crate) use self::queued_task::{QueuedOptions, TaskTemplate, TemplateCache};
use self::queued_task::{QueuedTask, TaskInputs};
use crate::generator::table::items_in;
use crate::group_routes::{GroupRoute, GroupRoutes, RouteTarget};
use crate::lent_objects::lend_contained;
use crate::links::NodeDeath;
use crate::object_ref::handle::AnyObjectRef;
use crate::owner::Owner;
use crate::pending_gate::PendingPermit;
use crate::task::Arg;
use crate::task_error::{TaskError, TaskErrorKind};
use crate::task_events::{Ending, Placement, TaskIdentity};
use crate::value::{Body, EncodedValue, Outcome, StoredAt};

mod lineage;
mod queued_task;

#[cfg(test)]
mod tests;

/// Most tasks sent ahead to one leased worker.
const PIPELINE_DEPTH: usize = 8;
/// A task is queued behind others on a worker only when those are expected
/// to finish within this long: long tasks must not hold short ones back
/// while other workers could run them.
const PIPELINE_BUDGET: Duration = Duration::from_micros(2_000);
/// Lease requests outstanding per resource shape.
const MAX_PENDING_LEASES: usize = 10;
/// The first pause before a task whose worker ran out of memory runs again.
const OOM_RETRY_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause before a task the out-of-memory monitor ended runs again.
const MAX_OOM_RETRY_BACKOFF: Duration = Duration::from_secs(8);
/// A leased worker with nothing to do is given back after this long.
const LEASE_LINGER: Duration = Duration::from_millis(30);

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

/// What the submitter reacts to.
pub(crate) enum SubmitterEvent {
    Submit(Box<Submission>),
    Cancel {
        object: ObjectId,
        force: bool,
    },
    Lease {
        node: Arc<str>,
        session: u64,
        event: LeaseSessionEvent,
    },
    LeaseSessionClosed {
        node: Arc<str>,
        session: u64,
        reason: String,
    },
    Results {
        worker: WorkerId,
        lease: u64,
        finished: Vec<TaskFinished>,
        logs: Vec<v1::LogLine>,
    },
    WorkerStreamClosed {
        worker: WorkerId,
        lease: u64,
    },
    WorkerDied {
        worker: WorkerId,
        exit: WorkerExit,
    },
    /// The head counts a node incarnation dead.
    NodeDied(NodeDeath),
    /// Run the task that made a lost object again; says why it cannot be.
    Reconstruct {
        object: ObjectId,
        done: oneshot::Sender<Result<(), NotRebuilt>>,
    },
    /// These objects were freed: their tasks need not be kept to rebuild them.
    ForgetLineage(Vec<ObjectId>),
    /// A task whose worker the out-of-memory monitor ended, back after its backoff.
    Retry(Box<QueuedTask>),
    /// The head said where a placement group's bundles are.
    GroupLocated {
        group: PlacementGroupId,
        route: GroupRoute,
    },
    Shutdown(oneshot::Sender<()>),
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
    tasks: mpsc::UnboundedSender<TaskBatch>,
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

struct PendingRequest {
    shape: SchedulingClass,
    node: Arc<str>,
    cancelled: bool,
}

pub(crate) struct Submitter {
    owner: Arc<Owner>,
    run_times: RunTimes,
    events: mpsc::UnboundedSender<SubmitterEvent>,
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
    /// Starts the submitter of `owner`'s tasks, which takes `received`,
    /// sent on `events`.
    pub(crate) fn spawn(
        owner: Arc<Owner>,
        events: mpsc::UnboundedSender<SubmitterEvent>,
        received: mpsc::UnboundedReceiver<SubmitterEvent>,
    ) {
        let submitter = Submitter {
            events,
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
        owner.ctx.runtime.spawn(submitter.run(received));
    }

    async fn run(mut self, mut events: mpsc::UnboundedReceiver<SubmitterEvent>) {
        loop {
            let next_linger = self.next_linger_deadline();
            let event = tokio::select! {
                event = events.recv() => event,
                _ = tokio::time::sleep_until(next_linger) => {
                    self.return_idle_leases();
                    continue;
                }
            };
            match event {
                None => return,
                Some(SubmitterEvent::Shutdown(done)) => {
                    self.sessions.clear();
                    self.workers.clear();
                    let _ = done.send(());
                    return;
                }
                Some(event) => self.handle(event),
            }
        }
    }

    fn handle(&mut self, event: SubmitterEvent) {
        match event {
            SubmitterEvent::Submit(submission) => self.submit(*submission),
            SubmitterEvent::Cancel { object, force } => self.cancel(object, force),
            SubmitterEvent::Lease { node, session, event } => {
                if self.is_current(&node, session) {
                    self.on_lease_event(node, event);
                }
            }
            SubmitterEvent::LeaseSessionClosed { node, session, reason } => {
                if self.is_current(&node, session) {
                    self.close_session(node, reason);
                }
            }
            SubmitterEvent::Results {
                worker,
                lease,
                finished,
                logs,
            } => self.on_results(worker, lease, finished, logs),
            SubmitterEvent::WorkerStreamClosed { worker, lease } => self.on_stream_closed(worker, lease),
            SubmitterEvent::WorkerDied { worker, exit } => self.on_worker_died(worker, &exit),
            SubmitterEvent::NodeDied(death) => self.on_node_died(death),
            SubmitterEvent::Reconstruct { object, done } => {
                let _ = done.send(self.reconstruct(object));
            }
            SubmitterEvent::ForgetLineage(objects) => {
                for object in objects {
                    self.lineage.forget(object);
                }
            }
            SubmitterEvent::Retry(task) => {
                let template = task.template.clone();
                self.shape_mut(&template.class).queue.push_front(*task);
                self.dispatch(&template.class);
            }
            SubmitterEvent::GroupLocated { group, route } => {
                self.groups.located(group, route);
                let in_group: Vec<SchedulingClass> = self
                    .shapes
                    .keys()
                    .filter(|shape| shape.group() == Some(group))
                    .cloned()
                    .collect();
                for shape in in_group {
                    self.dispatch(&shape);
                }
            }
            SubmitterEvent::Shutdown(_) => unreachable!("handled in run"),
        }
    }

    fn submit(&mut self, submission: Submission) {
        if self.cancelled.remove(&submission.task_id.return_object()) {
            return;
        }
        let mut args = Vec::with_capacity(submission.args.len());
        let mut waiting = Vec::new();
        let mut failed = None;
        for arg in &submission.args {
            match resolve_arg(&self.owner, arg) {
                Ok(Some(resolved)) => args.push(resolved),
                Ok(None) => waiting.push(match arg {
                    Arg::Ref(object) => object.id(),
                    Arg::Value { .. } => unreachable!("values are always resolved"),
                }),
                Err(error) => {
                    failed = Some(error);
                    break;
                }
            }
        }
        let identity = TaskIdentity {
            task_id: submission.task_id,
            attempt: 0,
            function: submission.template.options.function,
            kind: TaskKind::NormalTask,
            actor_id: None,
        };
        self.owner.task_events.submitted(identity, !waiting.is_empty());
        if let Some(error) = failed {
            let reason = error.to_string();
            self.owner
                .task_events
                .ended(submission.task_id, 0, Ending::failed(&reason));
            let returns = u64::from(submission.template.options.num_returns);
            let task_id = submission.task_id;
            self.owner
                .fail_all((0..returns).map(|index| task_id.object_at(index)), error);
            return;
        }
        if !waiting.is_empty() {
            self.resubmit_when_ready(submission, waiting);
            return;
        }
        let inputs = TaskInputs {
            lent: lend_contained(&self.owner, &submission.args),
            pinned: pinned_by(submission.args),
            args,
        };
        let job = self.owner.task_events.job();
        let template = submission.template.clone();
        let task = QueuedTask::new(submission.task_id, job, submission.template, inputs, submission.permit);
        self.shape_mut(&template.class).queue.push_back(task);
        self.dispatch(&template.class);
    }

    /// The state of the tasks of `class`, made on first use (without
    /// cloning the class for a shape that exists).
    fn shape_mut(&mut self, class: &SchedulingClass) -> &mut Shape {
        if !self.shapes.contains_key(class) {
            self.shapes.insert(class.clone(), Shape::default());
        }
        self.shapes.get_mut(class).expect("the shape was just made")
    }

    fn resubmit_when_ready(&self, submission: Submission, waiting: Vec<ObjectId>) {
        let store = self.owner.store.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            for id in waiting {
                let _ = store.wait(id, None).await;
            }
            let _ = events.send(SubmitterEvent::Submit(Box::new(submission)));
        });
    }

    /// Sends queued tasks of a shape to its workers, and asks for more
    /// workers while tasks are left; cancels requests when none are.
    fn dispatch(&mut self, shape_key: &SchedulingClass) {
        let Some(shape) = self.shapes.get_mut(shape_key) else {
            return;
        };
        for worker_id in &shape.workers {
            let Some(worker) = self.workers.get_mut(worker_id).filter(|w| !w.dying) else {
                continue;
            };
            let mut batch = TaskBatch::default();
            let place = Placement {
                node_id: worker.node_id,
                worker_id: Some(*worker_id),
                pid: worker.pid,
            };
            while self.run_times.may_send(&worker.in_flight, shape.queue.front()) {
                let Some(task) = shape.queue.pop_front() else {
                    break;
                };
                self.owner.task_events.dispatched(task.task_id, task.attempt, &place);
                if task.options().generator {
                    let worker_tasks = worker.tasks.clone();
                    let sink = Arc::new(move |batch| drop(worker_tasks.send(batch)));
                    self.owner.generators.dispatched(task.task_id, sink);
                }
                batch.tasks.push(task.spec(&self.owner));
                worker.in_flight.insert(task.task_id, task);
            }
            if !batch.tasks.is_empty() {
                worker.idle_since = None;
                let _ = worker.tasks.send(batch);
            }
        }
        let wanted = shape.queue.len().min(MAX_PENDING_LEASES);
        let missing = wanted.saturating_sub(shape.pending_leases);
        let backlog = shape.queue.len().saturating_sub(shape.pending_leases.max(wanted));
        let report = shape_key.group().is_none() && backlog_changed(shape.reported_backlog, backlog);
        if report {
            shape.reported_backlog = backlog;
        }
        let cancel = wanted == 0 && shape.pending_leases > 0;
        if cancel {
            shape.pending_leases = 0;
        }
        if report {
            self.report_backlog(shape_key, backlog);
        }
        if cancel {
            self.cancel_requests_of(shape_key);
        }
        for _ in 0..missing {
            match self.lease_target(shape_key) {
                RouteTarget::Node(node) => {
                    let allow_spillback = shape_key.group().is_none();
                    self.request_lease(node, shape_key.clone(), allow_spillback);
                }
                RouteTarget::Later => return,
                RouteTarget::Fail(reason) => {
                    return self.fail_queued(shape_key, TaskErrorKind::Unschedulable, &reason);
                }
            }
        }
    }

    /// The node manager that holds most of the next task's argument bytes,
    /// else the local one; for work in a placement group the node of its
    /// bundle.
    fn lease_target(&mut self, shape: &SchedulingClass) -> RouteTarget {
        let local = || RouteTarget::Node(self.owner.ctx.node_manager.as_str().into());
        match shape.scheduling.strategy {
            SchedulingStrategy::PlacementGroup { group, bundle } => {
                self.groups.target(&self.owner.ctx, &self.events, group, bundle)
            }
            SchedulingStrategy::Default => {
                let next = self.shapes.get(shape).and_then(|s| s.queue.front());
                match next.and_then(|task| task.near.clone()) {
                    Some(node) => RouteTarget::Node(node),
                    None => local(),
                }
            }
            _ => local(),
        }
    }

    fn request_lease(&mut self, node: Arc<str>, shape: SchedulingClass, allow_spillback: bool) {
        let request_id = self.next_request;
        self.next_request += 1;
        let next = self.shapes.get(&shape).and_then(|s| s.queue.front());
        let request = RequestLease {
            request_id,
            resources: Some(shape.demand.to_proto()),
            allow_spillback,
            strategy: Some(shape.scheduling.to_proto()),
            retriable: next.is_some_and(QueuedTask::can_retry),
            outlives_session: false,
        };
        self.session(&node).send_request(LeaseRequest::Request(request));
        self.shape_mut(&shape).pending_leases += 1;
        self.requests.insert(
            request_id,
            PendingRequest {
                shape,
                node,
                cancelled: false,
            },
        );
    }

    /// Tells the local node manager how many tasks of `shape` wait beyond
    /// the lease requests out, for the autoscaler.
    fn report_backlog(&mut self, shape: &SchedulingClass, backlog: usize) {
        let report = ReportBacklog {
            resources: Some(shape.demand.to_proto()),
            strategy: Some(shape.scheduling.to_proto()),
            backlog: backlog as u64,
        };
        let local: Arc<str> = self.owner.ctx.node_manager.as_str().into();
        self.session(&local).send_request(LeaseRequest::Backlog(report));
    }

    fn cancel_requests_of(&mut self, shape: &SchedulingClass) {
        let ids: Vec<(u64, Arc<str>)> = self
            .requests
            .iter_mut()
            .filter(|(_, r)| r.shape == *shape && !r.cancelled)
            .map(|(id, r)| {
                r.cancelled = true;
                (*id, r.node.clone())
            })
            .collect();
        for (request_id, node) in ids {
            self.session(&node)
                .send_request(LeaseRequest::Cancel(CancelLeaseRequest { request_id }));
        }
    }

    /// The lease session with `node`, opened on first use.
    fn session(&mut self, node: &Arc<str>) -> SessionSender<'_> {
        if !self.watching_nodes {
            self.watching_nodes = true;
            crate::node_watch::spawn(self.owner.ctx.links.head.clone(), self.events.clone());
        }
        if !self.sessions.contains_key(node) {
            let id = self.next_session;
            self.next_session += 1;
            let session = LeaseSession {
                id,
                requests: open_lease_session(&self.owner, self.events.clone(), (node.clone(), id)),
                granted_by: None,
            };
            self.sessions.insert(node.clone(), session);
        }
        SessionSender(&self.sessions[node].requests)
    }

    /// Whether `session` is the open session with `node`.
    fn is_current(&self, node: &Arc<str>, session: u64) -> bool {
        self.sessions.get(node).is_some_and(|open| open.id == session)
    }

    fn on_lease_event(&mut self, node: Arc<str>, event: LeaseSessionEvent) {
        match event.kind {
            Some(LeaseEvent::Granted(granted)) => self.on_granted(node, granted),
            Some(LeaseEvent::Refused(refused)) => {
                let Some(request) = self.take_request(refused.request_id) else {
                    return;
                };
                let kind = match refused.kind() {
                    LeaseRefusalKind::Infeasible => TaskErrorKind::Infeasible,
                    LeaseRefusalKind::Unschedulable => TaskErrorKind::Unschedulable,
                    LeaseRefusalKind::WorkerStartFailed | LeaseRefusalKind::WorkerGone => TaskErrorKind::WorkerCrashed,
                };
                if let Some(group) = request.shape.group()
                    && kind != TaskErrorKind::WorkerCrashed
                {
                    return self.groups.relocate(&self.owner.ctx, &self.events, group);
                }
                self.fail_queued(&request.shape, kind, &refused.reason);
            }
            Some(LeaseEvent::Spillback(spillback)) => {
                if let Some(request) = self.take_request(spillback.request_id) {
                    self.request_lease(spillback.node_address.into(), request.shape, false);
                }
            }
            None => {}
        }
    }

    /// Forgets a request; returns it unless it was cancelled.
    fn take_request(&mut self, request_id: u64) -> Option<PendingRequest> {
        let request = self.requests.remove(&request_id)?;
        if request.cancelled {
            return None;
        }
        if let Some(shape) = self.shapes.get_mut(&request.shape) {
            shape.pending_leases = shape.pending_leases.saturating_sub(1);
        }
        Some(request)
    }

    fn on_granted(&mut self, node: Arc<str>, granted: v1::LeaseGranted) {
        let Ok(worker_id) = WorkerId::from_wire(&granted.worker_id) else {
            return;
        };
        let Some(request) = self.take_request(granted.request_id) else {
            self.session(&node).send_request(LeaseRequest::ReturnLease(ReturnLease {
                worker_id: granted.worker_id,
                worker_failed: false,
            }));
            return;
        };
        let lease = self.next_lease;
        self.next_lease += 1;
        let node_id = NodeId::from_wire(&granted.node_id).ok();
        if let (Some(node_id), Some(session)) = (node_id, self.sessions.get_mut(&node)) {
            session.granted_by = Some((node_id, granted.incarnation));
        }
        let tasks = connect_worker(
            self.owner.clone(),
            self.events.clone(),
            (worker_id, lease),
            granted.worker_address,
        );
        let worker = LeasedWorker {
            lease,
            shape: request.shape.clone(),
            node,
            node_id,
            incarnation: granted.incarnation,
            pid: granted.pid,
            tasks,
            in_flight: HashMap::new(),
            idle_since: Some(Instant::now()),
            dying: false,
        };
        self.workers.insert(worker_id, worker);
        self.shape_mut(&request.shape).workers.push(worker_id);
        self.dispatch(&request.shape);
    }

    fn fail_queued(&mut self, shape: &SchedulingClass, kind: TaskErrorKind, reason: &str) {
        let Some(shape) = self.shapes.get_mut(shape) else {
            return;
        };
        let queued = std::mem::take(&mut shape.queue);
        for task in queued {
            let error = TaskError::new(kind, &task.options().shown_name(), reason);
            record_failure(&self.owner, &task, &error.to_string());
            self.fail_task(&task, error);
        }
    }

    fn close_session(&mut self, node: Arc<str>, reason: String) {
        tracing::warn!(%node, %reason, "lease session closed");
        self.sessions.remove(&node);
        let lost: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| r.node == node)
            .map(|(id, _)| *id)
            .collect();
        let mut shapes = HashSet::new();
        for request_id in lost {
            if let Some(request) = self.take_request(request_id) {
                shapes.insert(request.shape);
            }
        }
        let message = format!("the node manager at {node} is unreachable: {reason}");
        for shape in shapes {
            if let Some(group) = shape.group() {
                self.groups.relocate(&self.owner.ctx, &self.events, group);
            } else if *node == *self.owner.ctx.node_manager {
                self.fail_queued(&shape, TaskErrorKind::WorkerCrashed, &message);
            } else {
                self.dispatch(&shape);
            }
        }
    }

    fn on_results(&mut self, worker_id: WorkerId, lease: u64, results: Vec<TaskFinished>, logs: Vec<v1::LogLine>) {
        let Some(worker) = self.workers.get_mut(&worker_id).filter(|w| w.lease == lease) else {
            return;
        };
        if self.owner.ctx.log_to_driver {
            print_log_lines(worker.pid, worker.node_id, &logs);
        }
        let mut finished = Vec::with_capacity(results.len());
        for result in results {
            if let Some(task) = worker.in_flight.remove(&result.task_id) {
                self.run_times.record(task.options().function, result.run_micros);
                finished.push((task, result.outcome));
            }
        }
        if worker.in_flight.is_empty() {
            worker.idle_since = Some(Instant::now());
        }
        let shape = worker.shape.clone();
        for (task, outcome) in finished {
            self.finish(task, outcome);
        }
        self.dispatch(&shape);
    }

    fn finish(&mut self, task: QueuedTask, outcome: Outcome) {
        if self.cancelled.remove(&task.return_id()) {
            return;
        }
        match outcome {
            Err(error) if task.options().retry_exceptions && error.is_exception() && task.can_retry() => {
                tracing::info!(function = task.options().function, %error, "retrying a task that failed");
                self.requeue(task);
            }
            Err(error) => self.fail_task(&task, error),
            Ok(value) => {
                let objects = match task.options().generator {
                    true => {
                        let yielded = items_in(&value).unwrap_or(0);
                        self.fail_items_not_rebuilt(&task, yielded);
                        1..yielded + 1
                    }
                    false => 0..u64::from(task.options().num_returns),
                };
                let stored = objects
                    .map(|index| (task.task_id.object_at(index), index))
                    .filter(|(id, _)| self.stored_at(*id).is_some())
                    .collect();
                self.lineage.keep(task.done(), stored);
            }
        }
    }

    /// Fails the objects `task` returns, and the items a run of a generator
    /// was making again.
    fn fail_task(&self, task: &QueuedTask, error: TaskError) {
        let items = match task.options().generator {
            true => self.owner.generators.rebuilt(task.task_id),
            false => Vec::new(),
        };
        let rebuilt = items.into_iter().map(|item| task.task_id.object_at(item + 1));
        self.owner.fail_all(task.return_ids().chain(rebuilt), error);
    }

    /// A generator's run that made lost items again is done: an item it
    /// did not make (it yielded only `yielded` items this time) fails.
    fn fail_items_not_rebuilt(&self, task: &QueuedTask, yielded: u64) {
        let missing: Vec<ObjectId> = self
            .owner
            .generators
            .rebuilt(task.task_id)
            .into_iter()
            .filter(|item| *item >= yielded)
            .map(|item| task.task_id.object_at(item + 1))
            .collect();
        if missing.is_empty() {
            return;
        }
        let message = format!("it ran again to make its lost items, and yielded only {yielded} items this time");
        let error = TaskError::new(TaskErrorKind::Application, &task.options().shown_name(), message);
        self.owner.fail_all(missing, error);
    }

    /// Where this process's `object` is stored, if it has it and it is.
    fn stored_at(&self, object: ObjectId) -> Option<StoredAt> {
        match self.owner.store.try_get(object) {
            Ok(Some(Ok(value))) => match value.body {
                Body::Stored(at) => Some(at),
                Body::Inline(_) => None,
            },
            _ => None,
        }
    }

    /// Queues the task that made `object` again, if its retries allow.
    fn reconstruct(&mut self, object: ObjectId) -> Result<(), NotRebuilt> {
        let Some((task, kept)) = self.lineage.take(object) else {
            return match self.owner.store.try_get(object) {
                Ok(None) => Ok(()),
                _ => Err(NotRebuilt::Put),
            };
        };
        if !task.can_retry() {
            return Err(NotRebuilt::RetriesSpent {
                function: task.options().shown_name(),
                runs: task.attempt + 1,
                max_retries: task.options().max_retries,
            });
        }
        let lost = self.lost_with(object, kept);
        for (id, _) in &lost {
            self.owner.store.reset_pending(*id);
        }
        if task.options().generator {
            let items = lost.iter().map(|(_, index)| index - 1).collect();
            self.owner.generators.rebuild(task.task_id, items);
        }
        let template = task.template.clone();
        self.requeue(task);
        self.dispatch(&template.class);
        Ok(())
    }

    /// The objects of `kept` lost with `object`: it, and those stored only
    /// on nodes that held it, which one run makes again together.
    fn lost_with(&self, object: ObjectId, kept: Vec<TaskObject>) -> Vec<TaskObject> {
        let Some(lost_at) = self.stored_at(object) else {
            return kept.into_iter().filter(|(id, _)| *id == object).collect();
        };
        let on_lost_nodes = |at: &StoredAt| at.holders().all(|holder| lost_at.holders().any(|lost| lost == holder));
        kept.into_iter()
            .filter(|(id, _)| *id == object || self.stored_at(*id).is_some_and(|at| on_lost_nodes(&at)))
            .collect()
    }

    fn requeue(&mut self, mut task: QueuedTask) {
        task.attempt += 1;
        self.owner.task_events.submitted(task.identity(), false);
        let template = task.template.clone();
        self.shape_mut(&template.class).queue.push_front(task);
    }

    /// Runs the task again after a pause that doubles with each attempt,
    /// giving the node time to free memory.
    fn requeue_after_backoff(&mut self, mut task: QueuedTask) {
        let delay = Backoff::delay_for_attempt(OOM_RETRY_BACKOFF, MAX_OOM_RETRY_BACKOFF, task.attempt);
        task.attempt += 1;
        self.owner.task_events.submitted(task.identity(), false);
        let events = self.events.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = events.send(SubmitterEvent::Retry(Box::new(task)));
        });
    }

    fn on_stream_closed(&mut self, worker_id: WorkerId, lease: u64) {
        let Some(worker) = self.workers.get_mut(&worker_id).filter(|w| w.lease == lease) else {
            return;
        };
        worker.dying = true;
        let node = worker.node.clone();
        let owner = self.owner.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            let exit = worker_exit(&owner, node, worker_id).await;
            let _ = events.send(SubmitterEvent::WorkerDied {
                worker: worker_id,
                exit,
            });
        });
    }

    fn on_worker_died(&mut self, worker_id: WorkerId, exit: &WorkerExit) {
        let Some(worker) = self.forget_worker(worker_id) else {
            return;
        };
        self.session(&worker.node)
            .send_request(LeaseRequest::ReturnLease(ReturnLease {
                worker_id: worker_id.as_bytes().to_vec(),
                worker_failed: true,
            }));
        self.rerun_or_fail(worker, exit);
    }

    /// Runs again, or fails, what the workers leased on a dead node
    /// incarnation ran; results they send late are ignored, as they are no
    /// longer leased. A session with that node closes unless a newer
    /// incarnation granted through it.
    fn on_node_died(&mut self, death: NodeDeath) {
        let lost: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.node_id == Some(death.node_id) && w.incarnation == death.incarnation)
            .map(|(id, _)| *id)
            .collect();
        let exit = unknown_exit(format!("was lost with its node ({})", death.reason));
        for worker_id in lost {
            if let Some(worker) = self.forget_worker(worker_id) {
                tracing::warn!(node = %death.node_id, pid = worker.pid, "a leased worker's node died");
                self.rerun_or_fail(worker, &exit);
            }
        }
        let address: Arc<str> = death.address.into();
        let with_dead = self.sessions.get(&address).is_some_and(|session| {
            session
                .granted_by
                .is_none_or(|granted_by| granted_by == (death.node_id, death.incarnation))
        });
        if with_dead {
            self.close_session(address, format!("its node died: {}", death.reason));
        }
    }

    fn forget_worker(&mut self, worker_id: WorkerId) -> Option<LeasedWorker> {
        let worker = self.workers.remove(&worker_id)?;
        if let Some(shape) = self.shapes.get_mut(&worker.shape) {
            shape.workers.retain(|id| *id != worker_id);
        }
        Some(worker)
    }

    /// Queues the tasks a dead worker was running again, those that may run
    /// again, and fails the others.
    fn rerun_or_fail(&mut self, worker: LeasedWorker, exit: &WorkerExit) {
        let out_of_memory = exit.kind() == WorkerExitKind::OomKilled;
        let description = exit.description.as_str();
        for task in worker.in_flight.into_values() {
            record_failure(&self.owner, &task, &format!("the worker process {description}"));
            if self.cancelled.remove(&task.return_id()) {
                continue;
            }
            if task.can_retry() {
                tracing::warn!(
                    function = task.options().function,
                    pid = worker.pid,
                    description,
                    "worker died; retrying its task"
                );
                match out_of_memory {
                    true => self.requeue_after_backoff(task),
                    false => self.requeue(task),
                }
                continue;
            }
            let kind = match out_of_memory {
                true => TaskErrorKind::OutOfMemory,
                false => TaskErrorKind::WorkerCrashed,
            };
            let attempts = task.attempt + 1;
            let mut error = TaskError::new(
                kind,
                &task.options().shown_name(),
                format!("the worker process {description} while running the task (ran {attempts} time(s))"),
            );
            error.node_id = worker.node_id;
            error.pid = worker.pid;
            error.attempt = task.attempt;
            self.fail_task(&task, error);
        }
        self.dispatch(&worker.shape);
    }

    fn cancel(&mut self, object: ObjectId, force: bool) {
        let cancelled = || TaskError::new(TaskErrorKind::Cancelled, "", format!("object {object} was cancelled"));
        for shape in self.shapes.values_mut() {
            if let Some(index) = shape.queue.iter().position(|t| t.returns(object)) {
                let task = shape.queue.remove(index).expect("the index was just found");
                record_failure(&self.owner, &task, "cancelled");
                let error = TaskError {
                    function: task.options().shown_name(),
                    ..cancelled()
                };
                self.fail_task(&task, error);
                return;
            }
        }
        let pushed = self.workers.iter().find_map(|(id, w)| {
            let task = w.in_flight.values().find(|t| t.returns(object))?;
            Some((*id, w.node.clone(), w.tasks.clone(), task.task_id, task.return_ids()))
        });
        if let Some((worker_id, node, tasks, task_id, returns)) = pushed {
            let _ = tasks.send(TaskBatch {
                cancel: vec![CancelTask {
                    task_id: task_id.as_bytes().to_vec(),
                }],
                ..TaskBatch::default()
            });
            if force {
                let kill = ReturnLease {
                    worker_id: worker_id.as_bytes().to_vec(),
                    worker_failed: true,
                };
                self.session(&node).send_request(LeaseRequest::ReturnLease(kill));
            }
            if matches!(self.owner.store.try_get(task_id.return_object()), Ok(None)) {
                self.cancelled.insert(task_id.return_object());
                self.owner.fail_all(returns, cancelled());
            }
            return;
        }
        if matches!(self.owner.store.try_get(object), Ok(None)) {
            self.cancelled.insert(object);
            self.owner.store.complete(object, Err(cancelled()));
        }
    }

    fn next_linger_deadline(&self) -> Instant {
        self.workers.values().filter_map(|w| w.idle_since).min().map_or_else(
            || Instant::now() + Duration::from_secs(3600),
            |idle| idle + LEASE_LINGER,
        )
    }

    fn return_idle_leases(&mut self) {
        let now = Instant::now();
        let expired: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.in_flight.is_empty() && w.idle_since.is_some_and(|t| now >= t + LEASE_LINGER))
            .filter(|(_, w)| self.shapes.get(&w.shape).is_none_or(|s| s.queue.is_empty()))
            .map(|(id, _)| *id)
            .collect();
        for worker_id in expired {
            let Some(worker) = self.workers.remove(&worker_id) else {
                continue;
            };
            if let Some(shape) = self.shapes.get_mut(&worker.shape) {
                shape.workers.retain(|id| *id != worker_id);
            }
            self.session(&worker.node)
                .send_request(LeaseRequest::ReturnLease(ReturnLease {
                    worker_id: worker_id.as_bytes().to_vec(),
                    worker_failed: worker.dying,
                }));
        }
    }
}

/// How long each function ran lately, to decide whether queueing a task
/// behind others on one worker is worth it.
#[derive(Default)]
struct RunTimes {
    micros: HashMap<String, f64>,
}

impl RunTimes {
    fn record(&mut self, function: &str, micros: u64) {
        let sample = micros as f64;
        match self.micros.get_mut(function) {
            Some(average) => *average = 0.8 * *average + 0.2 * sample,
            None => {
                self.micros.insert(function.to_string(), sample);
            }
        }
    }

    /// Whether `next` may go to a worker that runs `in_flight`: always when
    /// it is idle; behind others only when all are known to be short.
    fn may_send(&self, in_flight: &HashMap<TaskId, QueuedTask>, next: Option<&QueuedTask>) -> bool {
        if in_flight.is_empty() {
            return true;
        }
        if in_flight.len() >= PIPELINE_DEPTH {
            return false;
        }
        let budget = PIPELINE_BUDGET.as_micros() as f64;
        let expected = |task: &QueuedTask| {
            self.micros
                .get(task.options().function)
                .copied()
                .unwrap_or(f64::INFINITY)
        };
        let queued: f64 = in_flight.values().map(expected).sum();
        queued + next.map_or(0.0, expected) <= budget
    }
}

/// An owned, finished argument: its bytes inline, or where it is stored.
/// A value, or an owned object's value inlined (or where it is stored),
/// or a borrowed reference for the worker to fetch; `None` while an owned
/// object is pending.
pub(crate) fn resolve_arg(owner: &Owner, arg: &Arg) -> Result<Option<TaskArg>, TaskError> {
    let kind = match arg {
        Arg::Value { data, .. } => task_arg::Kind::Value(data.clone()),
        Arg::Ref(object) if owner.owns(object) => match owner.store.try_get(object.id()) {
            Ok(Some(Ok(value))) => owned_arg(object.id(), value),
            Ok(Some(Err(error))) => return Err(error),
            Ok(None) => return Ok(None),
            Err(lost) => {
                return Err(TaskError::new(TaskErrorKind::Argument, "", lost.to_string()));
            }
        },
        Arg::Ref(object) => task_arg::Kind::ObjectRef(object.raw().to_proto()),
    };
    Ok(Some(TaskArg { kind: Some(kind) }))
}

/// The objects a call's arguments refer to: pinned until the call is done.
pub(crate) fn pinned_by(args: Vec<Arg>) -> Vec<AnyObjectRef> {
    args.into_iter()
        .flat_map(|arg| match arg {
            Arg::Value { contained, .. } => contained,
            Arg::Ref(object) => vec![object],
        })
        .collect()
}

fn owned_arg(id: ObjectId, value: EncodedValue) -> task_arg::Kind {
    match value.body {
        Body::Inline(data) => task_arg::Kind::Value(data),
        Body::Stored(at) => task_arg::Kind::Stored(v1::StoredArg {
            object_id: id.as_bytes().to_vec(),
            location: Some(at.to_proto()),
        }),
    }
}

/// A borrowed lease session sender.
struct SessionSender<'a>(&'a mpsc::UnboundedSender<LeaseSessionRequest>);

impl SessionSender<'_> {
    fn send_request(&self, kind: LeaseRequest) {
        let _ = self.0.send(LeaseSessionRequest { kind: Some(kind) });
    }
}

/// Opens lease session `session` with the node manager at `node`; its
/// events flow into the submitter.
fn open_lease_session(
    owner: &Owner,
    events: mpsc::UnboundedSender<SubmitterEvent>,
    (node, session): (Arc<str>, u64),
) -> mpsc::UnboundedSender<LeaseSessionRequest> {
    // At most MAX_PENDING_LEASES requests per shape are outstanding, and
    // one cancel or return per request or lease.
    let (requests, outbound) = mpsc::unbounded_channel();
    let open = LeaseSessionRequest {
        kind: Some(LeaseRequest::Open(owner.ctx.binary.clone())),
    };
    let _ = requests.send(open);
    let opening = owner.ctx.links.nodes.lease_session(node.clone(), outbound);
    tokio::spawn(async move {
        let result: crate::Result<()> = async {
            let mut inbound = opening.await?;
            while let Some(event) = inbound.next().await {
                let _ = events.send(SubmitterEvent::Lease {
                    node: node.clone(),
                    session,
                    event: event?,
                });
            }
            Ok(())
        }
        .await;
        let reason = match result {
            Ok(()) => "the node manager ended the session".to_string(),
            Err(error) => error.to_string(),
        };
        let _ = events.send(SubmitterEvent::LeaseSessionClosed { node, session, reason });
    });
    requests
}

/// Opens the task stream to a leased worker, on a connection of its own: a
/// port may have served an earlier worker, so cached connections are not
/// reused. Tasks sent before it connects wait in the channel, and go in
/// order, those that waited merged into one frame.
fn connect_worker(
    owner: Arc<Owner>,
    events: mpsc::UnboundedSender<SubmitterEvent>,
    (worker, lease): (WorkerId, u64),
    address: String,
) -> mpsc::UnboundedSender<TaskBatch> {
    // At most PIPELINE_DEPTH tasks are sent ahead to a worker.
    let (tasks, mut outbound) = mpsc::unbounded_channel::<TaskBatch>();
    let opening = owner.ctx.links.workers.task_stream(address);
    tokio::spawn(async move {
        let result: crate::Result<()> = async {
            let (outlet, mut inbound) = opening.await?;
            tokio::spawn(async move {
                while let Some(mut batch) = outbound.recv().await {
                    while let Ok(more) = outbound.try_recv() {
                        batch.tasks.extend(more.tasks);
                        batch.cancel.extend(more.cancel);
                    }
                    if outlet.send(&batch).is_err() {
                        return;
                    }
                }
            });
            while let Some(batch) = inbound.next().await {
                let batch = batch?;
                owner.absorb_items(batch.items);
                let finished = complete_values(&owner, batch.results);
                let _ = events.send(SubmitterEvent::Results {
                    worker,
                    lease,
                    finished,
                    logs: batch.logs,
                });
            }
            Ok(())
        }
        .await;
        if let Err(error) = result {
            tracing::debug!(%worker, %error, "worker stream ended");
        }
        let _ = events.send(SubmitterEvent::WorkerStreamClosed { worker, lease });
    });
    tasks
}

/// A task's outcome as its worker reported it.
pub(crate) struct TaskFinished {
    pub(crate) task_id: TaskId,
    pub(crate) outcome: Outcome,
    run_micros: u64,
}

/// Reports that a task's attempt failed without a result from its worker.
fn record_failure(owner: &Owner, task: &QueuedTask, reason: &str) {
    owner
        .task_events
        .ended(task.task_id, task.attempt, Ending::failed(reason));
}

/// Decodes results, reports how each attempt ended, and stores values (all
/// of a task's returns) at once so that a waiting `get` wakes without a
/// detour through the submitter; failures, which may be retried, are left
/// to the submitter.
pub(crate) fn complete_values(owner: &Owner, results: Vec<v1::TaskResult>) -> Vec<TaskFinished> {
    let finished: Vec<TaskFinished> = results
        .into_iter()
        .filter_map(|result| {
            let task_id = TaskId::from_wire(&result.task_id).ok()?;
            let outcome = owner.adopt_outcome(result.outcome.unwrap_or_default());
            if outcome.is_ok() && !result.more_returns.is_empty() {
                let more = result.more_returns.into_iter().map(|more| owner.adopt_outcome(more));
                let more: Vec<(ObjectId, Outcome)> = (1..).map(|index| task_id.object_at(index)).zip(more).collect();
                owner.store.complete_many(more);
            }
            let error = outcome.as_ref().err().map(ToString::to_string);
            let ending = Ending {
                failed: error.as_deref(),
                start_unix_micros: result.start_unix_micros,
                run_micros: result.run_micros,
            };
            owner.task_events.ended(task_id, result.attempt, ending);
            owner.task_events.spans(result.spans);
            crate::metrics::absorb(result.metrics);
            Some(TaskFinished {
                task_id,
                outcome,
                run_micros: result.run_micros,
            })
        })
        .collect();
    let values = finished
        .iter()
        .filter_map(|f| Some((f.task_id.return_object(), Ok(f.outcome.as_ref().ok()?.clone()))));
    owner.store.complete_many(values);
    finished
}

/// How a worker exited, as its node manager saw it.
async fn worker_exit(owner: &Owner, node: Arc<str>, worker: WorkerId) -> WorkerExit {
    match owner.ctx.links.nodes.worker_exit(node, worker).await {
        Ok(exit) if exit.exited => exit,
        Ok(_) => unknown_exit("stopped answering".into()),
        Err(error) => unknown_exit(format!("was lost with its node ({error})")),
    }
}

/// An end of a worker that its node manager cannot tell.
fn unknown_exit(description: String) -> WorkerExit {
    WorkerExit {
        exited: true,
        description,
        kind: WorkerExitKind::Unspecified.into(),
    }
}

/// Prints a worker's output lines, each prefixed with the function that
/// printed it, the worker's pid and its node.
pub(crate) fn print_log_lines(pid: u32, node_id: Option<NodeId>, logs: &[v1::LogLine]) {
    let node = node_id.map(|id| id.short()).unwrap_or_default();
    for log in logs {
        let function = log.function.rsplit("::").next().unwrap_or(&log.function);
        let line = format!("({function} pid={pid} node={node}) {}", log.line);
        if log.stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
}

/// Whether a shape's backlog moved enough to report: to or from zero, or
/// by an eighth of what was last reported, so that a queue growing or
/// draining by one task at a time sends a few reports, not one per task.
fn backlog_changed(reported: usize, backlog: usize) -> bool {
    match (reported, backlog) {
        (a, b) if a == b => false,
        (0, _) | (_, 0) => true,
        (a, b) => a.abs_diff(b) * 8 >= a,
    }
}
