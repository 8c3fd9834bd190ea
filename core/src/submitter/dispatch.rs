//! Queued tasks sent to the workers leased for their scheduling class, in
//! the order they were queued (a retry goes first), as many ahead to one
//! worker as `pipelining.rs` allows; the lease requests the tasks left
//! need (at most [`MAX_PENDING_LEASES`] a class, to the node that holds
//! most of the next task's arguments, or its placement group's bundle),
//! cancelled when no task is left; the backlog beyond them reported for the
//! autoscaler. A grant becomes a leased worker that takes tasks at once; a
//! spillback asks the named node, which may not spill again; a refusal
//! fails the class's queued tasks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{
    self, CancelLeaseRequest, LeaseRefusalKind, LeaseRefused, LeaseSessionEvent, ReportBacklog, RequestLease,
    ReturnLease, TaskBatch,
};
use raylet_proto::{NodeId, PlacementGroupId, SchedulingStrategy, WorkerId};
use tokio::time::Instant;

use super::pipelining::RunTimes;
use super::queued_task::QueuedTask;
use super::worker_stream::connect_worker;
use super::{LeasedWorker, PendingRequest, SchedulingClass, Submitter};
use crate::objects::owner::Owner;
use crate::observability::task_events::Placement;
use crate::submitter::group_routes::{GroupRoute, RouteTarget};
use crate::task_error::TaskErrorKind;

/// Lease requests outstanding per scheduling class.
const MAX_PENDING_LEASES: usize = 10;

/// What a class's queue asks of lease requests, after its tasks went to
/// the workers it has.
#[derive(Debug, PartialEq, Eq)]
struct LeasePlan {
    /// Lease requests to send.
    request: usize,
    /// The backlog to report, when it moved enough since the last report.
    report_backlog: Option<usize>,
    /// Whether the requests out are to be cancelled: no task is left.
    cancel_pending: bool,
}

impl LeasePlan {
    /// One request per queued task, up to [`MAX_PENDING_LEASES`] with those
    /// out; the tasks beyond them are the backlog, which work in a
    /// placement group does not report.
    fn for_queue(queued: usize, pending_leases: usize, reported_backlog: usize, in_group: bool) -> Self {
        let wanted = queued.min(MAX_PENDING_LEASES);
        let backlog = queued.saturating_sub(pending_leases.max(wanted));
        LeasePlan {
            request: wanted.saturating_sub(pending_leases),
            report_backlog: (!in_group && backlog_changed(reported_backlog, backlog)).then_some(backlog),
            cancel_pending: wanted == 0 && pending_leases > 0,
        }
    }
}

impl Submitter {
    /// Sends queued tasks of a class to its workers, and asks for more
    /// workers while tasks are left; cancels requests when none are.
    pub(super) fn dispatch(&mut self, class: &SchedulingClass) {
        let Some(shape) = self.shapes.get_mut(class) else {
            return;
        };
        for worker_id in &shape.workers {
            if let Some(worker) = self.workers.get_mut(worker_id).filter(|w| !w.dying) {
                send_ahead(&self.owner, &self.run_times, (*worker_id, worker), &mut shape.queue);
            }
        }
        let in_group = class.group().is_some();
        let plan = LeasePlan::for_queue(
            shape.queue.len(),
            shape.pending_leases,
            shape.reported_backlog,
            in_group,
        );
        if let Some(backlog) = plan.report_backlog {
            shape.reported_backlog = backlog;
        }
        if plan.cancel_pending {
            shape.pending_leases = 0;
        }
        self.follow(class, &plan);
    }

