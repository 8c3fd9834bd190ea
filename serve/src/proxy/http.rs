//! The proxy's axum server, on the cluster's HTTP listener (TLS when the
//! cluster has it, a bound on open connections): every method and path
//! goes to one handler that finds the application by the longest route
//! prefix and sends the body, with the request's [`HttpHead`] (method,
//! path below the prefix, query, `Content-Type` and `Accept`), to its
//! ingress deployment's router, within the request timeout. A streaming
//! ingress is answered with its chunks as they come, under the content
//! type it chose for the request. A token check runs first, before the
//! body is read; public applications and `/-/healthz` (for load
//! balancers) skip it. Each answer is counted in the deployment's metrics
//! under its status code.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use raylet_common::auth::AuthToken;
use raylet_common::connection_admission::{Admission, prove_connection};
use raylet_common::http_listener::{self, HttpBounds};
use tokio::net::TcpListener;

use super::errors;
use crate::config::HttpOptions;
use crate::error::ServeError;
use crate::http_messages::{FORWARDED_HEADERS, HttpHead};
use crate::router::Router as DeploymentRouter;
use crate::routes;

/// What the handlers share.
#[derive(Clone)]
pub(super) struct Proxy(Arc<ProxyState>);

struct ProxyState {
    token: AuthToken,
    options: HttpOptions,
}

impl Proxy {
    pub(super) fn new(token: AuthToken, options: HttpOptions) -> Self {
        Proxy(Arc::new(ProxyState { token, options }))
    }
}

/// Serves `listener` until `shutdown` completes, then drains; over TLS
/// when the cluster has it, within the connection bounds of `admission`.
pub(super) async fn run(
    listener: TcpListener,
    proxy: Proxy,
    admission: Arc<Admission>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let bounds = HttpBounds {
        max_body_bytes: proxy.0.options.max_body_bytes as u64,
        upload_route: None,
    };
    let app = Router::new()
        .route(HEALTHZ, axum::routing::get(|| async { "ok\n" }))
        .fallback(serve_request)
        .layer(DefaultBodyLimit::max(proxy.0.options.max_body_bytes))
        .layer(middleware::from_fn_with_state(proxy.clone(), require_token))
        .with_state(proxy);
    http_listener::serve_admitted(listener, app, bounds, admission, shutdown).await
}

/// The proxy's own health check, open to all.
const HEALTHZ: &str = "/-/healthz";

/// Lets through requests for public applications and the health check,
/// and requests that carry the cluster token as `Authorization: Bearer`.
async fn require_token(State(proxy): State<Proxy>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let public = path == HEALTHZ || routes::app_for(path).is_some_and(|route| route.public);
    let bearer = request.headers().get(header::AUTHORIZATION);
    if bearer.is_some_and(|value| proxy.0.token.admits_bearer(value.as_bytes())) {
        prove_connection(request.extensions());
        return next.run(request).await;
    }
    if public {
        return next.run(request).await;
    }
    errors::unauthorized()
}

/// Sends the request to the ingress of the application at the path.
async fn serve_request(
    State(proxy): State<Proxy>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(route) = routes::app_for(uri.path()) else {
        return errors::no_route(uri.path());
    };
    let router = match routes::ingress_router(&route) {
        Ok(router) => router,
        Err(e) => return errors::response(&e),
    };
    let head = HttpHead {
        method: method.to_string(),
        path: routes::below_prefix(uri.path(), &route.route_prefix),
        query: uri.query().map(str::to_string),
        headers: forwarded(&headers),
    };
    let started = Instant::now();
    let timeout = proxy.0.options.request_timeout;
    let response = match route.streaming {
        true => stream_request(&router, &body, &head, timeout).await,
        false => call_request(&router, &body, &head, timeout).await,
    };
    let (app, deployment) = router.names();
    let seconds = started.elapsed().as_secs_f64();
    crate::metrics::record_request(app, deployment, response.status().as_u16(), seconds);
    response
}

/// The request headers a deployment sees.
fn forwarded(headers: &HeaderMap) -> Vec<(String, String)> {
    FORWARDED_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some((name.to_string(), value.to_string()))
        })
        .collect()
}

/// Answers with the deployment's one response.
async fn call_request(router: &Arc<DeploymentRouter>, body: &[u8], head: &HttpHead, timeout: Duration) -> Response {
    let answer = match tokio::time::timeout(timeout, router.call(body, Some(head))).await {
        Ok(answer) => answer,
        Err(_) => Err(ServeError::Timeout(timeout)),
    };
    match answer {
        Ok((body, encoding)) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, encoding.content_type())], body).into_response()
        }
        Err(e) => errors::response(&e),
    }
}

/// Answers with a streaming deployment's chunks as they come (chunked
/// transfer encoding, each chunk written as it comes); the timeout bounds
/// the wait for the first one.
async fn stream_request(router: &Arc<DeploymentRouter>, body: &[u8], head: &HttpHead, timeout: Duration) -> Response {
    let opened = match tokio::time::timeout(timeout, router.call_stream(body, Some(head))).await {
        Ok(opened) => opened,
        Err(_) => Err(ServeError::Timeout(timeout)),
    };
    match opened {
        Ok(opened) => {
            let chunks = opened.chunks.map(|chunk| chunk.map_err(std::io::Error::other));
            let content_type = errors::content_type(&opened.content_type);
            let body = axum::body::Body::from_stream(chunks);
            (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(e) => errors::response(&e),
    }
}
