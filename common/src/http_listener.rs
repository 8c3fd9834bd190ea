//! The cluster's HTTP servers (the dashboard, the metrics endpoint, Serve's
//! proxies): connections within this process's bounds (see
//! [`crate::connection_admission`]), over TLS when the process has it, and
//! served so that a slow or stalled peer holds little for long. HTTPS asks
//! for no client certificate (browsers, scrapers and HTTP clients have
//! none): each server checks the cluster token on the routes it guards and
//! then calls [`crate::connection_admission::prove_connection`].
//!
//! What a peer can make a server hold, and for how long:
//! - a request's headers must arrive within [`HEADER_TIMEOUT`], and an
//!   HTTP/1 connection waiting for its next request is closed after it too;
//! - a connection with no request in flight for [`IDLE_TIMEOUT`] (an idle
//!   HTTP/2 connection, or one that never finished its preface) is closed;
//! - at most [`STREAMS_PER_CONNECTION`] HTTP/2 streams at once per connection;
//! - a request body whose next bytes take longer than [`BODY_STALL`] fails;
//! - a `Content-Length` over the server's body bound gets 413 before a byte
//!   of the body is read, and a body that grows past it fails;
//! - the bodies every request of the process has received and not yet
//!   answered count against one budget (`RAYLET_HTTP_BODY_BUDGET_BYTES`,
//!   256 MiB by default), of which one client address may hold a quarter
//!   ([`CLIENT_SHARE_OF_BUDGET`]): a body that would go over either fails,
//!   and its request gets an error answer instead of waiting for room, so
//!   one client's slow uploads leave room for everybody else's.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::connection_admission::{Admission, ConnectionInfo, CountedStream, LimitedIncoming, Slot};
use crate::limits::ServerLimits;
use crate::tls::{self, ClusterTls};
use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_stream::StreamExt;
use tower_service::Service;

/// How long a request's headers may take to arrive, and how long an HTTP/1
/// connection may wait for its next request.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may have no request in flight.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a request body may go without sending a byte.
pub const BODY_STALL: Duration = Duration::from_secs(10);
/// Concurrent HTTP/2 streams on one connection.
pub const STREAMS_PER_CONNECTION: u32 = 64;
/// How long a closing connection may take to finish its requests.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How often a connection checks whether it has been idle too long.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// The share of the body budget that one client address may hold: 1/4.
pub const CLIENT_SHARE_OF_BUDGET: u64 = 4;
/// The default budget of request bodies received and not yet answered.
const DEFAULT_BODY_BUDGET: u64 = 256 << 20;
/// The largest header block of an HTTP/2 request.
const MAX_HEADER_LIST: u32 = 64 << 10;

/// What one server lets a request send.
#[derive(Clone, Copy, Debug)]
pub struct HttpBounds {
    /// The largest request body, announced or received.
    pub max_body_bytes: u64,
    /// An upload route that takes larger bodies than the rest.
    pub upload_route: Option<UploadRoute>,
}

/// Requests of `method` whose path starts with `path_prefix`: a route
/// that takes bodies of up to `max_body_bytes`, bounding them tighter
/// itself where it can say why (it is behind the server's token check, so
/// only a client that has the token sends it a byte).
#[derive(Clone, Copy, Debug)]
pub struct UploadRoute {
    pub method: &'static str,
    pub path_prefix: &'static str,
    pub max_body_bytes: u64,
}

impl Default for HttpBounds {
    /// Enough for the forms and queries the dashboard and metrics take.
    fn default() -> Self {
        HttpBounds {
            max_body_bytes: 64 << 10,
            upload_route: None,
        }
    }
}

impl HttpBounds {
    /// The largest body `request` may send.
    fn for_request<B>(&self, request: &Request<B>) -> u64 {
        match self.upload_route {
            Some(route)
                if request.method().as_str() == route.method && request.uri().path().starts_with(route.path_prefix) =>
            {
                route.max_body_bytes
            }
            _ => self.max_body_bytes,
        }
    }
}

/// Serves `app` on `listener` with the default bounds until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener, app, HttpBounds::default(), shutdown).await
}

