//! `raylet start`: run a head (which starts its machine's node manager as a
//! daemon of its own) or a joining node manager, in the foreground with
//! `--block` or as a daemon.

use std::future::Future;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use anyhow::{Context, bail};
use raylet::session::{ProcessRecord, ProcessRole, Session};
use raylet_autoscaler::{ClusterConfig, Monitor, MonitorConfig, NodeProvider};
use raylet_common::auth::AuthToken;
use raylet_common::log_rotation::RotationSettings;
use raylet_common::output_capture;
use raylet_node::NodeManager;
use raylet_proto::ResourceSet;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

use crate::args::StartArgs;
use crate::daemon::{self, ReadyReport, Started};
use crate::head_node::HeadNode;
use crate::spill_bucket::BucketSpill;

/// How much longer than the connect timeout the CLI waits for a daemon.
pub(crate) const READY_SLACK: std::time::Duration = std::time::Duration::from_secs(10);

pub fn start(args: StartArgs) -> anyhow::Result<()> {
    let resources = args.resolve_resources()?;
    RotationSettings::process()?;
    if let Some(url) = &args.spill_to {
        BucketSpill::open(url, raylet_proto::NodeId::random())?;
    }
    if args.block {
        return run_foreground(args, resources);
    }
    let root = args.session.root();
    let (session, is_new) = prepare_session(&args)?;
    let patience = args.connect_timeout + READY_SLACK;
    let log_name = match args.head {
        true => "head".to_string(),
        false => format!("node-{}", std::process::id()),
    };
    let started = match daemon::spawn_and_wait(&session, &log_name, patience) {
        Ok(started) => started,
        Err(error) if is_new => {
            root.discard(session);
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    if is_new {
        root.make_latest(&session)?;
    }
    match args.head {
        true => print_head_started(&args, &session, &started),
        false => print_node_started(&args, &started),
    }
    Ok(())
}

/// A head gets a new session with a new token. A node joins this machine's
/// latest session, or makes one, and must have a token before it starts.
/// Says whether the session is new: it becomes the latest once ready.
fn prepare_session(args: &StartArgs) -> anyhow::Result<(Session, bool)> {
    let root = args.session.root();
    if args.recover {
        let session = root.require_latest()?;
        if session.read_head_address()?.is_none() {
            bail!(
                "{} has no head address: its head never started, so there is nothing to recover",
                session.dir().display()
            );
        }
        return Ok((session, false));
    }
    if args.head {
        let session = root.create_session()?;
        let token = match &args.session.token {
            Some(_) => args.session.resolve_token()?,
            None => AuthToken::generate(),
        };
        session.write_token(&token)?;
        return Ok((session, true));
    }
    let token = args.session.resolve_token()?;
    let (session, is_new) = match root.latest() {
        Ok(Some(session)) => (session, false),
        _ => (root.create_session()?, true),
    };
    if session.read_token().ok().flatten().is_none() {
        session.write_token(&token)?;
    }
    Ok((session, is_new))
}

fn run_foreground(args: StartArgs, resources: ResourceSet) -> anyhow::Result<()> {
    let rotation = RotationSettings::process()?;
    if let Some(log) = &args.log_file {
        output_capture::capture_into_log(log, rotation).with_context(|| format!("writing to {}", log.display()))?;
    }
    crate::init_logging("info");
    let ready_file = args.ready_file.clone();
    let result = crate::runtime()?.block_on(async {
        let session = match &args.session_dir {
            Some(dir) => Session::open(dir)?,
            None => foreground_session(&args)?,
        };
        if args.head {
            run_head(&args, &session).await
        } else {
            run_node(&args, resources, &session).await
        }
    });
    if let (Err(error), Some(path)) = (&result, &ready_file) {
        let _ = ReadyReport::Failed {
            error: format!("{error:#}"),
        }
        .write(path);
    }
    result
}

/// A foreground daemon started by hand makes its own session, which becomes
/// the latest at once: its errors go straight to the user's terminal.
fn foreground_session(args: &StartArgs) -> anyhow::Result<Session> {
    let (session, is_new) = prepare_session(args)?;
    if is_new {
        args.session.root().make_latest(&session)?;
    }
    Ok(session)
}

async fn run_head(args: &StartArgs, session: &Session) -> anyhow::Result<()> {
    let token = args.session.token_for(session)?;
    if args.recover {
        take_over_dead_head(session)?;
    }
    let cluster = match &args.autoscaler {
        Some(path) => Some(ClusterConfig::load(path)?),
        None => None,
    };
    let provider = match &cluster {
        Some(cluster) => Some(
            cluster
                .provider(&args.session.temp_dir)
                .await
                .context("making the autoscaler's node provider")?,
        ),
        None => None,
    };
    let listener = bind(head_bind_address(args, session)?).await?;
    let ip = listener.local_addr()?.ip();
    let head_address = listener.local_addr()?.to_string();
    session.write_head_address(&head_address)?;
    let (stop_head, head_stopped) = tokio::sync::oneshot::channel::<()>();
    let launchable = cluster.as_ref().map(ClusterConfig::launchable).unwrap_or_default();
    let head_config = args.head_config(token.clone(), session.dir(), launchable);
    let head_task = tokio::spawn(raylet_head::run(head_config, listener, async {
        let _ = head_stopped.await;
    }));
    let (stop_dashboard, _) = start_dashboard(args, session, ip, &head_address, &token).await?;
    let head_node = HeadNode::start_or_find(args, session, &head_address, &token).await?;
    let autoscaler = match (cluster, provider) {
        (Some(cluster), Some(provider)) => Some(start_autoscaler(cluster, provider, &head_address, &token)?),
        _ => None,
    };
    record_and_report_ready(args, session, ProcessRole::Head, &head_address, "")?;
    termination_signal()?.await;
    head_node.stop().await;
    session.remove_process(std::process::id());
    if let Some((stop_autoscaler, autoscaler)) = autoscaler {
        let _ = stop_autoscaler.send(());
        let _ = autoscaler.await;
    }
    let _ = stop_head.send(());
    let _ = stop_dashboard.send(());
    head_task.await??;
    tracing::info!("raylet stopped");
    Ok(())
}

/// Runs the cluster config's autoscaler beside the head until the returned
/// sender fires; it then terminates the nodes it launched.
fn start_autoscaler(
    cluster: ClusterConfig,
    provider: Arc<dyn NodeProvider>,
    head_address: &str,
    token: &AuthToken,
) -> anyhow::Result<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)> {
    let config = MonitorConfig {
        head_address: head_address.to_string(),
        token: token.clone(),
        interval: cluster.interval()?,
        provider_kind: cluster.provider_kind().to_string(),
    };
    tracing::info!(cluster = %cluster.cluster_name, provider = cluster.provider_kind(), "starting the autoscaler");
    let monitor = Monitor::new(cluster.autoscaler(), provider, config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(monitor.run(async {
        let _ = stopped.await;
    }));
    Ok((stop, task))
}

/// An HTTP server of this process: what stops it, and its address (none
/// when its port was taken).
type HttpServer = (tokio::sync::oneshot::Sender<()>, Option<String>);

/// Binds `ip:port` for the HTTP server `what` and runs `serve` on it until
/// the returned sender fires; a port in use is logged and skipped.
async fn start_http<F>(
    what: &str,
    ip: IpAddr,
    port: u16,
    serve: impl FnOnce(TcpListener, Pin<Box<dyn Future<Output = ()> + Send>>) -> F,
) -> anyhow::Result<HttpServer>
where
    F: Future<Output = std::io::Result<()>> + Send + 'static,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = match TcpListener::bind(SocketAddr::new(ip, port)).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!(port, "no {what}: binding its port failed: {error}");
            return Ok((stop, None));
        }
    };
    let address = listener.local_addr()?.to_string();
    tracing::info!(%address, "{what} listening");
    let served = serve(
        listener,
        Box::pin(async {
            let _ = stopped.await;
        }),
    );
    let what = what.to_string();
    tokio::spawn(async move {
        if let Err(error) = served.await {
            tracing::error!("the {what} stopped: {error}");
        }
    });
    Ok((stop, Some(address)))
}

