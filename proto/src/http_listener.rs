//! Connections for the cluster's HTTP servers (the dashboard, the metrics
//! endpoint, Serve's proxies): within this process's connection bounds, and
//! over TLS when the process has it. HTTPS asks for no client certificate
//! (browsers, scrapers and HTTP clients have none): each server checks the
//! cluster token on the routes it guards.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::limits::{CountedStream, LimitedIncoming, ServerLimits};
use crate::tls::{self, ClusterTls};
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

/// Serves `app` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let tls = tls::current().map_err(|e| io::Error::other(e.to_string()))?;
    let connections = HttpListener::start(listener, tls)?;
    axum::serve(connections, app).with_graceful_shutdown(shutdown).await
}

/// A connection, plain or TLS.
pub trait Connection: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Connection for T {}

type Accepted = (Box<dyn Connection>, SocketAddr);

/// Connections admitted within the bounds, TLS handshakes done, from a
/// task that accepts them (so that a slow handshake holds up no other).
struct HttpListener {
    ready: mpsc::Receiver<Accepted>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl HttpListener {
    fn start(listener: TcpListener, tls: Option<Arc<ClusterTls>>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (admitted, ready) = mpsc::channel(64);
        let incoming = LimitedIncoming::new(listener, ServerLimits::process());
        let accepting = tokio::spawn(accept_all(incoming, tls, admitted));
        Ok(HttpListener {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for HttpListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept_all(mut incoming: LimitedIncoming, tls: Option<Arc<ClusterTls>>, admitted: mpsc::Sender<Accepted>) {
    while let Some(accepted) = incoming.next().await {
        let stream = match accepted {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "accepting an HTTP connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(peer) = stream.connect_info().remote_addr() else {
            continue;
        };
        match &tls {
            None => {
                if admitted.send((Box::new(stream), peer)).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                tokio::spawn(handshake(tls.clone(), stream, peer, admitted.clone()));
            }
        }
    }
}

async fn handshake(tls: Arc<ClusterTls>, stream: CountedStream, peer: SocketAddr, admitted: mpsc::Sender<Accepted>) {
    match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, tls.http_acceptor().accept(stream)).await {
        Ok(Ok(stream)) => {
            let _ = admitted.send((Box::new(stream), peer)).await;
        }
        Ok(Err(error)) => tracing::debug!(%peer, %error, "an HTTPS handshake failed"),
        Err(_) => tracing::debug!(%peer, "an HTTPS handshake timed out"),
    }
}

impl axum::serve::Listener for HttpListener {
    type Io = Box<dyn Connection>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> Accepted {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