/// Serves `app` on `listener` within `bounds` until `shutdown` resolves;
/// then lets requests in flight finish for a few seconds.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    bounds: HttpBounds,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let admission = Admission::new(ServerLimits::process().connection_bounds());
    serve_admitted(listener, app, bounds, admission, shutdown).await
}

/// [`serve_with`], counting connections in `admission`: one server that
/// accepts on several threads, each with its own runtime and a clone of
/// the listener, shares the process's connection bounds between them.
pub async fn serve_admitted(
    listener: TcpListener,
    app: Router,
    bounds: HttpBounds,
    admission: Arc<Admission>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let tls = tls::current().map_err(|e| io::Error::other(e.to_string()))?;
    let mut connections = HttpListener::start(listener, tls, admission)?;
    let (stopping, stop) = watch::channel(false);
    let mut served = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = connections.ready.recv() => {
                let Some(accepted) = accepted else { break };
                served.spawn(serve_connection(accepted, app.clone(), bounds, stop.clone()));
            }
            Some(_) = served.join_next(), if !served.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(connections);
    let _ = stopping.send(true);
    let drained = async { while served.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(CLOSE_GRACE + IDLE_CHECK, drained).await;
    Ok(())
}

/// A connection, plain or TLS.
pub trait Connection: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Connection for T {}

/// An admitted connection: its bytes, its peer and its place.
struct Accepted {
    io: Box<dyn Connection>,
    peer: SocketAddr,
    slot: Arc<Slot>,
}

/// Connections admitted within the bounds, TLS handshakes done, from a
/// task that accepts them (so that a slow handshake holds up no other).
struct HttpListener {
    ready: mpsc::Receiver<Accepted>,
    accepting: tokio::task::JoinHandle<()>,
}

impl HttpListener {
    fn start(listener: TcpListener, tls: Option<Arc<ClusterTls>>, admission: Arc<Admission>) -> io::Result<Self> {
        let (admitted, ready) = mpsc::channel(64);
        let incoming = LimitedIncoming::sharing(listener, admission);
        let accepting = tokio::spawn(accept_all(incoming, tls, admitted));
        Ok(HttpListener { ready, accepting })
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
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        let slot = stream.slot().clone();
        match &tls {
            None => {
                let accepted = Accepted {
                    io: Box::new(stream),
                    peer,
                    slot,
                };
                if admitted.send(accepted).await.is_err() {
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
    let slot = stream.slot().clone();
    match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, tls.http_acceptor().accept(stream)).await {
        Ok(Ok(stream)) => {
            let _ = admitted
                .send(Accepted {
                    io: Box::new(stream),
                    peer,
                    slot,
                })
                .await;
        }
        Ok(Err(error)) => tracing::debug!(%peer, %error, "an HTTPS handshake failed"),
        Err(_) => tracing::debug!(%peer, "an HTTPS handshake timed out"),
    }
}

/// A connection that, once served, closes its sending side and reads what
/// its peer still sends for a moment before it closes: closing a socket
/// with unread bytes resets it, and the peer may then lose the answer it
/// was sent (a 413 for a body it is still sending).
struct Lingering(Option<Box<dyn Connection>>);

/// How long, and how many bytes, a closing connection reads: enough for a
/// client that sends a body a little over a Serve proxy's 16 MiB bound
/// before it reads the answer (most HTTP clients do), read and dropped.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 << 20;

impl Lingering {
    fn io(&mut self) -> &mut Box<dyn Connection> {
        self.0.as_mut().expect("a connection is only taken when dropped")
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let (Some(io), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        runtime.spawn(linger(io));
    }
}

async fn linger(mut io: Box<dyn Connection>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let drain = async {
        let _ = io.shutdown().await;
        let mut left = LINGER_BYTES;
        let mut buffer = [0; 8192];
        while left > 0 {
            match io.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => left = left.saturating_sub(read),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(self.io()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.io()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.io()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.io()).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.io()).poll_shutdown(cx)
    }
}

/// How many requests a connection has in flight, and since when it has had
/// none.
struct Activity {
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    fn idle_for(&self) -> Duration {
        match self.in_flight.load(Ordering::Acquire) {
            0 => self.idle_since.lock().unwrap_or_else(|p| p.into_inner()).elapsed(),
            _ => Duration::ZERO,
        }
    }
}

/// A request in flight, until its response body is done or dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

fn connection_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(STREAMS_PER_CONNECTION)
        .max_header_list_size(MAX_HEADER_LIST)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
}

/// Serves one connection until it ends, has been idle too long, or the
/// server stops; a connection that does not finish closing in
/// [`CLOSE_GRACE`] is dropped.
async fn serve_connection(accepted: Accepted, app: Router, bounds: HttpBounds, mut stopping: watch::Receiver<bool>) {
    let activity = Activity::new();
    let info = ConnectionInfo {
        remote: Some(accepted.peer),
        slot: accepted.slot,
    };
    let requests = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request| handle(request, app.clone(), info.clone(), activity.clone(), bounds))
    };
    let builder = connection_builder();
    let io = TokioIo::new(Lingering(Some(accepted.io)));
    let connection = builder.serve_connection_with_upgrades(io, requests);
    tokio::pin!(connection);
    let mut closing_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = stopping.changed(), if closing_since.is_none() => {
                connection.as_mut().graceful_shutdown();
                closing_since = Some(Instant::now());
            }
            () = tokio::time::sleep(IDLE_CHECK) => match closing_since {
                Some(since) if since.elapsed() >= CLOSE_GRACE => return,
                Some(_) => {}
                None if activity.idle_for() >= IDLE_TIMEOUT => {
                    connection.as_mut().graceful_shutdown();
                    closing_since = Some(Instant::now());
                }
                None => {}
            },
        }
    }
}

