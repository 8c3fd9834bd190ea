//! An in-process virtual cluster for unit tests, after DataFusion
//! Ballista's `SchedulerTest` with virtual executors: a core whose links
//! are virtual node managers, head and workers that the test answers by
//! hand, on a single-threaded runtime whose clock is paused and moves only
//! when every task waits. No process is started and no socket is opened.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use raylet_common::auth::AuthToken;
use raylet_proto::task_stream::StreamClosed;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{
    self, ActorRecord, ActorWatchEvent, LeaseGranted, LeaseSessionEvent, LeaseSessionRequest, TaskBatch, TaskSpec,
    WatchActorRequest, WorkerBinary, WorkerEvents, WorkerExit, WorkerExitKind,
};
use raylet_proto::{ActorId, JobId, NodeId, ObjectId, TaskId, WorkerId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{EventHandler, HeadLink, Incoming, Links, NodeDeath, NodeManagerLink, Reply, TaskOutlet, WorkerLink};
use crate::core_worker::{CoreSettings, CoreWorker};
use crate::observability::task_events::Placement;
use crate::submitter::{Submitter, SubmitterEvent};
use crate::value::{Body, EncodedValue, Format, Outcome, StoredAt, outcome_to_proto};

/// The node manager of the process under test.
pub(crate) const LOCAL_NODE: &str = "node-local:7000";
/// How far the clock moves each time the test lets the core run.
const SETTLE_STEP: Duration = Duration::from_millis(1);

type Sender<T> = mpsc::UnboundedSender<crate::Result<T>>;

/// What the core opened through the virtual links.
enum Opened {
    Session {
        node: Arc<str>,
        requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
        events: Sender<LeaseSessionEvent>,
    },
    Stream {
        address: String,
        batches: mpsc::UnboundedReceiver<TaskBatch>,
        events: Sender<WorkerEvents>,
    },
    ActorWatch {
        requests: mpsc::UnboundedReceiver<WatchActorRequest>,
        events: Sender<ActorWatchEvent>,
    },
}

/// Node managers, head and workers that exist only as channels to the test.
struct VirtualLinks {
    opened: mpsc::UnboundedSender<Opened>,
    exits: Arc<Mutex<HashMap<WorkerId, WorkerExit>>>,
    deaths: Mutex<Option<mpsc::UnboundedReceiver<NodeDeath>>>,
}

/// A stream whose other end the test holds.
fn test_held<T: Send + 'static>() -> (Sender<T>, Incoming<T>) {
    let (events, incoming) = mpsc::unbounded_channel();
    (events, UnboundedReceiverStream::new(incoming).boxed())
}

impl NodeManagerLink for VirtualLinks {
    fn lease_session(
        &self,
        node: Arc<str>,
        requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
    ) -> Reply<Incoming<LeaseSessionEvent>> {
        let (events, incoming) = test_held();
        let _ = self.opened.send(Opened::Session { node, requests, events });
        Box::pin(async move { Ok(incoming) })
    }

    fn worker_exit(&self, _node: Arc<str>, worker: WorkerId) -> Reply<WorkerExit> {
        let exit = self.exits.lock().unwrap().get(&worker).cloned();
        let unknown = move || crate::Error::Cluster(raylet_proto::Error::NotFound(worker.to_string()));
        Box::pin(async move { exit.ok_or_else(unknown) })
    }
}

impl HeadLink for VirtualLinks {
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

    fn watch_actors(&self, requests: mpsc::UnboundedReceiver<WatchActorRequest>) -> Reply<Incoming<ActorWatchEvent>> {
        let (events, incoming) = test_held();
        let _ = self.opened.send(Opened::ActorWatch { requests, events });
        Box::pin(async move { Ok(incoming) })
    }
}

impl WorkerLink for VirtualLinks {
    fn task_stream(&self, address: String, mut handler: EventHandler) -> Reply<Box<dyn TaskOutlet>> {
        let (outlet, batches) = mpsc::unbounded_channel();
        let (events, mut incoming) = test_held();
        let _ = self.opened.send(Opened::Stream {
            address,
            batches,
            events,
        });
        tokio::spawn(async move {
            while let Some(event) = incoming.next().await {
                match event {
                    Ok(events) => handler(Ok(Some(events))),
                    Err(error) => return handler(Err(raylet_proto::Error::Unavailable(error.to_string()))),
                }
            }
            handler(Ok(None));
        });
        Box::pin(async move {
            let outlet: Box<dyn TaskOutlet> = Box::new(outlet);
            Ok(outlet)
        })
    }
}

impl TaskOutlet for mpsc::UnboundedSender<TaskBatch> {
    fn send(&self, batch: &TaskBatch) -> Result<(), StreamClosed> {
        mpsc::UnboundedSender::send(self, batch.clone()).map_err(|_| StreamClosed)
    }
}

