//! Serving gRPC: every server authenticates each call with the cluster token,
//! checks the protocol version and times the call, and accepts connections
//! with Nagle off.

use tokio::net::TcpListener;
use tonic::service::InterceptorLayer;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tower_layer::Identity;
use tower_layer::Stack;

use crate::auth::{AuthToken, ServerAuth};
use crate::metrics::RpcTimingLayer;

/// The largest message a data-carrying service (tasks, objects) accepts.
pub const MAX_DATA_MESSAGE: usize = 1 << 30;

/// A server builder with the token check in front of every service, and the
/// call timing behind it.
pub fn authenticated(token: AuthToken) -> Server<Stack<RpcTimingLayer, Stack<InterceptorLayer<ServerAuth>, Identity>>> {
    Server::builder()
        .layer(InterceptorLayer::new(ServerAuth::new(token)))
        .layer(RpcTimingLayer)
}

/// Accepted connections with Nagle's algorithm off: small replies must not
/// wait for a delayed ACK.
pub fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}