/// Starts the head's HTTP server on `ip` and --dashboard-port, recording
/// its address in the session.
async fn start_dashboard(
    args: &StartArgs,
    session: &Session,
    ip: IpAddr,
    head_address: &str,
    token: &AuthToken,
) -> anyhow::Result<HttpServer> {
    let (head, token) = (head_address.to_string(), token.clone());
    let server = start_http("dashboard", ip, args.dashboard_port, |listener, shutdown| {
        raylet_dashboard::run(listener, head, token, shutdown)
    })
    .await?;
    if let Some(address) = &server.1 {
        session.write_dashboard_address(address)?;
    }
    Ok(server)
}

/// Serves a joining node's `/metrics` on `ip` and --metrics-port.
async fn start_node_metrics(args: &StartArgs, ip: IpAddr, token: &AuthToken) -> anyhow::Result<HttpServer> {
    let token = token.clone();
    start_http("/metrics endpoint", ip, args.metrics_port, |listener, shutdown| {
        raylet_dashboard::serve_node_metrics(listener, token, shutdown)
    })
    .await
}

/// Before a head recovers its session: fails while the session's head still
/// runs; else removes the dead head's record.
fn take_over_dead_head(session: &Session) -> anyhow::Result<()> {
    let (records, _) = session.processes();
    for record in records.iter().filter(|record| record.role == ProcessRole::Head) {
        if crate::stop::is_raylet_daemon(record.pid) {
            bail!(
                "the head of {} still runs (pid {}); `raylet stop` ends it",
                session.dir().display(),
                record.pid
            );
        }
        session.remove_process(record.pid);
    }
    Ok(())
}