    /// The head said where a placement group's bundles are: the classes
    /// of work in it ask for leases there.
    pub(super) fn on_group_located(&mut self, group: PlacementGroupId, route: GroupRoute) {
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

    /// Sends what `plan` asks: the backlog report, the cancels, the requests.
    fn follow(&mut self, class: &SchedulingClass, plan: &LeasePlan) {
        if let Some(backlog) = plan.report_backlog {
            self.report_backlog(class, backlog);
        }
        if plan.cancel_pending {
            self.cancel_requests_of(class);
        }
        for _ in 0..plan.request {
            match self.lease_target(class) {
                RouteTarget::Node(node) => {
                    let allow_spillback = class.group().is_none();
                    self.request_lease(node, class.clone(), allow_spillback);
                }
                RouteTarget::Later => return,
                RouteTarget::Fail(reason) => {
                    return self.fail_queued(class, TaskErrorKind::Unschedulable, &reason);
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
                self.groups.target(&self.owner.ctx, &self.handle.events, group, bundle)
            }
            SchedulingStrategy::Default => {
                let next = self.shapes.get(shape).and_then(|s| s.queue.front());
                match next.and_then(|task| task.near().cloned()) {
                    Some(node) => RouteTarget::Node(node),
                    None => local(),
                }
            }
            _ => local(),
        }
    }

    /// Asks the node manager at `node` for a worker for `shape`.
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

    /// Cancels the lease requests of `shape` that are out.
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

    /// A node manager answered a lease request.
    pub(super) fn on_lease_event(&mut self, node: Arc<str>, event: LeaseSessionEvent) {
        match event.kind {
            Some(LeaseEvent::Granted(granted)) => self.on_granted(node, granted),
            Some(LeaseEvent::Refused(refused)) => self.on_refused(refused),
            Some(LeaseEvent::Spillback(spillback)) => {
                if let Some(request) = self.take_request(spillback.request_id) {
                    self.request_lease(spillback.node_address.into(), request.shape, false);
                }
            }
            None => {}
        }
    }

    /// A refused request fails its class's queued tasks, except work in a
    /// placement group, which waits for its group to be placed again unless
    /// the worker could not start.
    fn on_refused(&mut self, refused: LeaseRefused) {
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
            return self.groups.relocate(&self.owner.ctx, &self.handle.events, group);
        }
        self.fail_queued(&request.shape, kind, &refused.reason);
    }

    /// Forgets a request; returns it unless it was cancelled.
    pub(super) fn take_request(&mut self, request_id: u64) -> Option<PendingRequest> {
        let request = self.requests.remove(&request_id)?;
        if request.cancelled {
            return None;
        }
        if let Some(shape) = self.shapes.get_mut(&request.shape) {
            shape.pending_leases = shape.pending_leases.saturating_sub(1);
        }
        Some(request)
    }

    /// A granted worker takes the tasks of its class; a grant no request
    /// waits for any more goes back.
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
            self.handle.clone(),
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
}

/// Sends `worker` the tasks at the front of `queue` that may go ahead to it,
/// in one frame.
fn send_ahead(
    owner: &Owner,
    run_times: &RunTimes,
    (worker_id, worker): (WorkerId, &mut LeasedWorker),
    queue: &mut VecDeque<QueuedTask>,
) {
    let mut batch = TaskBatch::default();
    let place = Placement {
        node_id: worker.node_id,
        worker_id: Some(worker_id),
        pid: worker.pid,
    };
    while run_times.may_send(&worker.in_flight, queue.front()) {
        let Some(task) = queue.pop_front() else {
            break;
        };
        owner.task_events.dispatched(task.task_id, task.attempt, &place);
        if task.options().generator {
            let worker_tasks = worker.tasks.clone();
            let sink = Arc::new(move |batch| worker_tasks.send(batch));
            owner.generators.dispatched(task.task_id, sink);
        }
        batch.tasks.push(task.spec(owner));
        worker.in_flight.insert(task.task_id, task);
    }
    if !batch.tasks.is_empty() {
        worker.idle_since = None;
        worker.tasks.send(batch);
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

#[cfg(test)]
mod tests {
    use super::{LeasePlan, MAX_PENDING_LEASES};

    #[test]
    fn each_queued_task_asks_for_a_lease_up_to_the_most_outstanding() {
        assert_eq!(LeasePlan::for_queue(3, 0, 0, false).request, 3);
        assert_eq!(LeasePlan::for_queue(3, 2, 0, false).request, 1, "two are out already");
        assert_eq!(
            LeasePlan::for_queue(3, 5, 0, false).request,
            0,
            "more are out than tasks wait"
        );
        let many = LeasePlan::for_queue(50, 0, 0, false);
        assert_eq!(many.request, MAX_PENDING_LEASES);
        assert!(!many.cancel_pending);
    }

    #[test]
    fn the_tasks_beyond_the_requests_out_are_the_backlog() {
        let plan = LeasePlan::for_queue(50, 4, 0, false);
        assert_eq!(plan.report_backlog, Some(40), "ten requests are or will be out");
        assert_eq!(LeasePlan::for_queue(5, 8, 3, false).report_backlog, Some(0));
        assert_eq!(
            LeasePlan::for_queue(5, 0, 0, false).report_backlog,
            None,
            "none to report"
        );
    }

    #[test]
    fn the_backlog_is_reported_when_it_moved_by_an_eighth() {
        let queued = |backlog: usize| backlog + MAX_PENDING_LEASES;
        assert_eq!(LeasePlan::for_queue(queued(87), 10, 80, false).report_backlog, None);
        assert_eq!(LeasePlan::for_queue(queued(90), 10, 80, false).report_backlog, Some(90));
        assert_eq!(LeasePlan::for_queue(queued(70), 10, 80, false).report_backlog, Some(70));
        assert_eq!(LeasePlan::for_queue(queued(80), 10, 80, false).report_backlog, None);
    }

    #[test]
    fn work_in_a_placement_group_reports_no_backlog() {
        assert_eq!(LeasePlan::for_queue(50, 10, 0, true).report_backlog, None);
    }

    #[test]
    fn the_requests_out_are_cancelled_when_no_task_is_left() {
        let plan = LeasePlan::for_queue(0, 3, 0, false);
        assert_eq!((plan.request, plan.cancel_pending), (0, true));
        assert!(!LeasePlan::for_queue(0, 0, 0, false).cancel_pending, "none to cancel");
        assert!(
            !LeasePlan::for_queue(1, 3, 0, false).cancel_pending,
            "a task still waits"
        );
    }
}
