//! Worker processes. A node manager starts the owner's binary again with a
//! bootstrap variable; a hook that runs before `main` sees it and runs the
//! worker instead. The main thread serves task streams and runs each task
//! right there, one at a time, so a task costs no hop between threads; a
//! second thread runs the worker's own cluster handle (its submitter, its
//! owner service and its session with the node manager), which tasks use to
//! submit tasks and get objects. The worker exits when its node manager
//! goes away, and its output is forwarded to the owner of the running task.

mod actor_host;
mod args;
mod executor;
mod generator;
mod hand_over;
mod hook;
pub(crate) mod logs;
mod owning_report;
mod service;
mod stacks;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use raylet_common::auth::AuthToken;
use raylet_common::worker_env::WorkerBootstrap;
use raylet_proto::server::{MAX_DATA_MESSAGE, authenticated, incoming};
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::owner_service_server::OwnerServiceServer;
use raylet_proto::v1::worker_session_message::Kind as SessionKind;
use raylet_proto::v1::{RegisterWorker, WorkerBinary, WorkerSessionMessage};
use raylet_proto::{JobId, NodeId, TaskId, WorkerId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use self::owning_report::OwningReport;
use crate::cluster::Cluster;
use crate::core_worker::{CoreSettings, CoreWorker};
use crate::objects::owner_service::{OwnerServiceImpl, serve_owner_calls};
use crate::observability::task_events::Placement;
use crate::submitter::Submitter;
use crate::{Error, Result};

/// The node manager that started this worker is listening already; if it
/// does not answer soon, it is gone and so should the worker be.
const NODE_MANAGER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// What the task thread and the cluster thread share.
pub(crate) struct WorkerContext {
    pub(crate) core: Arc<CoreWorker>,
    pub(crate) node_id: NodeId,
    pub(crate) pid: u32,
    cancelled: Mutex<HashSet<TaskId>>,
    /// The actor this worker hosts, once its constructor ran.
    pub(crate) actor: OnceLock<actor_host::ActorHost>,
    /// Where the callers of running generators stand.
    generators: Arc<generator::GeneratorGates>,
}

impl WorkerContext {
    /// Marks a queued task as cancelled: it will be skipped. A running task
    /// is stopped by its owner through the node manager, which kills us;
    /// A running generator stops before its next item.
    pub(crate) fn cancel(&self, task_id: TaskId) {
        self.cancelled.lock().unwrap_or_else(|p| p.into_inner()).insert(task_id);
        self.generators.cancel(task_id);
    }

    fn take_cancelled(&self, task_id: TaskId) -> bool {
        self.cancelled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&task_id)
    }
}

/// The GPUs leased to this worker process, set once as it starts.
static GPU_IDS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// The ids of the GPUs this process may use: in a task or actor that asked
/// for GPUs, those its node leased to it (also in `CUDA_VISIBLE_DEVICES`);
/// empty anywhere else, the driver included.
pub fn gpu_ids() -> Vec<u32> {
    GPU_IDS.get().cloned().unwrap_or_default()
}

/// Runs a worker until its node manager goes away. Returns the exit code.
pub(crate) fn run(bootstrap: WorkerBootstrap) -> i32 {
    let _ = GPU_IDS.set(bootstrap.gpu_ids.clone());
    let cluster_thread = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("raylet-worker")
        .enable_all()
        .build();
    let task_thread = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(raylet_proto::task_stream::spin_before_parking)
        .build();
    let (cluster_thread, task_thread) = match (cluster_thread, task_thread) {
        (Ok(cluster), Ok(tasks)) => (cluster, tasks),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("raylet worker: cannot start a runtime: {error}");
            return 1;
        }
    };
    let log_dir = Some(Path::new(&bootstrap.log_dir)).filter(|dir| !dir.as_os_str().is_empty());
    if let Err(error) = logs::capture(log_dir, &bootstrap.worker_id) {
        eprintln!("raylet worker: output will not reach the driver: {error}");
    }
    if let Some(dir) = log_dir
        && let Err(error) = stacks::install(dir, &bootstrap.worker_id)
    {
        eprintln!("raylet worker: `raylet stack` cannot dump this worker: {error}");
    }
    let handle = cluster_thread.handle().clone();
    let started = cluster_thread.block_on(start(bootstrap, handle));
    let (context, token, task_listener) = match started {
        Ok(started) => started,
        Err(error) => {
            eprintln!("raylet worker: cannot start: {error}");
            return 1;
        }
    };
    match task_thread.block_on(service::serve(context, token, task_listener)) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("raylet worker: the task service failed: {error}");
            1
        }
    }
}