/// The other end of a stream the core opened.
struct Peer<In, Out> {
    received: mpsc::UnboundedReceiver<In>,
    events: Sender<Out>,
}

impl<In, Out> Peer<In, Out> {
    fn drain(&mut self) -> Vec<In> {
        std::iter::from_fn(|| self.received.try_recv().ok()).collect()
    }
}

/// A leased worker as the test sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leased {
    pub(crate) worker: WorkerId,
    pub(crate) address: String,
}

/// A core (owner and submitter) on virtual node managers, head and workers.
pub(crate) struct VirtualCluster {
    pub(crate) core: Arc<CoreWorker>,
    opened: mpsc::UnboundedReceiver<Opened>,
    sessions: HashMap<String, Peer<LeaseSessionRequest, LeaseSessionEvent>>,
    /// Task streams by worker address.
    streams: HashMap<String, Peer<TaskBatch, WorkerEvents>>,
    actor_watch: Option<Peer<WatchActorRequest, ActorWatchEvent>>,
    exits: Arc<Mutex<HashMap<WorkerId, WorkerExit>>>,
    deaths: mpsc::UnboundedSender<NodeDeath>,
    /// Each node's id, as its grants say.
    node_ids: HashMap<String, NodeId>,
}

impl VirtualCluster {
    /// Starts a core and its submitter on the current (paused) runtime.
    pub(crate) fn start() -> Self {
        let (opened_sender, opened) = mpsc::unbounded_channel();
        let (deaths, deaths_receiver) = mpsc::unbounded_channel();
        let exits = Arc::new(Mutex::new(HashMap::new()));
        let links = Arc::new(VirtualLinks {
            opened: opened_sender,
            exits: exits.clone(),
            deaths: Mutex::new(Some(deaths_receiver)),
        });
        let (submitter, submissions) = crate::submitter::submitter_channel();
        let core = CoreWorker::start(settings(links), submitter, tokio::runtime::Handle::current());
        Submitter::spawn(core.owner.clone(), submissions);
        VirtualCluster {
            core,
            opened,
            sessions: HashMap::new(),
            streams: HashMap::new(),
            actor_watch: None,
            exits,
            deaths,
            node_ids: HashMap::new(),
        }
    }

    pub(crate) fn send(&self, event: SubmitterEvent) {
        self.core.submitter.send(event).expect("the submitter runs");
    }

    /// Lets every task run until all wait, moving the clock by a
    /// millisecond; collects the streams opened meanwhile.
    pub(crate) async fn settle(&mut self) {
        tokio::time::sleep(SETTLE_STEP).await;
        while let Ok(opened) = self.opened.try_recv() {
            match opened {
                Opened::Session { node, requests, events } => {
                    let peer = Peer {
                        received: requests,
                        events,
                    };
                    self.sessions.insert(node.to_string(), peer);
                }
                Opened::Stream {
                    address,
                    batches,
                    events,
                } => {
                    self.streams.insert(
                        address,
                        Peer {
                            received: batches,
                            events,
                        },
                    );
                }
                Opened::ActorWatch { requests, events } => {
                    self.actor_watch = Some(Peer {
                        received: requests,
                        events,
                    });
                }
            }
        }
    }

    /// Moves the clock by `duration`, letting everything due run.
    pub(crate) async fn advance(&mut self, duration: Duration) {
        tokio::time::sleep(duration.saturating_sub(SETTLE_STEP)).await;
        self.settle().await;
    }

    /// What the core asked of the node manager at `node` since last asked;
    /// the session's opening is left out.
    pub(crate) fn requests(&mut self, node: &str) -> Vec<LeaseRequest> {
        let Some(session) = self.sessions.get_mut(node) else {
            return Vec::new();
        };
        let requests = session.drain().into_iter().filter_map(|request| request.kind);
        requests.filter(|kind| !matches!(kind, LeaseRequest::Open(_))).collect()
    }

    /// Grants lease request `request_id` at `node` with a new worker.
    pub(crate) fn grant(&mut self, node: &str, request_id: u64) -> Leased {
        let worker = WorkerId::random();
        let node_id = *self.node_ids.entry(node.to_string()).or_insert_with(NodeId::random);
        let address = format!("worker-{worker}:9000");
        let granted = LeaseGranted {
            request_id,
            worker_id: worker.as_bytes().to_vec(),
            worker_address: address.clone(),
            node_id: node_id.as_bytes().to_vec(),
            pid: 4242,
            incarnation: 1,
        };
        self.lease_event(node, LeaseEvent::Granted(granted));
        Leased { worker, address }
    }

