//! The HTTP ingress: one [`HttpProxy`] actor per node, serving axum on a
//! thread and runtime of its own (the actor's async methods share the
//! worker's single task thread, which HTTP must not wait on). It serves on
//! [`PROXY_THREADS`] threads, each a current-thread runtime accepting on a
//! clone of the listener within shared connection bounds: a request stays
//! on one thread, with no hand-off between a multi-thread runtime's
//! workers (a no-op request at concurrency 1 ran about 1.5 times as many
//! per second as on one runtime of two workers, on 2 cores).
//!
//! The proxy binds in its constructor, so a port in use fails the actor's
//! creation with the bind error, and [`HttpProxy::address`] reports the
//! bound address (port 0 picks a free one). It lives in the user's binary,
//! not in the head: workers run only the build that created them, and the
//! head stays off the request path.

mod errors;
mod http;

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use raylet_common::auth::AuthToken;
use raylet_common::connection_admission::Admission;
use raylet_common::limits::ServerLimits;
use tokio::sync::watch;

use crate::config::HttpOptions;
use crate::error::ServeError;
use crate::routes::{self, QueueReport, RoutingTable};

/// An HTTP proxy on one node; dropping it stops the server.
#[raylet::actor]
pub struct HttpProxy {
    address: SocketAddr,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

/// Threads serving HTTP, each with a runtime and a clone of the listener.
const PROXY_THREADS: usize = 2;

/// Serves HTTP on a thread of its own, in a current-thread runtime, until
/// `stopped` says so or its sender is dropped.
fn serve_on_thread(
    listener: std::net::TcpListener,
    proxy: http::Proxy,
    admission: Arc<Admission>,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let address = listener.local_addr()?;
    std::thread::Builder::new().name("serve-proxy".into()).spawn(move || {
        runtime.block_on(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            let served = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => http::run(listener, proxy, admission, shutdown).await,
                Err(e) => Err(e),
            };
            if let Err(e) = served {
                tracing::error!("the serve proxy at {address} stopped: {e}");
            }
        });
    })
}

#[raylet::actor]
impl HttpProxy {
    pub fn new(options: HttpOptions) -> Result<Self, ServeError> {
        let cluster = raylet::current()?;
        let token = AuthToken::parse(&cluster.token()).map_err(raylet::Error::from)?;
        let host = options.host.unwrap_or_else(|| cluster.node_ip());
        let listener = std::net::TcpListener::bind(SocketAddr::new(host, options.port))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let proxy = http::Proxy::new(token, options);
        let admission = Admission::new(ServerLimits::process().connection_bounds());
        let (stop, stopped) = watch::channel(false);
        let servers = (0..PROXY_THREADS)
            .map(|_| serve_on_thread(listener.try_clone()?, proxy.clone(), admission.clone(), stopped.clone()))
            .collect::<std::io::Result<Vec<_>>>()?;
        tracing::info!(%address, "serve proxy listening");
        Ok(HttpProxy { address, stop, servers })
    }

    /// Where the proxy listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Installs the routing table: the applications to serve and the
    /// replicas of their deployments.
    pub fn install_routes(&self, table: RoutingTable) {
        routes::install(table);
    }

    /// The requests waiting in this proxy's routers: the autoscaler's
    /// input besides the replicas' own.
    pub async fn queued(&self) -> Vec<QueueReport> {
        routes::queued()
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for server in self.servers.drain(..) {
            let _ = server.join();
        }
    }
}
