//! Serves one gRPC service on a bound listener until a shutdown future
//! resolves, behind the token and protocol checks.

use std::future::Future;

use raylet_proto::auth::AuthToken;
use raylet_proto::server::{authenticated, incoming};
use tokio::net::TcpListener;
use tonic::server::NamedService;

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
    authenticated(token)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}