/// One request: refused at once when it announces a body over the bound,
/// else given to `app` with its body bounded, counted in flight until its
/// response body is done.
async fn handle(
    request: Request<Incoming>,
    mut app: Router,
    info: ConnectionInfo,
    activity: Arc<Activity>,
    bounds: HttpBounds,
) -> Result<Response<Body>, Infallible> {
    let in_flight = activity.begin();
    let max_body_bytes = bounds.for_request(&request);
    if let Some(announced) = announced_length(&request)
        && announced > max_body_bytes
    {
        return Ok(too_large(announced, max_body_bytes));
    }
    let client = info.remote.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |peer| peer.ip());
    let charge = Arc::new(BodyCharge::new(client));
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(info);
    let body = BoundedBody::new(body, charge.clone(), max_body_bytes);
    let request = Request::from_parts(parts, Body::new(body));
    let response = app.call(request).await?;
    Ok(response.map(|body| {
        Body::new(AnsweringBody {
            body,
            _in_flight: in_flight,
            _charge: charge,
        })
    }))
}

fn announced_length<B>(request: &Request<B>) -> Option<u64> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A 413 sent before the body is read; the connection closes after it.
fn too_large(announced: u64, limit: u64) -> Response<Body> {
    let message = format!("the request body of {announced} bytes is over this server's limit of {limit} bytes\n");
    Response::builder()
        .status(StatusCode::PAYLOAD_TOO_LARGE)
        .header(header::CONNECTION, "close")
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(message))
        .expect("a fixed response is valid")
}

/// The bytes of request bodies this process has received and not answered,
/// in all and by client address.
struct BodyBudget {
    used: Mutex<BudgetUse>,
    limit: u64,
}

#[derive(Default)]
struct BudgetUse {
    total: u64,
    by_client: HashMap<IpAddr, u64>,
}

static BODY_BUDGET: LazyLock<BodyBudget> = LazyLock::new(|| {
    let variable = "RAYLET_HTTP_BODY_BUDGET_BYTES";
    let limit = match std::env::var(variable).ok().map(|text| text.trim().parse::<u64>()) {
        None => DEFAULT_BODY_BUDGET,
        Some(Ok(bytes)) if bytes > 0 => bytes,
        Some(_) => {
            tracing::warn!("{variable} must be a positive integer; using {DEFAULT_BODY_BUDGET}");
            DEFAULT_BODY_BUDGET
        }
    };
    BodyBudget {
        used: Mutex::default(),
        limit,
    }
});

