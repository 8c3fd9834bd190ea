//! How a driver starts: it starts an embedded cluster or joins the one at
//! its address (finding the token and a node manager), then makes its core,
//! its submitter and the owner service that other processes fetch its
//! objects from.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use raylet_cluster_status::ClusterStatus;
use raylet_common::auth::AuthToken;
use raylet_proto::JobId;
use raylet_proto::server::{MAX_DATA_MESSAGE, authenticated, incoming};
use raylet_proto::v1::WorkerBinary;
use raylet_proto::v1::owner_service_server::OwnerServiceServer;
use tokio::sync::oneshot;

use crate::cluster::config::Config;
use crate::cluster::embedded::Embedded;
use crate::cluster::session::TempRoot;
use crate::core_worker::{CoreSettings, CoreWorker};
use crate::objects::owner_service::{OwnerServiceImpl, serve_owner_calls};
use crate::observability::task_events::Placement;
use crate::submitter::Submitter;
use crate::{Error, Result};
use raylet_proto::owner_calls::OwnerCallServer;

/// What starting a driver produces.
pub(super) struct StartedDriver {
    pub(super) core: Arc<CoreWorker>,
    pub(super) embedded: Option<Embedded>,
    pub(super) owner_services: OwnerServices,
}

/// The driver's owner services, over gRPC and for its machine; they stop
/// when this is dropped.
pub(super) struct OwnerServices {
    _stop_grpc: oneshot::Sender<()>,
    _owner_calls: Option<OwnerCallServer>,
}

pub(super) async fn start_driver(config: Config, runtime: tokio::runtime::Handle) -> Result<StartedDriver> {
    let binary = tokio::task::spawn_blocking(own_binary);
    let (embedded, head_address, node_manager, token, ip) = match &config.address {
        None => {
            let embedded = Embedded::start(&config).await?;
            let node_manager = embedded.node_manager().to_string();
            let token = embedded.token().clone();
            let head_address = embedded.head_address().to_string();
            (
                Some(embedded),
                head_address,
                node_manager,
                token,
                std::net::Ipv4Addr::LOCALHOST.into(),
            )
        }
        Some(address) => {
            let token = resolve_token(&config)?;
            let node_manager = match &config.node_manager {
                Some(node_manager) => node_manager.clone(),
                None => pick_node_manager(address, &token).await?,
            };
            let ip = crate::links::local_ip::local_ip_towards(address)?;
            (None, address.clone(), node_manager, token, ip)
        }
    };
    let binary = WorkerBinary {
        namespace: config.namespace.clone(),
        ..binary
            .await
            .map_err(|e| Error::Cluster(raylet_proto::Error::Internal(e.to_string())))??
    };
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0)).await?;
    // Unbounded, yet bounded: each submission holds a place in the pending
    // gate (`Config::max_pending_tasks`); the other events answer leases,
    // workers and nodes that the submitter itself asked for.
    let (submitter, submissions) = crate::submitter::submitter_channel();
    let settings = CoreSettings {
        address: listener.local_addr()?.to_string(),
        token: token.clone(),
        head_address,
        node_manager,
        binary,
        log_to_driver: config.log_to_driver,
        blocked_hook: None,
        owning_hook: None,
        store_full_timeout: config.object_store_full_timeout,
        job: config.job_id.unwrap_or_else(JobId::random),
        task_events: config.task_events,
        place: Placement {
            node_id: None,
            worker_id: None,
            pid: std::process::id(),
        },
        links: None,
    };
    crate::observability::timeline::set_on(config.timeline);
    let core = CoreWorker::start(settings, submitter, runtime);
    Submitter::spawn(core.owner.clone(), submissions);
    let owner_calls = serve_owner_calls(&core.ctx().address, &token, core.owner.store.clone());
    let (stop_grpc, stopped) = oneshot::channel::<()>();
    let service = OwnerServiceServer::new(OwnerServiceImpl::new(core.owner.store.clone()))
        .max_decoding_message_size(MAX_DATA_MESSAGE)
        .max_encoding_message_size(MAX_DATA_MESSAGE);
    tokio::spawn(
        authenticated(token)?
            .add_service(service)
            .serve_with_incoming_shutdown(incoming(listener), async {
                let _ = stopped.await;
            }),
    );
    Ok(StartedDriver {
        core,
        embedded,
        owner_services: OwnerServices {
            _stop_grpc: stop_grpc,
            _owner_calls: owner_calls,
        },
    })
}

/// This executable and its content hash: workers run it.
fn own_binary() -> Result<WorkerBinary> {
    let path = std::env::current_exe()?;
    let hash = raylet_common::binary_hash::hash_file(&path)?;
    Ok(WorkerBinary {
        path: path.to_string_lossy().into_owned(),
        hash,
        namespace: String::new(),
    })
}

fn resolve_token(config: &Config) -> Result<AuthToken> {
    if let Some(token) = &config.token {
        return Ok(AuthToken::parse(token)?);
    }
    let session = TempRoot::new(&config.temp_dir).require_latest()?;
    session.read_token()?.ok_or_else(|| {
        Error::session(
            session.token_path(),
            "does not exist: set RAYLET_TOKEN or Config::token",
        )
    })
}

/// The node manager on this machine, else the head's, else any alive one.
async fn pick_node_manager(head: &str, token: &AuthToken) -> Result<String> {
    let status = ClusterStatus::fetch(head, token, Duration::from_secs(10)).await?;
    let local_ip = crate::links::local_ip::local_ip_towards(head)?.to_string();
    let alive: Vec<_> = status.alive().collect();
    let same_host = alive
        .iter()
        .filter(|n| n.address.rsplit_once(':').is_some_and(|(ip, _)| ip == local_ip))
        .max_by_key(|n| n.is_head_node);
    let chosen = same_host
        .or_else(|| alive.iter().find(|n| n.is_head_node))
        .or_else(|| alive.first())
        .ok_or_else(|| {
            Error::Cluster(raylet_proto::Error::Unavailable(format!(
                "the cluster at {head} has no alive node"
            )))
        })?;
    Ok(chosen.address.clone())
}
