//! The gRPC face of the node manager: lease sessions, worker sessions,
//! worker exits and placement group bundles.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use raylet_proto::peer_stream::{peer_of, peer_stream};
use raylet_proto::v1::lease_session_request::Kind as LeaseKind;
use raylet_proto::v1::node_manager_service_server::NodeManagerService;
use raylet_proto::v1::worker_session_message::Kind as WorkerKind;
use raylet_proto::v1::{
    AttachJobDriverRequest, BundleOpResult, BundleOpsReply, BundleOpsRequest, DumpWorkerStacksRequest,
    GetWorkerExitRequest, JobDriverEvent, LeaseSessionEvent, LeaseSessionRequest, ReadWorkerLogRequest,
    RunJobDriverRequest, StopJobDriverReply, StopJobDriverRequest, WorkerBinary, WorkerExit, WorkerLog,
    WorkerSessionEvent, WorkerSessionMessage, WorkerStacks,
};
use raylet_proto::{JobId, ResourceSet, Scheduling, WorkerId};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::bundle_ops::{BundleError, BundleOperation};
use super::job_drivers;
use super::job_drivers::DriverEvents;
use super::leasing::EventSender;
use super::leasing::{LeaseManager, PendingLease};
use super::{NodeManagerError, NodeShared};

/// How long `GetWorkerExit` waits for a dying worker to be reaped.
const EXIT_PATIENCE: Duration = Duration::from_secs(3);
/// The longest grace period a driver's stop may ask for.
const MAX_STOP_GRACE: Duration = Duration::from_secs(3600);

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Serves [`NodeManagerService`] from the node's shared state.
pub(crate) struct NodeManagerServiceImpl {
    pub(crate) shared: Arc<NodeShared>,
}

#[tonic::async_trait]
impl NodeManagerService for NodeManagerServiceImpl {
    type LeaseSessionStream = EventStream<LeaseSessionEvent>;
    type WorkerSessionStream = EventStream<WorkerSessionEvent>;
    type RunJobDriverStream = EventStream<JobDriverEvent>;
    type AttachJobDriverStream = EventStream<JobDriverEvent>;

