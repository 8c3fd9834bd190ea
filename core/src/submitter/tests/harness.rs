//! A deterministic harness for the submitter, after DataFusion Ballista's
//! `SchedulerTest` with virtual executors: a core whose links are virtual
//! node managers, head and workers that the test answers by hand, on a
//! single-threaded runtime whose clock is paused and moves only when every
//! task is idle. No process is started and no socket is opened.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use raylet_proto::auth::AuthToken;
use raylet_proto::task_stream::StreamClosed;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{
    self, LeaseGranted, LeaseSessionEvent, LeaseSessionRequest, TaskBatch, TaskSpec, WorkerBinary, WorkerEvents,
    WorkerExit, WorkerExitKind,
};
use raylet_proto::{JobId, NodeId, ObjectId, TaskId, WorkerId};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::super::{NotRebuilt, SchedulingClass, Submission, Submitter, SubmitterEvent, TaskTemplate};
use crate::core_worker::{CoreSettings, CoreWorker};
use crate::links::{Incoming, Links, NodeDeath, NodeManagerLink, Reply, TaskOutlet, WorkerLink};
use crate::pending_gate::PendingGate;
use crate::submitter::QueuedOptions;
use crate::task::TaskOptions;
use crate::task_events::Placement;
use crate::value::{Body, EncodedValue, Format, Outcome, StoredAt, outcome_to_proto};

/// The node manager of the process under test.
pub(super) const LOCAL_NODE: &str = "node-local:7000";
/// How far the clock moves each time the test lets the submitter run.
const SETTLE_STEP: Duration = Duration::from_millis(1);

/// What the submitter opened through the virtual links.
enum Opened {
    Session {
        node: Arc<str>,
        requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
        events: mpsc::UnboundedSender<crate::Result<LeaseSessionEvent>>,
    },
    Stream {
        address: String,
        batches: mpsc::UnboundedReceiver<TaskBatch>,
        events: mpsc::UnboundedSender<crate::Result<WorkerEvents>>,
    },
}

/// Node managers, head and workers that exist only as channels to the test.
struct VirtualLinks {
    opened: mpsc::UnboundedSender<Opened>,
    exits: Arc<Mutex<HashMap<WorkerId, WorkerExit>>>,
    deaths: Mutex<Option<mpsc::UnboundedReceiver<NodeDeath>>>,
}

impl NodeManagerLink for VirtualLinks {
    fn lease_session(
        &self,
        node: Arc<str>,
        requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
    ) -> Reply<Incoming<LeaseSessionEvent>> {
        let (events, incoming) = mpsc::unbounded_channel();
        let _ = self.opened.send(Opened::Session { node, requests, events });
        Box::pin(async move { Ok(UnboundedReceiverStream::new(incoming).boxed()) })
    }

    fn worker_exit(&self, _node: Arc<str>, worker: WorkerId) -> Reply<WorkerExit> {
        let exit = self.exits.lock().unwrap().get(&worker).cloned();
        Box::pin(
            async move { exit.ok_or_else(|| crate::Error::Cluster(raylet_proto::Error::NotFound(worker.to_string()))) },
        )
    }

    fn node_deaths(&self) -> Reply<Incoming<NodeDeath>> {
        let deaths = self.deaths.lock().unwrap().take();
        Box::pin(async move {
            let deaths = deaths.ok_or_else(|| {
                crate::Error::Cluster(raylet_proto::Error::Unavailable(
                    "the virtual head has one watch".into(),
                ))
            })?;
            Ok(UnboundedReceiverStream::new(deaths).map(Ok).boxed())
        })
    }
}

impl WorkerLink for VirtualLinks {
    fn task_stream(&self, address: String) -> Reply<(Box<dyn TaskOutlet>, Incoming<WorkerEvents>)> {
        let (outlet, batches) = mpsc::unbounded_channel();
        let (events, incoming) = mpsc::unbounded_channel();
        let _ = self.opened.send(Opened::Stream {
            address,
            batches,
            events,
        });
        Box::pin(async move {
            let outlet: Box<dyn TaskOutlet> = Box::new(outlet);
            Ok((outlet, UnboundedReceiverStream::new(incoming).boxed()))
        })
    }
}

impl TaskOutlet for mpsc::UnboundedSender<TaskBatch> {
    fn send(&self, batch: &TaskBatch) -> Result<(), StreamClosed> {
        mpsc::UnboundedSender::send(self, batch.clone()).map_err(|_| StreamClosed)
    }
}

/// A node manager's end of a lease session.
struct VirtualSession {
    requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
    events: mpsc::UnboundedSender<crate::Result<LeaseSessionEvent>>,
}

/// A worker's end of a task stream.
struct VirtualWorker {
    batches: mpsc::UnboundedReceiver<TaskBatch>,
    events: mpsc::UnboundedSender<crate::Result<WorkerEvents>>,
}

