//! Admitting connections within the bounds per client and in all, with
//! room kept for the clients that hold the cluster token.
//!
//! A connection is *unproven* from its accept until a request on it passes
//! the token check (gRPC's interceptor, the HTTP servers' token check, a
//! transfer ticket), then *proven*. Every connection counts against its
//! client's bound and the bound in all; unproven ones also against a
//! smaller bound per client. When a new connection would go over a bound,
//! the client's oldest unproven connection is closed to make room, and
//! only when it has none is the new one refused. So a local user without
//! the token who holds idle sockets can delay nobody for longer than it
//! takes them to open that many more: every client of one address (all
//! local users share 127.0.0.1) still gets in, and keeps its connection
//! once its first request is proven. With no one over a bound, nothing is
//! ever closed.
//!
//! A connection must also send its first [`OPENING_BYTES`] (an HTTP/2
//! preface is 24) within [`OPENING_TIMEOUT`], or it is closed: a client
//! that connects and says nothing holds no place for long.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TlsConnectInfo};

/// How many bytes a new connection must send within [`OPENING_TIMEOUT`].
pub const OPENING_BYTES: usize = 24;
/// How long a new connection may take to send its first [`OPENING_BYTES`].
pub const OPENING_TIMEOUT: Duration = Duration::from_secs(10);

/// The bounds one listener admits connections within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionBounds {
    /// Open connections from one IP address.
    pub per_client: usize,
    /// Open connections in all.
    pub in_all: usize,
    /// Unproven connections from one IP address; the oldest is closed to
    /// make room for a new one.
    pub unproven_per_client: usize,
}

/// Connections closed at once because a bound was reached and the client
/// had no unproven connection to give up.
static CONNECTIONS_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    crate::metrics::counter(
        "raylet_connections_refused_total",
        "Connections closed at once because their client or the server had too many open",
        &[],
    )
});

/// Unproven connections closed to make room for a newer one of their client.
static UNPROVEN_CLOSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    crate::metrics::counter(
        "raylet_connections_unproven_closed_total",
        "Connections that never presented the token, closed to make room for a newer one",
        &[],
    )
});

/// The open connections of one listener, by client.
pub struct Admission {
    bounds: ConnectionBounds,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    open: usize,
    clients: HashMap<IpAddr, ClientConnections>,
}

#[derive(Default)]
struct ClientConnections {
    open: usize,
    /// Oldest first.
    unproven: VecDeque<Arc<Slot>>,
}

/// One admitted connection's place.
pub struct Slot {
    client: IpAddr,
    admission: Weak<Admission>,
    proven: AtomicBool,
    /// Closed from outside to make room: its reads and writes fail.
    closed: AtomicBool,
    /// Given back to the table (by the connection's end or its closing).
    released: AtomicBool,
    /// The task that reads the connection, woken when it is closed.
    reader: Mutex<Option<Waker>>,
}