    async fn lease_session(
        &self,
        request: Request<Streaming<LeaseSessionRequest>>,
    ) -> Result<Response<Self::LeaseSessionStream>, Status> {
        let (events, receiver) = peer_stream("lease session events", peer_of(&request));
        let mut inbound = request.into_inner();
        let first = inbound.message().await?;
        let session = self.open_lease_session(first, events).await?;
        let leases = self.shared.leases.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                if let Some(kind) = message.kind {
                    handle_lease_message(&leases, session, kind);
                }
            }
            leases.close_session(session);
        });
        Ok(Response::new(Box::pin(receiver)))
    }

    async fn worker_session(
        &self,
        request: Request<Streaming<WorkerSessionMessage>>,
    ) -> Result<Response<Self::WorkerSessionStream>, Status> {
        let (events, receiver) = peer_stream("worker session events", peer_of(&request));
        let mut inbound = request.into_inner();
        let first = inbound.message().await?;
        let worker_id = self.register_worker(first)?;
        let leases = self.shared.leases.clone();
        let welcome = WorkerSessionEvent {
            node_id: self.shared.config.node_id.as_bytes().to_vec(),
        };
        let _ = events.send(Ok(welcome));
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                match message.kind {
                    Some(WorkerKind::Blocked(blocked)) => leases.set_blocked(worker_id, blocked),
                    Some(WorkerKind::OwnsObjects(owns)) => leases.set_owns_objects(worker_id, owns),
                    _ => {}
                }
            }
            drop(events);
        });
        Ok(Response::new(Box::pin(receiver)))
    }

    async fn apply_bundle_ops(&self, request: Request<BundleOpsRequest>) -> Result<Response<BundleOpsReply>, Status> {
        let ops = request
            .into_inner()
            .ops
            .into_iter()
            .map(|op| BundleOperation::decode(op).map_err(BundleError::from))
            .collect();
        let results = self
            .shared
            .leases
            .apply_bundle_ops(ops)
            .into_iter()
            .map(|result| BundleOpResult {
                error: result.err().map(|error| error.to_string()).unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(BundleOpsReply { results }))
    }

    async fn run_job_driver(
        &self,
        request: Request<RunJobDriverRequest>,
    ) -> Result<Response<EventStream<JobDriverEvent>>, Status> {
        let (events, receiver) = peer_stream("job driver events", peer_of(&request));
        self.start_job_driver(request.into_inner(), events)?;
        Ok(Response::new(Box::pin(receiver)))
    }

    async fn attach_job_driver(
        &self,
        request: Request<AttachJobDriverRequest>,
    ) -> Result<Response<EventStream<JobDriverEvent>>, Status> {
        let (events, receiver) = peer_stream("job driver events", peer_of(&request));
        self.attach_to_job_driver(request.into_inner(), events)?;
        Ok(Response::new(Box::pin(receiver)))
    }

    async fn stop_job_driver(
        &self,
        request: Request<StopJobDriverRequest>,
    ) -> Result<Response<StopJobDriverReply>, Status> {
        let request = request.into_inner();
        let job = JobId::from_wire(&request.job_id).map_err(NodeManagerError::from)?;
        let grace = Duration::from_millis(request.grace_ms).min(MAX_STOP_GRACE);
        let found = self.shared.job_drivers.stop(job, grace);
        Ok(Response::new(StopJobDriverReply { found }))
    }

    async fn read_worker_log(&self, request: Request<ReadWorkerLogRequest>) -> Result<Response<WorkerLog>, Status> {
        Ok(Response::new(self.read_log(request.into_inner()).await?))
    }

    async fn dump_worker_stacks(
        &self,
        request: Request<DumpWorkerStacksRequest>,
    ) -> Result<Response<WorkerStacks>, Status> {
        let pid = request.into_inner().pid;
        let config = &self.shared.config;
        let workers = self.shared.leases.workers();
        let node = config.node_id.to_string();
        let stacks = super::worker_stacks::dump(&config.worker_log_dir(), workers, pid, &node).await?;
        Ok(Response::new(stacks))
    }

    async fn get_worker_exit(&self, request: Request<GetWorkerExitRequest>) -> Result<Response<WorkerExit>, Status> {
        let worker_id = WorkerId::from_wire(&request.into_inner().worker_id).map_err(NodeManagerError::from)?;
        let exit = self.shared.leases.worker_exit(worker_id, EXIT_PATIENCE).await;
        Ok(Response::new(exit.map(|end| end.to_proto()).unwrap_or_default()))
    }
}

impl NodeManagerServiceImpl {
    /// Opens the lease session a stream's first message asks for; a binary
    /// that is not at its path here is looked up by its build among the
    /// binaries of the jobs this node runs.
    async fn open_lease_session(
        &self,
        first: Option<LeaseSessionRequest>,
        events: EventSender,
    ) -> Result<u64, NodeManagerError> {
        let Some(LeaseKind::Open(binary)) = first.and_then(|m| m.kind) else {
            return Err(NodeManagerError::LeaseSessionWithoutOpen);
        };
        let binary = self.shared.job_drivers.lasting_binary(binary);
        let leases = &self.shared.leases;
        let not_here = match leases.open_session(binary.clone(), events.clone()) {
            Ok(session) => return Ok(session),
            Err(not_here) => not_here,
        };
        let Ok(path) = self.shared.job_drivers.binary_by_build(&binary.hash).await else {
            return Err(not_here);
        };
        let fetched = WorkerBinary {
            path: path.to_string_lossy().into_owned(),
            ..binary
        };
        leases.open_session(fetched, events)
    }

