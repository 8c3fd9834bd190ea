//! Serving gRPC: every server authenticates each call with the cluster token,
//! checks the protocol version, times the call and bounds what each client
//! may hold (see [`raylet_common::limits`]); with TLS configured it serves TLS only.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::service::InterceptorLayer;
use tonic::transport::Server;
use tower_layer::Identity;
use tower_layer::Stack;

use crate::{Error, Result};
use raylet_common::auth::{AuthToken, ServerAuth};
use raylet_common::limits::{ClientRequestLimitLayer, LimitedIncoming, ServerLimits};
use raylet_common::metrics::RpcTimingLayer;
use raylet_common::tls;

/// The largest message a data-carrying service (tasks, objects) accepts.
pub const MAX_DATA_MESSAGE: usize = 1 << 30;

/// The largest header block a client may send: the token and the protocol
/// version need a few hundred bytes.
const MAX_HEADER_BYTES: u32 = 64 << 10;

/// How often an idle connection is pinged, and how long the answer may take
/// before the connection is closed: a vanished client gives back its place.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A server built by [`authenticated`].
pub type AuthenticatedServer =
    Server<Stack<ClientRequestLimitLayer, Stack<RpcTimingLayer, Stack<InterceptorLayer<ServerAuth>, Identity>>>>;

/// A server builder with the token check in front of every service, the
/// call timing behind it, this process's bounds, and TLS when the process
/// has it.
pub fn authenticated(token: AuthToken) -> Result<AuthenticatedServer> {
    let limits = ServerLimits::process();
    let builder = Server::builder()
        .max_concurrent_streams(limits.streams_per_connection)
        .http2_max_header_list_size(MAX_HEADER_BYTES)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    let builder = match tls::current()? {
        Some(tls) => builder
            .tls_config(tls.grpc_server())
            .map_err(|e| Error::InvalidArgument(format!("TLS: {e}")))?,
        None => builder,
    };
    Ok(builder
        .layer(InterceptorLayer::new(ServerAuth::new(token)))
        .layer(RpcTimingLayer)
        .layer(ClientRequestLimitLayer::new(limits.requests_per_client)))
}

/// Accepted connections, with Nagle's algorithm off and this process's
/// connection bounds.
pub fn incoming(listener: TcpListener) -> LimitedIncoming {
    LimitedIncoming::new(listener, ServerLimits::process().connection_bounds())
}

/// How long a stopping server waits for its clients to close their calls
/// and streams before it ends them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Splits `shutdown` for a server: the first future, given to tonic,
/// resolves with it and starts a graceful shutdown; the second resolves
/// [`SHUTDOWN_GRACE`] later, for the caller to stop waiting on clients
/// that keep long-lived streams open.
pub fn bounded_shutdown(shutdown: impl Future<Output = ()>) -> (impl Future<Output = ()>, impl Future<Output = ()>) {
    let (started, grace_begins) = tokio::sync::oneshot::channel::<()>();
    let graceful = async move {
        shutdown.await;
        let _ = started.send(());
    };
    let deadline = async move {
        if grace_begins.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    (graceful, deadline)
}