/// A leased worker as the test sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Leased {
    pub(super) worker: WorkerId,
    pub(super) node_id: NodeId,
}

/// A submitter with virtual node managers and workers.
pub(super) struct SubmitterTest {
    core: Arc<CoreWorker>,
    opened: mpsc::UnboundedReceiver<Opened>,
    sessions: HashMap<String, VirtualSession>,
    /// Task streams by worker address.
    streams: HashMap<String, VirtualWorker>,
    exits: Arc<Mutex<HashMap<WorkerId, WorkerExit>>>,
    deaths: mpsc::UnboundedSender<NodeDeath>,
    gate: Arc<PendingGate>,
    /// Each node's id, as its grants say.
    node_ids: HashMap<String, NodeId>,
}

impl SubmitterTest {
    /// Starts a core and its submitter on the current (paused) runtime.
    pub(super) fn start() -> Self {
        let (opened_sender, opened) = mpsc::unbounded_channel();
        let (deaths, deaths_receiver) = mpsc::unbounded_channel();
        let exits = Arc::new(Mutex::new(HashMap::new()));
        let links = Arc::new(VirtualLinks {
            opened: opened_sender,
            exits: exits.clone(),
            deaths: Mutex::new(Some(deaths_receiver)),
        });
        let (submitter, submissions) = mpsc::unbounded_channel();
        let settings = CoreSettings {
            address: "owner-under-test:1".into(),
            token: AuthToken::generate(),
            head_address: "head:1".into(),
            node_manager: LOCAL_NODE.into(),
            binary: WorkerBinary::default(),
            log_to_driver: false,
            blocked_hook: None,
            owning_hook: None,
            store_full_timeout: Duration::from_secs(1),
            job: JobId::random(),
            task_events: false,
            place: Placement {
                node_id: None,
                worker_id: None,
                pid: std::process::id(),
            },
            links: Some(Links {
                nodes: links.clone(),
                workers: links,
            }),
        };
        let core = CoreWorker::start(settings, submitter, tokio::runtime::Handle::current());
        Submitter::spawn(core.clone(), submissions);
        SubmitterTest {
            core,
            opened,
            sessions: HashMap::new(),
            streams: HashMap::new(),
            exits,
            deaths,
            gate: PendingGate::new(1_000),
            node_ids: HashMap::new(),
        }
    }

    /// Submits a task without arguments; returns the object of its result.
    pub(super) fn submit(&self, options: TaskOptions) -> ObjectId {
        let class = SchedulingClass {
            demand: options.demand().expect("valid resources"),
            scheduling: options.scheduling.to_scheduling().expect("valid scheduling"),
        };
        let template = Arc::new(TaskTemplate {
            options: QueuedOptions::new(options),
            class,
        });
        let task_id = TaskId::random();
        self.core.store.add_pending(task_id.return_object());
        let submission = Submission {
            task_id,
            template,
            args: Vec::new(),
            permit: self.gate.admit(),
        };
        self.send(SubmitterEvent::Submit(Box::new(submission)));
        task_id.return_object()
    }

    pub(super) fn cancel(&self, object: ObjectId, force: bool) {
        self.send(SubmitterEvent::Cancel { object, force });
    }

    /// Asks the submitter to run the task that made `object` again.
    pub(super) async fn reconstruct(&mut self, object: ObjectId) -> Result<(), NotRebuilt> {
        let (done, answer) = oneshot::channel();
        self.send(SubmitterEvent::Reconstruct { object, done });
        self.settle().await;
        answer.await.expect("the submitter answers")
    }

    fn send(&self, event: SubmitterEvent) {
        self.core.submitter.send(event).expect("the submitter runs");
    }

    /// Lets every task run until all wait, moving the clock by a
    /// millisecond; collects the sessions and streams opened meanwhile.
    pub(super) async fn settle(&mut self) {
        tokio::time::sleep(SETTLE_STEP).await;
        while let Ok(opened) = self.opened.try_recv() {
            match opened {
                Opened::Session { node, requests, events } => {
                    self.sessions
                        .insert(node.to_string(), VirtualSession { requests, events });
                }
                Opened::Stream {
                    address,
                    batches,
                    events,
                } => {
                    self.streams.insert(address, VirtualWorker { batches, events });
                }
            }
        }
    }

    /// Moves the clock by `duration`, letting everything due run.
    pub(super) async fn advance(&mut self, duration: Duration) {
        tokio::time::sleep(duration.saturating_sub(SETTLE_STEP)).await;
        self.settle().await;
    }

    /// What the submitter asked of the node manager at `node` since last
    /// asked; the session's opening is left out.
    pub(super) fn requests(&mut self, node: &str) -> Vec<LeaseRequest> {
        let Some(session) = self.sessions.get_mut(node) else {
            return Vec::new();
        };
        let mut requests = Vec::new();
        while let Ok(request) = session.requests.try_recv() {
            match request.kind {
                Some(LeaseRequest::Open(_)) | None => {}
                Some(kind) => requests.push(kind),
            }
        }
        requests
    }