/// Starts the worker's cluster side and registers with the node manager.
/// Returns the listener for task streams, which the main thread serves.
async fn start(
    bootstrap: WorkerBootstrap,
    runtime: tokio::runtime::Handle,
) -> Result<(Arc<WorkerContext>, AuthToken, service::TaskListeners)> {
    let token = AuthToken::parse(&bootstrap.token)?;
    let worker_id: WorkerId = bootstrap.worker_id.parse()?;
    let node_id: NodeId = bootstrap.node_id.parse()?;
    let ip: IpAddr = bootstrap
        .bind_ip
        .parse()
        .map_err(|e| Error::Cluster(raylet_proto::Error::InvalidArgument(format!("bind ip: {e}"))))?;
    let task_listeners = service::TaskListeners::bind(ip)?;
    let owner_listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0)).await?;

    // One message per change of the blocked state, which the running
    // task's thread makes one at a time; the owning state's changes are
    // coalesced (see `owning_report`).
    let (session, session_outbound) = mpsc::unbounded_channel::<WorkerSessionMessage>();
    let blocked_session = session.clone();
    let blocked_hook = Box::new(move |blocked: bool| {
        let _ = blocked_session.send(WorkerSessionMessage {
            kind: Some(SessionKind::Blocked(blocked)),
        });
    });
    let owning = Arc::new(OwningReport::default());
    tokio::spawn(owning.clone().run(session.clone()));
    let owning_hook = Box::new(move |owns: bool| owning.set(owns));
    // Unbounded, yet bounded: each submission holds a place in the pending
    // gate (`Config::max_pending_tasks`); the other events answer leases,
    // workers and nodes that the submitter itself asked for.
    let (submitter, submissions) = crate::submitter::submitter_channel();
    let binary = WorkerBinary {
        path: std::env::current_exe()?.to_string_lossy().into_owned(),
        hash: bootstrap.binary_hash.clone(),
        namespace: bootstrap.namespace.clone(),
    };
    let settings = CoreSettings {
        address: owner_listener.local_addr()?.to_string(),
        token: token.clone(),
        head_address: bootstrap.head_address.clone(),
        node_manager: bootstrap.node_manager_address.clone(),
        binary,
        log_to_driver: true,
        blocked_hook: Some(blocked_hook),
        owning_hook: Some(owning_hook),
        store_full_timeout: crate::Config::DEFAULT_OBJECT_STORE_FULL_TIMEOUT,
        job: JobId::random(),
        task_events: true,
        place: Placement {
            node_id: Some(node_id),
            worker_id: Some(worker_id),
            pid: std::process::id(),
        },
        links: None,
    };
    crate::observability::timeline::set_node(node_id);
    let core = CoreWorker::start(settings, submitter, runtime);
    Submitter::spawn(core.owner.clone(), submissions);
    serve_objects(core.clone(), token.clone(), owner_listener);
    crate::cluster::set_current(Cluster::for_worker(core.clone()));
    let context = Arc::new(WorkerContext {
        core: core.clone(),
        node_id,
        pid: std::process::id(),
        cancelled: Mutex::new(HashSet::new()),
        actor: OnceLock::new(),
        generators: Arc::default(),
    });

    let register = RegisterWorker {
        worker_id: worker_id.as_bytes().to_vec(),
        address: task_listeners.address()?.to_string(),
        pid: std::process::id(),
        owner_address: core.ctx().address.to_string(),
    };
    let _ = session.send(WorkerSessionMessage {
        kind: Some(SessionKind::Register(register)),
    });
    join_node_manager(&core, session_outbound, task_listeners.address()?).await?;
    Ok((context, token, task_listeners))
}

/// Serves the objects this worker owns, on the cluster thread, and to
/// processes of its machine on a thread of their own.
fn serve_objects(core: Arc<CoreWorker>, token: AuthToken, listener: tokio::net::TcpListener) {
    let owner = OwnerServiceServer::new(OwnerServiceImpl::new(core.owner.store.clone()))
        .max_decoding_message_size(MAX_DATA_MESSAGE)
        .max_encoding_message_size(MAX_DATA_MESSAGE);
    let owner_calls = serve_owner_calls(&core.ctx().address, &token, core.owner.store.clone());
    tokio::spawn(async move {
        let _owner_calls = owner_calls;
        let served = match authenticated(token) {
            Ok(mut server) => server
                .add_service(owner)
                .serve_with_incoming(incoming(listener))
                .await
                .map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = served {
            eprintln!("raylet worker: the object service failed: {error}");
            std::process::exit(1);
        }
    });
}

/// Serves task streams on the main thread, which also runs the tasks.
/// Opens the worker session with the node manager; the process exits when
/// that session ends (removing its same-node socket files), so a worker
/// never outlives its node or its driver.
async fn join_node_manager(
    core: &CoreWorker,
    outbound: mpsc::UnboundedReceiver<WorkerSessionMessage>,
    task_address: SocketAddr,
) -> Result<()> {
    let channel =
        raylet_proto::channel::connect(&core.ctx().node_manager, &core.ctx().token, NODE_MANAGER_PATIENCE).await?;
    let mut client = NodeManagerServiceClient::new(channel);
    let reply = client.worker_session(UnboundedReceiverStream::new(outbound)).await;
    let mut inbound = reply.map_err(raylet_proto::Error::from)?.into_inner();
    inbound.message().await.map_err(raylet_proto::Error::from)?;
    let owner_address = core.ctx().address.clone();
    tokio::spawn(async move {
        let ended = loop {
            match inbound.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => break "the node manager closed it".to_string(),
                Err(status) => break format!("it failed: {status}"),
            }
        };
        eprintln!("raylet worker: exiting, as its session with its node ended: {ended}");
        raylet_proto::local_socket::remove_socket_of(&task_address.to_string());
        raylet_proto::local_socket::remove_socket_of(&owner_address);
        std::process::exit(0);
    });
    Ok(())
}