/// Where the head listens: where it listened before when it recovers, so
/// that nodes and drivers find it again; else --node-ip and --port.
fn head_bind_address(args: &StartArgs, session: &Session) -> anyhow::Result<SocketAddr> {
    if args.recover {
        let stored = session
            .read_head_address()?
            .context("the session has no head address to recover")?;
        return stored
            .parse()
            .with_context(|| format!("the session's head address '{stored}'"));
    }
    let ip = args.node_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    Ok(SocketAddr::new(ip, args.port))
}

async fn run_node(args: &StartArgs, resources: ResourceSet, session: &Session) -> anyhow::Result<()> {
    let token = args.session.token_for(session)?;
    let head_address = args.address.clone().unwrap_or_default();
    raylet_proto::channel::endpoint(&head_address).context("--address")?;
    let ip = match args.node_ip {
        Some(ip) => ip,
        None => raylet::local_ip_towards(&head_address)?,
    };
    let listener = bind(SocketAddr::new(ip, 0)).await?;
    let (stop_metrics, metrics) = start_node_metrics(args, ip, &token).await?;
    let mut node_config = args.node_config(&head_address, token, resources, session.dir());
    if let Some(url) = &args.spill_to {
        let bucket = BucketSpill::open(url, node_config.node_id)?;
        node_config = node_config.spill_to(bucket);
    }
    if let Some(metrics) = metrics {
        node_config = node_config.metrics_address(metrics);
    }
    let node = NodeManager::start(node_config, listener)
        .await
        .with_context(|| format!("joining the cluster at {head_address}"))?;
    let address = node.address().to_string();
    let role = match args.head_node {
        true => ProcessRole::HeadNode,
        false => ProcessRole::Node,
    };
    let served = serve_until_signal(args, session, role, &address, node).await;
    let _ = stop_metrics.send(());
    served
}

/// Records the process, reports ready, and runs the node until SIGTERM or SIGINT.
async fn serve_until_signal(
    args: &StartArgs,
    session: &Session,
    role: ProcessRole,
    address: &str,
    node: NodeManager,
) -> anyhow::Result<()> {
    let node_id = node.node_id().to_string();
    record_and_report_ready(args, session, role, address, &node_id)?;
    let result = node.run(termination_signal()?).await;
    session.remove_process(std::process::id());
    tracing::info!("raylet stopped");
    Ok(result?)
}

