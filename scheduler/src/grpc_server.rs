//! Serves gRPC services on a bound listener until a shutdown future resolves,
//! with the token and protocol checks in front of every call.

use std::future::Future;

use raylet_proto::auth::{AuthToken, ServerAuth};
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::InterceptorLayer;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::Result;

/// Serves `service` on `listener`, authenticating every call with `token`.
pub(crate) async fn serve<S>(
    service: S,
    token: AuthToken,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<()>
where
    S: tower_service::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    Server::builder()
        .layer(InterceptorLayer::new(ServerAuth::new(token)))
        .add_service(service)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// Accepted connections with Nagle's algorithm off: small replies must not
/// wait for a delayed ACK.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}