impl Admission {
    pub fn new(bounds: ConnectionBounds) -> Arc<Self> {
        Arc::new(Admission {
            bounds,
            table: Mutex::new(Table::default()),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection from `client`, closing the client's
    /// oldest unproven connection when a bound is reached; `None` when the
    /// client has none to give up.
    pub fn admit(self: &Arc<Self>, client: IpAddr) -> Option<SlotGuard> {
        let bounds = self.bounds;
        let mut table = self.table();
        loop {
            let open = table.open;
            let entry = table.clients.entry(client).or_default();
            let full = entry.open >= bounds.per_client
                || open >= bounds.in_all
                || entry.unproven.len() >= bounds.unproven_per_client;
            if !full {
                break;
            }
            let Some(oldest) = entry.unproven.pop_front() else {
                CONNECTIONS_REFUSED.with_label_values(&[] as &[&str]).inc();
                return None;
            };
            oldest.close();
            Self::release_locked(&mut table, &oldest);
            UNPROVEN_CLOSED.with_label_values(&[] as &[&str]).inc();
        }
        let slot = Arc::new(Slot {
            client,
            admission: Arc::downgrade(self),
            proven: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            released: AtomicBool::new(false),
            reader: Mutex::new(None),
        });
        table.open += 1;
        let entry = table.clients.entry(client).or_default();
        entry.open += 1;
        entry.unproven.push_back(slot.clone());
        Some(SlotGuard { slot })
    }

    fn release_locked(table: &mut Table, slot: &Arc<Slot>) {
        if slot.released.swap(true, Ordering::AcqRel) {
            return;
        }
        table.open -= 1;
        if let Some(entry) = table.clients.get_mut(&slot.client) {
            entry.open -= 1;
            entry.unproven.retain(|other| !Arc::ptr_eq(other, slot));
            if entry.open == 0 {
                table.clients.remove(&slot.client);
            }
        }
    }

    /// Open connections in all, and unproven ones of `client`.
    #[cfg(test)]
    fn counts(&self, client: IpAddr) -> (usize, usize) {
        let table = self.table();
        let unproven = table.clients.get(&client).map_or(0, |entry| entry.unproven.len());
        (table.open, unproven)
    }
}

impl Slot {
    /// Marks the connection as having passed the token check: it is never
    /// closed to make room.
    pub fn prove(self: &Arc<Self>) {
        if self.proven.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(admission) = self.admission.upgrade() else {
            return;
        };
        let mut table = admission.table();
        if let Some(entry) = table.clients.get_mut(&self.client) {
            entry.unproven.retain(|other| !Arc::ptr_eq(other, self));
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(reader) = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take() {
            reader.wake();
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn wake_on_close(&self, waker: &Waker) {
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        if !reader.as_ref().is_some_and(|held| held.will_wake(waker)) {
            *reader = Some(waker.clone());
        }
    }
}

/// A connection's place, given back when dropped.
pub struct SlotGuard {
    slot: Arc<Slot>,
}

impl SlotGuard {
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(admission) = self.slot.admission.upgrade() {
            Admission::release_locked(&mut admission.table(), &self.slot);
        }
    }
}

fn closed_to_make_room() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed to make room: the client opened more connections without the token than it may",
    )
}

/// Accepted connections, with Nagle's algorithm off, within one listener's
/// bounds (or bounds it shares with the other listeners of one server).
pub struct LimitedIncoming {
    listener: TcpListener,
    admission: Arc<Admission>,
}

impl LimitedIncoming {
    pub fn new(listener: TcpListener, bounds: ConnectionBounds) -> Self {
        LimitedIncoming::sharing(listener, Admission::new(bounds))
    }

    /// Accepts within `admission`, which other listeners may count in too.
    pub fn sharing(listener: TcpListener, admission: Arc<Admission>) -> Self {
        LimitedIncoming { listener, admission }
    }

    fn admit(&self, stream: TcpStream, peer: SocketAddr) -> Option<CountedStream> {
        let Some(slot) = self.admission.admit(peer.ip()) else {
            tracing::debug!(%peer, "refused a connection over the connection bounds");
            return None;
        };
        let _ = stream.set_nodelay(true);
        Some(CountedStream::new(stream, slot))
    }
}

impl tokio_stream::Stream for LimitedIncoming {
    type Item = io::Result<CountedStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.listener.poll_accept(cx) {
                Poll::Ready(Ok((stream, peer))) => {
                    if let Some(counted) = self.admit(stream, peer) {
                        return Poll::Ready(Some(Ok(counted)));
                    }
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Some(Err(error))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A connection that holds its client's place while it is open, fails once
/// closed to make room, and must send its opening bytes in time.
pub struct CountedStream {
    stream: TcpStream,
    guard: SlotGuard,
    opening: Option<Opening>,
}

struct Opening {
    deadline: Pin<Box<Sleep>>,
    read: usize,
}

impl CountedStream {
    pub fn new(stream: TcpStream, guard: SlotGuard) -> Self {
        CountedStream {
            stream,
            guard,
            opening: Some(Opening {
                deadline: Box::pin(tokio::time::sleep(OPENING_TIMEOUT)),
                read: 0,
            }),
        }
    }

    pub fn slot(&self) -> &Arc<Slot> {
        self.guard.slot()
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    /// The socket, for calls that need its descriptor (splicing into it).
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }
}

/// Where a connection comes from and its place: what servers see of it in
/// a request's extensions.
#[derive(Clone)]
pub struct ConnectionInfo {
    pub remote: Option<SocketAddr>,
    pub slot: Arc<Slot>,
}

impl ConnectionInfo {
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote
    }
}

impl Connected for CountedStream {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            remote: self.stream.peer_addr().ok(),
            slot: self.guard.slot().clone(),
        }
    }
}

/// The connection a request came in on, over plain TCP or TLS.
pub fn connection_of(extensions: &http::Extensions) -> Option<&ConnectionInfo> {
    extensions.get::<ConnectionInfo>().or_else(|| {
        extensions
            .get::<TlsConnectInfo<ConnectionInfo>>()
            .map(|info| info.get_ref())
    })
}

/// Marks the connection a request came in on as proven (see the module's
/// doc): call it once the request passed the token check.
pub fn prove_connection(extensions: &http::Extensions) {
    if let Some(connection) = connection_of(extensions) {
        connection.slot.prove();
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.guard.slot.is_closed() {
            return Poll::Ready(Err(closed_to_make_room()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if let Some(opening) = &mut this.opening {
                    opening.read += buf.filled().len() - before;
                    if opening.read >= OPENING_BYTES {
                        this.opening = None;
                    }
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                this.guard.slot.wake_on_close(cx.waker());
                if let Some(opening) = &mut this.opening
                    && opening.deadline.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client sent less than {OPENING_BYTES} bytes in {OPENING_TIMEOUT:?}"),
                    )));
                }
                // A close that came between the check above and the waker's
                // registration would otherwise go unnoticed.
                if this.guard.slot.is_closed() {
                    return Poll::Ready(Err(closed_to_make_room()));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.guard.slot.is_closed() {
            return Poll::Ready(Err(closed_to_make_room()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.guard.slot.is_closed() {
            return Poll::Ready(Err(closed_to_make_room()));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(per_client: usize, in_all: usize, unproven_per_client: usize) -> ConnectionBounds {
        ConnectionBounds {
            per_client,
            in_all,
            unproven_per_client,
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    #[test]
    fn a_new_connection_closes_its_clients_oldest_unproven_one_at_the_bound() {
        let admission = Admission::new(bounds(100, 100, 2));
        let first = admission.admit(A).unwrap();
        let second = admission.admit(A).unwrap();
        let third = admission.admit(A).unwrap();
        assert!(first.slot().is_closed(), "the oldest made room");
        assert!(!second.slot().is_closed() && !third.slot().is_closed());
        assert_eq!(admission.counts(A), (2, 2));
        drop(first);
        assert_eq!(admission.counts(A), (2, 2), "a closed place is given back once");
    }

    #[test]
    fn proven_connections_are_never_closed_to_make_room() {
        let admission = Admission::new(bounds(3, 100, 3));
        let proven = admission.admit(A).unwrap();
        proven.slot().prove();
        let unproven: Vec<_> = (0..2).map(|_| admission.admit(A).unwrap()).collect();
        let newest = admission.admit(A).unwrap();
        assert!(!proven.slot().is_closed());
        assert!(unproven[0].slot().is_closed() && !unproven[1].slot().is_closed());
        assert!(!newest.slot().is_closed());
        newest.slot().prove();
        unproven[1].slot().prove();
        assert!(admission.admit(A).is_none(), "three proven fill the client's bound");
    }

    #[test]
    fn one_clients_unproven_connections_never_close_anothers() {
        let admission = Admission::new(bounds(10, 3, 10));
        let other = admission.admit(B).unwrap();
        other.slot().prove();
        let _mine: Vec<_> = (0..2).map(|_| admission.admit(A).unwrap()).collect();
        assert!(
            admission.admit(B).is_none(),
            "B has room only by closing A's, which it may not"
        );
        assert!(!other.slot().is_closed());
        let again = admission.admit(A);
        assert!(again.is_some(), "A makes room from its own");
    }

    #[tokio::test]
    async fn a_closed_connections_pending_read_fails_at_once() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let admission = Admission::new(bounds(10, 10, 1));
        let _client = TcpStream::connect(address).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut counted = CountedStream::new(stream, admission.admit(A).unwrap());
        let reading = tokio::spawn(async move { counted.read(&mut [0; 8]).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _newer = admission.admit(A).unwrap();
        let read = tokio::time::timeout(Duration::from_secs(2), reading)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_too_little_in_time_fails() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let admission = Admission::new(bounds(10, 10, 10));
        let mut client = TcpStream::connect(address).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut counted = CountedStream::new(stream, admission.admit(A).unwrap());
        client.write_all(&[0; OPENING_BYTES - 1]).await.unwrap();
        let mut buf = [0; 64];
        assert_eq!(counted.read(&mut buf).await.unwrap(), OPENING_BYTES - 1);
        let error = counted.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }
}
