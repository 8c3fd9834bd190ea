//! Bounds on what clients can make a server hold, so that a slow, buggy or
//! hostile client cannot exhaust its memory: open connections per client
//! (by IP address) and in all, with room kept for clients with the token
//! (see [`crate::connection_admission`]), streams per HTTP/2 connection,
//! and requests in flight per client. A connection over a bound is closed
//! at once; a request over one is refused with RESOURCE_EXHAUSTED, saying
//! which. Each bound can be changed for a process by an environment
//! variable.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use crate::connection_admission::{ConnectionBounds, connection_of};
pub use crate::connection_admission::{CountedStream, LimitedIncoming};

/// The bounds of a server process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Open connections from one IP address (`RAYLET_MAX_CONNECTIONS_PER_CLIENT`).
    pub connections_per_client: usize,
    /// Open connections in all (`RAYLET_MAX_CONNECTIONS`).
    pub connections: usize,
    /// Open connections from one IP address that have not yet presented the
    /// token; the oldest is closed to make room for a newer one
    /// (`RAYLET_MAX_UNPROVEN_CONNECTIONS_PER_CLIENT`).
    pub unproven_connections_per_client: usize,
    /// gRPC requests from one IP address being served at once
    /// (`RAYLET_MAX_REQUESTS_PER_CLIENT`).
    pub requests_per_client: usize,
    /// Concurrent HTTP/2 streams on one connection; a client waits for one
    /// to end before it opens more (`RAYLET_MAX_STREAMS_PER_CONNECTION`).
    pub streams_per_connection: u32,
}

impl Default for ServerLimits {
    /// Room for every worker and driver of a large host behind one address.
    fn default() -> Self {
        ServerLimits {
            connections_per_client: 2048,
            connections: 16384,
            unproven_connections_per_client: 256,
            requests_per_client: 8192,
            streams_per_connection: 1024,
        }
    }
}

impl ServerLimits {
    /// This process's bounds: the defaults, changed by the variables set.
    pub fn process() -> ServerLimits {
        static LIMITS: OnceLock<ServerLimits> = OnceLock::new();
        *LIMITS.get_or_init(|| Self::from_lookup(|name| std::env::var(name).ok()))
    }

    /// The bounds a listener admits connections within.
    pub fn connection_bounds(&self) -> ConnectionBounds {
        ConnectionBounds {
            per_client: self.connections_per_client,
            in_all: self.connections,
            unproven_per_client: self.unproven_connections_per_client,
        }
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> ServerLimits {
        let defaults = ServerLimits::default();
        let bound = |name: &str, default: usize| match lookup(name).map(|text| text.trim().parse::<usize>()) {
            None => default,
            Some(Ok(value)) if value > 0 => value,
            Some(_) => {
                tracing::warn!("{name} must be a positive integer; using {default}");
                default
            }
        };
        ServerLimits {
            connections_per_client: bound("RAYLET_MAX_CONNECTIONS_PER_CLIENT", defaults.connections_per_client),
            connections: bound("RAYLET_MAX_CONNECTIONS", defaults.connections),
            unproven_connections_per_client: bound(
                "RAYLET_MAX_UNPROVEN_CONNECTIONS_PER_CLIENT",
                defaults.unproven_connections_per_client,
            ),
            requests_per_client: bound("RAYLET_MAX_REQUESTS_PER_CLIENT", defaults.requests_per_client),
            streams_per_connection: bound(
                "RAYLET_MAX_STREAMS_PER_CONNECTION",
                defaults.streams_per_connection as usize,
            )
            .min(u32::MAX as usize) as u32,
        }
    }
}

/// How many requests each client has in flight, under a bound per client
/// and (optionally) one in all.
struct ClientCounts {
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
    per_client: usize,
    in_all: usize,
}

impl ClientCounts {
    fn new(per_client: usize, in_all: usize) -> Arc<Self> {
        Arc::new(ClientCounts {
            counts: Mutex::new((0, HashMap::new())),
            per_client,
            in_all,
        })
    }

    /// One more for `client`, or none when a bound is reached.
    fn admit(self: &Arc<Self>, client: IpAddr) -> Option<Held> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (total, by_client) = &mut *counts;
        let held = by_client.entry(client).or_default();
        if *held >= self.per_client || *total >= self.in_all {
            return None;
        }
        *held += 1;
        *total += 1;
        Some(Held {
            counts: self.clone(),
            client,
        })
    }
}

/// One request counted against its client until dropped.
struct Held {
    counts: Arc<ClientCounts>,
    client: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = self.counts.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (total, by_client) = &mut *counts;
        *total -= 1;
        if let Some(held) = by_client.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                by_client.remove(&self.client);
            }
        }
    }
}

/// Refuses a client's gRPC request while that client already has
/// `requests_per_client` being served.
#[derive(Clone)]
pub struct ClientRequestLimitLayer {
    requests: Arc<ClientCounts>,
}

impl ClientRequestLimitLayer {
    pub fn new(requests_per_client: usize) -> Self {
        ClientRequestLimitLayer {
            requests: ClientCounts::new(requests_per_client, usize::MAX),
        }
    }
}

impl<S> Layer<S> for ClientRequestLimitLayer {
    type Service = ClientRequestLimit<S>;

    fn layer(&self, inner: S) -> ClientRequestLimit<S> {
        ClientRequestLimit {
            inner,
            requests: self.requests.clone(),
        }
    }
}

/// A service wrapped by [`ClientRequestLimitLayer`].
#[derive(Clone)]
pub struct ClientRequestLimit<S> {
    inner: S,
    requests: Arc<ClientCounts>,
}

type BoxedReply<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, ResBody> Service<http::Request<B>> for ClientRequestLimit<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxedReply<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(client) = client_ip(&request) else {
            return Box::pin(self.inner.call(request));
        };
        let Some(held) = self.requests.admit(client) else {
            let status = Status::resource_exhausted(format!(
                "{client} already has {} requests in flight on this server; retry when some have finished",
                self.requests.per_client
            ));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        let reply = self.inner.call(request);
        Box::pin(async move {
            let reply = reply.await;
            drop(held);
            reply
        })
    }
}

/// The IP address a request came from, over plain TCP or TLS.
fn client_ip<B>(request: &http::Request<B>) -> Option<IpAddr> {
    connection_of(request.extensions())?
        .remote_addr()
        .map(|address| address.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_change_bounds_and_bad_values_keep_defaults() {
        let limits = ServerLimits::from_lookup(|name| match name {
            "RAYLET_MAX_CONNECTIONS_PER_CLIENT" => Some("7".into()),
            "RAYLET_MAX_REQUESTS_PER_CLIENT" => Some("zero".into()),
            "RAYLET_MAX_CONNECTIONS" => Some("0".into()),
            _ => None,
        });
        let defaults = ServerLimits::default();
        assert_eq!(limits.connections_per_client, 7);
        assert_eq!(limits.requests_per_client, defaults.requests_per_client);
        assert_eq!(limits.connections, defaults.connections);
    }

    #[test]
    fn counts_are_bounded_per_client_and_in_all_and_freed_on_drop() {
        let counts = ClientCounts::new(2, 3);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = counts.admit(a).unwrap();
        let _second = counts.admit(a).unwrap();
        assert!(counts.admit(a).is_none(), "a third from one client");
        let _third = counts.admit(b).unwrap();
        assert!(counts.admit(b).is_none(), "a fourth in all");
        drop(first);
        assert!(counts.admit(b).is_some());
    }
}