impl BodyBudget {
    fn used(&self) -> MutexGuard<'_, BudgetUse> {
        self.used.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes `bytes` for `client`, or says the budget or the client's share
    /// of it is spent.
    fn take(&self, client: IpAddr, bytes: u64) -> bool {
        let mut used = self.used();
        let by_client = used.by_client.get(&client).copied().unwrap_or(0);
        if used.total + bytes > self.limit || by_client + bytes > self.limit / CLIENT_SHARE_OF_BUDGET {
            return false;
        }
        used.total += bytes;
        *used.by_client.entry(client).or_default() += bytes;
        true
    }

    fn give_back(&self, client: IpAddr, bytes: u64) {
        let mut used = self.used();
        used.total -= bytes;
        if let Some(held) = used.by_client.get_mut(&client) {
            *held -= bytes;
            if *held == 0 {
                used.by_client.remove(&client);
            }
        }
    }
}

/// What one request's body holds of the budget, given back when the request
/// has been answered.
struct BodyCharge {
    client: IpAddr,
    held: AtomicU64,
}

impl BodyCharge {
    fn new(client: IpAddr) -> Self {
        BodyCharge {
            client,
            held: AtomicU64::new(0),
        }
    }

    /// Takes `bytes` more from the budget, or says it is spent.
    fn take(&self, bytes: u64) -> bool {
        if !BODY_BUDGET.take(self.client, bytes) {
            return false;
        }
        self.held.fetch_add(bytes, Ordering::AcqRel);
        true
    }
}

impl Drop for BodyCharge {
    fn drop(&mut self) {
        let held = *self.held.get_mut();
        if held > 0 {
            BODY_BUDGET.give_back(self.client, held);
        }
    }
}

/// Why a request body was cut off.
#[derive(Debug, thiserror::Error)]
enum BodyRefused {
    #[error("the request body sent nothing for {0:?}")]
    Stalled(Duration),
    #[error("the request body is over this server's limit of {0} bytes")]
    TooLarge(u64),
    #[error("the server holds as many request bodies as it may; retry later")]
    BudgetSpent,
}

/// A request body that fails when it stalls, grows past the bound or would
/// spend more than the budget.
struct BoundedBody {
    body: Incoming,
    stall: Pin<Box<Sleep>>,
    received: u64,
    limit: u64,
    charge: Arc<BodyCharge>,
}

impl BoundedBody {
    fn new(body: Incoming, charge: Arc<BodyCharge>, limit: u64) -> Self {
        BoundedBody {
            body,
            stall: Box::pin(tokio::time::sleep(BODY_STALL)),
            received: 0,
            limit,
            charge,
        }
    }

