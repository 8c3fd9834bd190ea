//! Worker processes. A node manager starts the owner's binary again with a
//! bootstrap variable; a hook that runs before `main` sees it and runs the
//! worker instead: it serves task streams, runs tasks one at a time on its
//! main thread, forwards its output to the task's owner, and exits when its
//! node manager goes away.

mod executor;
mod hook;
mod logs;
mod service;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use raylet_proto::auth::AuthToken;
use raylet_proto::server::{MAX_DATA_MESSAGE, authenticated, incoming};
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::owner_service_server::OwnerServiceServer;
use raylet_proto::v1::worker_service_server::WorkerServiceServer;
use raylet_proto::v1::worker_session_message::Kind as SessionKind;
use raylet_proto::v1::{RegisterWorker, WorkerBinary, WorkerSessionMessage};
use raylet_proto::worker_env::WorkerBootstrap;
use raylet_proto::{NodeId, TaskId, WorkerId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::cluster::Cluster;
use crate::core_worker::CoreWorker;
use crate::owner_service::OwnerServiceImpl;
use crate::submitter::Submitter;
use crate::{Error, Result};
use executor::Execution;

/// The node manager that started this worker is listening already; if it
/// does not answer soon, it is gone and so should the worker be.
const NODE_MANAGER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// What the worker's threads share.
pub(crate) struct WorkerContext {
    pub(crate) core: Arc<CoreWorker>,
    pub(crate) node_id: NodeId,
    pub(crate) pid: u32,
    pub(crate) executions: std::sync::mpsc::Sender<Execution>,
    cancelled: Mutex<HashSet<TaskId>>,
    running: Mutex<Option<TaskId>>,
}

impl WorkerContext {
    /// Cancels a task: a queued one is skipped; a running one ends the
    /// process when forced, since a running function cannot be interrupted.
    pub(crate) fn cancel(&self, task_id: TaskId, force: bool) {
        let running = *self.running.lock().unwrap_or_else(|p| p.into_inner());
        if running == Some(task_id) {
            if force {
                eprintln!("raylet worker: task {task_id} was cancelled with force; exiting");
                std::process::exit(1);
            }
            return;
        }
        self.cancelled.lock().unwrap_or_else(|p| p.into_inner()).insert(task_id);
    }

    fn take_cancelled(&self, task_id: TaskId) -> bool {
        self.cancelled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&task_id)
    }

    fn set_running(&self, task_id: Option<TaskId>) {
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = task_id;
    }
}

/// Runs a worker until its node manager goes away. Returns the exit code.
pub(crate) fn run(bootstrap: WorkerBootstrap) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("raylet-worker")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("raylet worker: cannot start a runtime: {error}");
            return 1;
        }
    };
    if let Err(error) = logs::capture() {
        eprintln!("raylet worker: output will not reach the driver: {error}");
    }
    let (executions, receiver) = std::sync::mpsc::channel();
    let handle = runtime.handle().clone();
    match runtime.block_on(start(bootstrap, executions, handle)) {
        Ok(context) => {
            executor::run(receiver, &context, &runtime);
            0
        }
        Err(error) => {
            eprintln!("raylet worker: cannot start: {error}");
            1
        }
    }
}

async fn start(
    bootstrap: WorkerBootstrap,
    executions: std::sync::mpsc::Sender<Execution>,
    runtime: tokio::runtime::Handle,
) -> Result<Arc<WorkerContext>> {
    let token = AuthToken::parse(&bootstrap.token)?;
    let worker_id: WorkerId = bootstrap.worker_id.parse()?;
    let node_id: NodeId = bootstrap.node_id.parse()?;
    let ip: std::net::IpAddr = bootstrap
        .bind_ip
        .parse()
        .map_err(|e| Error::Cluster(raylet_proto::Error::InvalidArgument(format!("bind ip: {e}"))))?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0)).await?;
    let address = listener.local_addr()?.to_string();

    let (session, session_outbound) = mpsc::unbounded_channel::<WorkerSessionMessage>();
    let blocked_session = session.clone();
    let blocked_hook = Box::new(move |blocked: bool| {
        let _ = blocked_session.send(WorkerSessionMessage {
            kind: Some(SessionKind::Blocked(blocked)),
        });
    });
    let (submitter, submissions) = mpsc::unbounded_channel();
    let binary = WorkerBinary {
        path: std::env::current_exe()?.to_string_lossy().into_owned(),
        hash: bootstrap.binary_hash.clone(),
    };
    let core = Arc::new(CoreWorker::new(
        address.clone(),
        token.clone(),
        bootstrap.node_manager_address.clone(),
        binary,
        submitter,
        runtime,
        true,
        Some(blocked_hook),
    ));
    Submitter::spawn(core.clone(), submissions);
    let context = Arc::new(WorkerContext {
        core: core.clone(),
        node_id,
        pid: std::process::id(),
        executions,
        cancelled: Mutex::new(HashSet::new()),
        running: Mutex::new(None),
    });
    serve(context.clone(), token, listener);
    crate::cluster::set_current(Cluster::for_worker(core.clone()));

    let register = RegisterWorker {
        worker_id: worker_id.as_bytes().to_vec(),
        address,
        pid: std::process::id(),
    };
    let _ = session.send(WorkerSessionMessage {
        kind: Some(SessionKind::Register(register)),
    });
    join_node_manager(&core, session_outbound).await?;
    Ok(context)
}

fn serve(context: Arc<WorkerContext>, token: AuthToken, listener: tokio::net::TcpListener) {
    let owner = OwnerServiceServer::new(OwnerServiceImpl {
        core: context.core.clone(),
    })
    .max_decoding_message_size(MAX_DATA_MESSAGE)
    .max_encoding_message_size(MAX_DATA_MESSAGE);
    let worker = WorkerServiceServer::new(service::WorkerServiceImpl { context })
        .max_decoding_message_size(MAX_DATA_MESSAGE)
        .max_encoding_message_size(MAX_DATA_MESSAGE);
    tokio::spawn(async move {
        let serving = authenticated(token)
            .add_service(worker)
            .add_service(owner)
            .serve_with_incoming(incoming(listener))
            .await;
        if let Err(error) = serving {
            eprintln!("raylet worker: the task service failed: {error}");
            std::process::exit(1);
        }
    });
}

/// Opens the worker session with the node manager; the process exits when
/// that session ends, so a worker never outlives its node or its driver.
async fn join_node_manager(core: &CoreWorker, outbound: mpsc::UnboundedReceiver<WorkerSessionMessage>) -> Result<()> {
    let channel = raylet_proto::channel::connect(&core.node_manager, &core.token, NODE_MANAGER_PATIENCE).await?;
    let mut client = NodeManagerServiceClient::new(channel);
    let reply = client.worker_session(UnboundedReceiverStream::new(outbound)).await;
    let mut inbound = reply.map_err(raylet_proto::Error::from)?.into_inner();
    inbound.message().await.map_err(raylet_proto::Error::from)?;
    tokio::spawn(async move {
        while let Ok(Some(_)) = inbound.message().await {}
        std::process::exit(0);
    });
    Ok(())
}