    /// The ids of the lease requests among `requests`.
    pub(super) fn lease_request_ids(requests: &[LeaseRequest]) -> Vec<u64> {
        requests
            .iter()
            .filter_map(|r| match r {
                LeaseRequest::Request(request) => Some(request.request_id),
                _ => None,
            })
            .collect()
    }

    /// Grants lease request `request_id` at `node` with a new worker.
    pub(super) fn grant(&mut self, node: &str, request_id: u64) -> Leased {
        let worker = WorkerId::random();
        let node_id = *self.node_ids.entry(node.to_string()).or_insert_with(NodeId::random);
        let granted = LeaseGranted {
            request_id,
            worker_id: worker.as_bytes().to_vec(),
            worker_address: worker_address(worker),
            node_id: node_id.as_bytes().to_vec(),
            pid: 4242,
            incarnation: 1,
        };
        self.lease_event(node, LeaseEvent::Granted(granted));
        Leased { worker, node_id }
    }

    /// Sends a lease session event from the node manager at `node`.
    pub(super) fn lease_event(&self, node: &str, event: LeaseEvent) {
        let session = self
            .sessions
            .get(node)
            .expect("the submitter opened a session with the node");
        let _ = session.events.send(Ok(LeaseSessionEvent { kind: Some(event) }));
    }

    /// The tasks sent to `worker` since last asked, and the ids of the
    /// tasks it was told to cancel.
    pub(super) fn received(&mut self, worker: &Leased) -> (Vec<TaskSpec>, Vec<TaskId>) {
        let (mut tasks, mut cancels) = (Vec::new(), Vec::new());
        if let Some(stream) = self.streams.get_mut(&worker_address(worker.worker)) {
            while let Ok(batch) = stream.batches.try_recv() {
                tasks.extend(batch.tasks);
                cancels.extend(batch.cancel.iter().map(|c| TaskId::from_wire(&c.task_id).unwrap()));
            }
        }
        (tasks, cancels)
    }

    /// The tasks sent to `worker` since last asked.
    pub(super) fn tasks(&mut self, worker: &Leased) -> Vec<TaskSpec> {
        self.received(worker).0
    }

    /// `worker` answers `task` with `outcome`.
    pub(super) fn answer(&self, worker: &Leased, task: &TaskSpec, outcome: Outcome) {
        let result = v1::TaskResult {
            task_id: task.task_id.clone(),
            outcome: Some(outcome_to_proto(&outcome, false)),
            attempt: task.attempt,
            run_micros: 100,
            ..v1::TaskResult::default()
        };
        let stream = &self.streams[&worker_address(worker.worker)];
        let _ = stream.events.send(Ok(WorkerEvents {
            results: vec![result],
            ..WorkerEvents::default()
        }));
    }

    /// `worker`'s process ends as `kind` says: its task stream breaks, and
    /// its node manager tells how it exited.
    pub(super) fn kill(&mut self, worker: &Leased, kind: WorkerExitKind) {
        let exit = WorkerExit {
            exited: true,
            description: format!("ended ({kind:?})"),
            kind: kind.into(),
        };
        self.exits.lock().unwrap().insert(worker.worker, exit);
        self.streams.remove(&worker_address(worker.worker));
    }

    /// The head counts the node at `node` (incarnation 1) dead.
    pub(super) fn node_died(&self, node: &str) {
        let _ = self.deaths.send(NodeDeath {
            node_id: self.node_ids[node],
            incarnation: 1,
            address: node.to_string(),
            reason: "its heartbeats stopped".into(),
        });
    }

    /// The object's outcome, `None` while it is pending.
    pub(super) fn outcome(&self, object: ObjectId) -> Option<Outcome> {
        self.core.store.try_get(object).expect("the object is tracked")
    }

    /// How many tasks the process counts as pending.
    pub(super) fn pending(&self) -> usize {
        self.gate.pending()
    }
}

fn worker_address(worker: WorkerId) -> String {
    format!("worker-{worker}:9000")
}

/// A small value a task returns.
pub(super) fn value(number: u64) -> Outcome {
    Ok(EncodedValue::encode(&number).expect("a number encodes"))
}

/// A value a task put in the store of the node manager at `node`.
pub(super) fn stored_value(node: &str) -> Outcome {
    Ok(EncodedValue::new::<Vec<u8>>(
        Format::Postcard,
        Body::Stored(StoredAt::new(node, 4 << 20)),
        Vec::new(),
    ))
}

/// The number a finished object holds.
pub(super) fn number(outcome: Option<Outcome>) -> u64 {
    let value = outcome.expect("the object is ready").expect("the task succeeded");
    match value.body {
        Body::Inline(bytes) => raylet_proto::codec::decode(&bytes).expect("a number"),
        Body::Stored(_) => panic!("the value is stored"),
    }
}