    fn count(&mut self, bytes: u64) -> Result<(), BodyRefused> {
        self.received += bytes;
        if self.received > self.limit {
            return Err(BodyRefused::TooLarge(self.limit));
        }
        if !self.charge.take(bytes) {
            return Err(BodyRefused::BudgetSpent);
        }
        Ok(())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl HttpBody for BoundedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(refused) = this.count(data.len() as u64)
                {
                    return Poll::Ready(Some(Err(refused.into())));
                }
                let next = tokio::time::Instant::now() + BODY_STALL;
                this.stall.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.stall.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyRefused::Stalled(BODY_STALL).into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A response body that keeps its request counted in flight, and its
/// body's bytes charged, until it is sent or dropped.
struct AnsweringBody {
    body: Body,
    _in_flight: InFlight,
    _charge: Arc<BodyCharge>,
}

impl HttpBody for AnsweringBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_holds_at_most_a_quarter_of_the_body_budget_and_gets_it_back() {
        let budget = BodyBudget {
            used: Mutex::default(),
            limit: 400,
        };
        let (flooder, other) = (IpAddr::from([127, 0, 0, 2]), IpAddr::from([127, 0, 0, 1]));
        assert!(budget.take(flooder, 100));
        assert!(!budget.take(flooder, 1), "a client's share is a quarter");
        assert!(budget.take(other, 100), "the others still have theirs");
        budget.give_back(flooder, 100);
        assert!(budget.take(flooder, 100), "a body answered gives its bytes back");
        assert_eq!(budget.used().total, 200);
        budget.give_back(flooder, 100);
        budget.give_back(other, 100);
        assert!(budget.used().by_client.is_empty());
    }
    use axum::routing::post;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A server whose one route reads the whole body and says how long it was.
    async fn body_length_server(bounds: HttpBounds) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = Router::new().route("/", post(|body: Bytes| async move { body.len().to_string() }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with(listener, app, bounds, async {
            let _ = stopped.await;
        }));
        (address, stop)
    }

    /// What the server sent before it closed the connection (or stopped
    /// answering for `patience`).
    async fn read_until_closed(stream: &mut TcpStream, patience: Duration) -> String {
        let mut answer = Vec::new();
        let mut buffer = [0; 4096];
        loop {
            match tokio::time::timeout(patience, stream.read(&mut buffer)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return String::from_utf8_lossy(&answer).into_owned(),
                Ok(Ok(read)) => answer.extend_from_slice(&buffer[..read]),
            }
        }
    }

    #[tokio::test]
    async fn a_body_announced_over_the_bound_gets_413_before_it_is_read() {
        let (address, _stop) = body_length_server(HttpBounds {
            max_body_bytes: 1 << 20,
            upload_route: None,
        })
        .await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10737418240\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&[7; 64 << 10]).await.unwrap();
        let answer = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(
            answer.contains("10737418240 bytes is over this server's limit of 1048576"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn a_body_that_grows_past_the_bound_is_cut_off() {
        let (address, _stop) = body_length_server(HttpBounds {
            max_body_bytes: 1000,
            upload_route: None,
        })
        .await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let head = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(b"800\r\n").await.unwrap();
        stream.write_all(&[b'a'; 0x800]).await.unwrap();
        stream.write_all(b"\r\n0\r\n\r\n").await.unwrap();
        let answer = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        let status = answer.split_whitespace().nth(1).unwrap_or_default();
        assert!(status.starts_with('4'), "{answer}");
    }

    /// The answer to a POST of `length` bytes to `path`.
    async fn post_of(address: SocketAddr, path: &str, length: usize) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let _ = stream.write_all(&vec![b'a'; length]).await;
        read_until_closed(&mut stream, Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn only_the_upload_route_takes_bodies_over_the_servers_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let length = |body: Bytes| async move { body.len().to_string() };
        let app = Router::new()
            .route("/", post(length))
            .route("/upload/{name}", post(length))
            .layer(axum::extract::DefaultBodyLimit::disable());
        let bounds = HttpBounds {
            max_body_bytes: 1000,
            upload_route: Some(UploadRoute {
                method: "POST",
                path_prefix: "/upload/",
                max_body_bytes: 100_000,
            }),
        };
        let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with(listener, app, bounds, async {
            let _ = stopped.await;
        }));
        let uploaded = post_of(address, "/upload/a", 50_000).await;
        assert!(
            uploaded.starts_with("HTTP/1.1 200") && uploaded.ends_with("50000"),
            "{uploaded}"
        );
        let elsewhere = post_of(address, "/", 50_000).await;
        assert!(elsewhere.starts_with("HTTP/1.1 413"), "{elsewhere}");
        let too_large = post_of(address, "/upload/a", 200_000).await;
        assert!(
            too_large.contains("200000 bytes is over this server's limit of 100000"),
            "{too_large}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_and_an_idle_connection_is_closed() {
        let (address, _stop) = body_length_server(HttpBounds::default()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789";
        stream.write_all(head.as_bytes()).await.unwrap();
        let started = tokio::time::Instant::now();
        let answer = read_until_closed(&mut stream, BODY_STALL * 3).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(started.elapsed() < BODY_STALL * 2, "{:?}", started.elapsed());

        let mut idle = TcpStream::connect(address).await.unwrap();
        let started = tokio::time::Instant::now();
        let nothing = read_until_closed(&mut idle, HEADER_TIMEOUT * 10).await;
        assert_eq!(nothing, "");
        assert!(
            started.elapsed() < HEADER_TIMEOUT * 2,
            "closed after {:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_between_requests_is_closed_after_the_header_timeout() {
        let (address, _stop) = body_length_server(HttpBounds::default()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let request = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
        stream.write_all(request.as_bytes()).await.unwrap();
        let started = tokio::time::Instant::now();
        let answer = read_until_closed(&mut stream, HEADER_TIMEOUT * 10).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\n3"),
            "{answer}"
        );
        assert!(
            started.elapsed() < HEADER_TIMEOUT * 2,
            "closed after {:?}",
            started.elapsed()
        );
    }
}
