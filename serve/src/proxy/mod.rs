//! The HTTP ingress: one [`HttpProxy`] actor per node, serving axum on a
//! thread and runtime of its own (the actor's async methods share the
//! worker's single task thread, which HTTP must not wait on).
//!
//! The proxy binds in its constructor, so a port in use fails the actor's
//! creation with the bind error, and [`HttpProxy::address`] reports the
//! bound address (port 0 picks a free one). It lives in the user's binary,
//! not in the head: workers run only the build that created them, and the
//! head stays off the request path.

mod errors;
mod http;

use std::net::SocketAddr;
use std::thread::JoinHandle;

use raylet_common::auth::AuthToken;
use tokio::sync::oneshot;

use crate::config::HttpOptions;
use crate::error::ServeError;
use crate::routes::{self, QueueReport, RoutingTable};

/// An HTTP proxy on one node; dropping it stops the server.
#[raylet::actor]
pub struct HttpProxy {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
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
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("serve-proxy")
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = std::thread::Builder::new().name("serve-proxy".into()).spawn(move || {
            runtime.block_on(async move {
                let shutdown = async {
                    let _ = stopped.await;
                };
                let served = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => http::run(listener, http::Proxy::new(token, options), shutdown).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = served {
                    tracing::error!("the serve proxy at {address} stopped: {e}");
                }
            });
        })?;
        tracing::info!(%address, "serve proxy listening");
        Ok(HttpProxy {
            address,
            stop: Some(stop),
            server: Some(server),
        })
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
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}