    /// Sends a lease session event from the node manager at `node`.
    pub(crate) fn lease_event(&self, node: &str, event: LeaseEvent) {
        let session = self
            .sessions
            .get(node)
            .expect("the core opened a session with the node");
        let _ = session.events.send(Ok(LeaseSessionEvent { kind: Some(event) }));
    }

    /// The tasks sent to the worker at `address` since last asked, and the
    /// ids of the tasks it was told to cancel.
    pub(crate) fn received(&mut self, address: &str) -> (Vec<TaskSpec>, Vec<TaskId>) {
        let (mut tasks, mut cancels) = (Vec::new(), Vec::new());
        for batch in self.streams.get_mut(address).map(Peer::drain).unwrap_or_default() {
            tasks.extend(batch.tasks);
            cancels.extend(batch.cancel.iter().map(|c| TaskId::from_wire(&c.task_id).unwrap()));
        }
        (tasks, cancels)
    }

    /// The tasks sent to the worker at `address` since last asked.
    pub(crate) fn tasks(&mut self, address: &str) -> Vec<TaskSpec> {
        self.received(address).0
    }

    /// The worker at `address` answers `task` with `outcome`.
    pub(crate) fn answer(&self, address: &str, task: &TaskSpec, outcome: Outcome) {
        let result = v1::TaskResult {
            task_id: task.task_id.clone(),
            outcome: Some(outcome_to_proto(&outcome, false)),
            attempt: task.attempt,
            run_micros: 100,
            ..v1::TaskResult::default()
        };
        let events = WorkerEvents {
            results: vec![result],
            ..WorkerEvents::default()
        };
        let _ = self.streams[address].events.send(Ok(events));
    }

    /// The worker at `address` sends item `index` of generator call `task`.
    pub(crate) fn yield_item(&self, address: &str, task: &TaskSpec, index: u64, item: Outcome) {
        let item = v1::GeneratorItem {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            index,
            item: Some(outcome_to_proto(&item, false)),
        };
        let events = WorkerEvents {
            items: vec![item],
            ..WorkerEvents::default()
        };
        let _ = self.streams[address].events.send(Ok(events));
    }

    /// `worker`'s process ends as `kind` says: its task stream breaks, and
    /// its node manager tells how it exited.
    pub(crate) fn kill(&mut self, worker: &Leased, kind: WorkerExitKind) {
        let exit = WorkerExit {
            exited: true,
            description: format!("ended ({kind:?})"),
            kind: kind.into(),
        };
        self.exits.lock().unwrap().insert(worker.worker, exit);
        self.streams.remove(&worker.address);
    }

    /// The head counts the node at `node` (incarnation 1) dead.
    pub(crate) fn node_died(&self, node: &str) {
        let _ = self.deaths.send(NodeDeath {
            node_id: self.node_ids[node],
            incarnation: 1,
            address: node.to_string(),
            reason: "its heartbeats stopped".into(),
        });
    }

    /// The actors the core asked the head to follow since last asked.
    pub(crate) fn followed_actors(&mut self) -> Vec<ActorId> {
        let requests = self.actor_watch.as_mut().map(Peer::drain).unwrap_or_default();
        requests
            .iter()
            .map(|request| ActorId::from_wire(&request.actor_id).unwrap())
            .collect()
    }

    /// The head reports `record` of `actor`.
    pub(crate) fn actor_record(&self, actor: ActorId, record: ActorRecord) {
        let watch = self.actor_watch.as_ref().expect("the core follows actors");
        let event = ActorWatchEvent {
            actor_id: actor.as_bytes().to_vec(),
            record: Some(record),
            ..ActorWatchEvent::default()
        };
        let _ = watch.events.send(Ok(event));
    }

    /// The object's outcome, `None` while it is pending.
    pub(crate) fn outcome(&self, object: ObjectId) -> Option<Outcome> {
        self.core.owner.store.try_get(object).expect("the object is tracked")
    }
}

fn settings(links: Arc<VirtualLinks>) -> CoreSettings {
    CoreSettings {
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
            head: links.clone(),
            workers: links,
        }),
    }
}

/// A small value a task returns.
pub(crate) fn value(number: u64) -> Outcome {
    Ok(EncodedValue::encode(&number).expect("a number encodes"))
}

/// A value a task put in the store of the node manager at `node`.
pub(crate) fn stored_value(node: &str) -> Outcome {
    let body = Body::Stored(StoredAt::new(node, 4 << 20));
    Ok(EncodedValue::new::<Vec<u8>>(Format::Postcard, body, Vec::new()))
}

/// The number a finished object holds.
pub(crate) fn number(outcome: Option<Outcome>) -> u64 {
    let value = outcome.expect("the object is ready").expect("the task succeeded");
    match value.body {
        Body::Inline(bytes) => raylet_common::codec::decode(&bytes).expect("a number"),
        Body::Stored(_) => panic!("the value is stored"),
    }
}