/// Records this process in the session, so that `raylet stop` finds it, and
/// tells the starting process that it serves.
fn record_and_report_ready(
    args: &StartArgs,
    session: &Session,
    role: ProcessRole,
    address: &str,
    node_id: &str,
) -> anyhow::Result<()> {
    session.record_process(&ProcessRecord {
        pid: std::process::id(),
        role,
        address: address.to_string(),
        node_id: node_id.to_string(),
    })?;
    if let Some(path) = &args.ready_file {
        let ready = ReadyReport::Ready {
            address: address.to_string(),
            node_id: node_id.to_string(),
        };
        ready.write(path)?;
    }
    tracing::info!(%address, ?role, "raylet is ready");
    Ok(())
}

fn termination_signal() -> anyhow::Result<impl Future<Output = ()>> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = interrupt.recv() => tracing::info!("SIGINT received; shutting down"),
        }
    })
}

async fn bind(address: SocketAddr) -> anyhow::Result<TcpListener> {
    match TcpListener::bind(address).await {
        Ok(listener) => Ok(listener),
        Err(e) if e.kind() == ErrorKind::AddrInUse => bail!(
            "port {} on {} is already in use; is a raylet head already running there? \
             (`raylet status` shows it, `raylet stop` ends it), or pick another port with --port",
            address.port(),
            address.ip()
        ),
        Err(e) if e.kind() == ErrorKind::AddrNotAvailable => {
            bail!(
                "cannot bind to {}: {} is not an address of this machine",
                address,
                address.ip()
            )
        }
        Err(e) => Err(e).with_context(|| format!("binding {address}")),
    }
}

fn print_head_started(args: &StartArgs, session: &Session, started: &Started) {
    let address = &started.address;
    let flag = args.session.temp_dir_flag();
    let ip = address.rsplit_once(':').map_or(address.as_str(), |(ip, _)| ip);
    println!("Local node IP: {ip}");
    println!();
    println!("--------------------");
    println!("Raylet runtime started (head pid {}).", started.pid);
    println!("--------------------");
    println!();
    println!("Next steps");
    println!("  To add another node to this raylet cluster, run");
    println!("    raylet start --address='{address}'{flag}");
    println!(
        "  on this machine; on another machine, pass the token in {}:",
        session.token_path().display()
    );
    println!("    RAYLET_TOKEN=<token> raylet start --address='{address}'");
    if ip.starts_with("127.") || ip == "::1" {
        println!("  (the head listens on loopback only: start it with --node-ip <this machine's IP>");
        println!("   to accept nodes from other machines)");
    }
    println!();
    println!("  To connect to this cluster from a raylet program, run it with");
    println!("    RAYLET_ADDRESS='{address}'");
    println!();
    println!("  To see the status of the cluster, use");
    println!("    raylet status{flag}");
    let tls = matches!(raylet_common::tls::current(), Ok(Some(_)));
    if let Ok(Some(dashboard)) = session.read_dashboard_address() {
        let scheme = if tls { "https" } else { "http" };
        println!("  Metrics and the JSON API (with the token as a bearer token) are at");
        println!("    {scheme}://{dashboard}/metrics and {scheme}://{dashboard}/api/nodes");
    }
    if tls {
        println!("  The cluster speaks TLS only: give every raylet command and program");
        println!("  --tls-cert/--tls-key/--tls-ca, or RAYLET_TLS_CERT/KEY/CA.");
    }
    println!();
    println!("  To terminate the raylet runtime, run");
    println!("    raylet stop{flag}");
    println!();
    println!("  Logs: {}", started.log.display());
}

fn print_node_started(args: &StartArgs, started: &Started) {
    let flag = args.session.temp_dir_flag();
    let head = args.address.as_deref().unwrap_or_default();
    println!("Raylet node started (pid {}).", started.pid);
    println!(
        "  node {} serves at {} and joined the head at {head}",
        started.node_id, started.address
    );
    println!("  To see the status of the cluster, use");
    println!("    raylet status --address='{head}'{flag}");
    println!("  To terminate the raylet runtime on this machine, run");
    println!("    raylet stop{flag}");
    println!("  Logs: {}", started.log.display());
}