    /// Registers the worker a worker session's first message names.
    fn register_worker(&self, first: Option<WorkerSessionMessage>) -> Result<WorkerId, NodeManagerError> {
        let Some(WorkerKind::Register(register)) = first.and_then(|m| m.kind) else {
            return Err(NodeManagerError::WorkerSessionWithoutRegister);
        };
        let worker_id = WorkerId::from_wire(&register.worker_id)?;
        self.shared
            .leases
            .register_worker(worker_id, register.address, register.owner_address)?;
        Ok(worker_id)
    }

    fn start_job_driver(&self, request: RunJobDriverRequest, events: DriverEvents) -> Result<(), NodeManagerError> {
        let job = JobId::from_wire(&request.job_id)?;
        let spec = request.spec.ok_or(NodeManagerError::JobSpecMissing)?;
        Ok(job_drivers::start(&self.shared, job, spec, events)?)
    }

    fn attach_to_job_driver(
        &self,
        request: AttachJobDriverRequest,
        events: DriverEvents,
    ) -> Result<(), NodeManagerError> {
        let job = JobId::from_wire(&request.job_id)?;
        Ok(self.shared.job_drivers.attach(job, request.output_offset, events)?)
    }

    async fn read_log(&self, request: ReadWorkerLogRequest) -> Result<WorkerLog, NodeManagerError> {
        let dir = self.shared.config.worker_log_dir();
        let log = tokio::task::spawn_blocking(move || super::worker_logs::read(&dir, &request))
            .await
            .map_err(|e| NodeManagerError::LogReadFailed(e.to_string()))??;
        Ok(log)
    }
}

fn handle_lease_message(leases: &Arc<LeaseManager>, session: u64, kind: LeaseKind) {
    match kind {
        LeaseKind::Open(_) => {
            tracing::warn!(session, "ignoring a second `open` in a lease session")
        }
        LeaseKind::Request(request) => {
            let demand = ResourceSet::from_proto(&request.resources.unwrap_or_default());
            let scheduling = Scheduling::from_proto(request.strategy.as_ref());
            match (demand, scheduling) {
                (Ok(demand), Ok(scheduling)) => leases.request(PendingLease {
                    session,
                    request_id: request.request_id,
                    demand,
                    scheduling,
                    allow_spillback: request.allow_spillback,
                    retriable: request.retriable,
                    outlives_session: request.outlives_session,
                    view: 0,
                }),
                (Err(error), _) | (_, Err(error)) => leases.refuse_malformed(session, request.request_id, &error),
            }
        }
        LeaseKind::ReturnLease(returned) => {
            if let Ok(worker_id) = WorkerId::from_wire(&returned.worker_id) {
                leases.return_lease(session, worker_id, returned.worker_failed);
            }
        }
        LeaseKind::Adopt(adopt) => match WorkerId::from_wire(&adopt.worker_id) {
            Ok(worker_id) => leases.adopt_lease(session, adopt.request_id, worker_id),
            Err(error) => leases.refuse_malformed(session, adopt.request_id, &error),
        },
        LeaseKind::Cancel(cancel) => leases.cancel_request(session, cancel.request_id),
        LeaseKind::Backlog(report) => {
            let demand = ResourceSet::from_proto(&report.resources.unwrap_or_default());
            let scheduling = Scheduling::from_proto(report.strategy.as_ref());
            match (demand, scheduling) {
                (Ok(demand), Ok(scheduling)) => leases.set_backlog(session, demand, scheduling, report.backlog),
                _ => tracing::warn!(session, "ignoring a malformed backlog report"),
            }
        }
        LeaseKind::Resize(resize) => {
            let worker_id = WorkerId::from_wire(&resize.worker_id);
            let resources = ResourceSet::from_proto(&resize.resources.unwrap_or_default());
            match (worker_id, resources) {
                (Ok(worker_id), Ok(resources)) => leases.resize_lease(session, worker_id, resources),
                _ => tracing::warn!(session, "ignoring a malformed lease resize"),
            }
        }
    }
}
