//! The plain-TCP path of node-to-node transfer, taken whenever the cluster
//! runs without TLS. Through gRPC each chunk is copied into tonic's encode
//! buffer, out of the puller's HTTP/2 and decode buffers and once more into
//! the object, and the source maps the object to slice it, a page fault per
//! 4 KiB: 1 GiB moved at about 45% of one loopback TCP stream. Here the
//! source splices its memfd into the socket through a pipe, which sends its
//! pages by reference, and the puller splices the socket's bytes into a
//! pipe and from the pipe into its own memfd: they are copied once, by the
//! kernel, and mapped nowhere (about 94% of one loopback TCP stream).
//!
//! A puller asks for a range with `OpenTransfer`, a gRPC call that the
//! cluster token authenticates like every other. The answer names the
//! source's transfer port and a ticket of 128 random bits, good for one
//! connection within [`TICKET_LIFETIME`]. The puller sends the ticket first;
//! a connection that sends none within [`TICKET_WAIT`], or another one, is
//! closed unanswered, and the connections without a ticket yet are bounded
//! per client address ([`TRANSFER_CONNECTIONS`]). Then the source sends the range's bytes and closes.
//! Under TLS a plain connection would carry the bytes in clear, so a store
//! with TLS serves no transfer port, and pullers read through `ReadChunks`,
//! as they do from a source that answers `OpenTransfer` with Unimplemented.
//!
//! A source that sends nothing for [`STALL`], or closes early, fails the
//! range with what is left of it, which the pull reads from another source.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use raylet_common::connection_admission::{Admission, ConnectionBounds, CountedStream};
use raylet_proto::v1::TransferTicket;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::{ChunkRange, Failure, Job, PeerClient, Pinned, lock};
use crate::error::{Result, StoreError};
use crate::service::{SharedStore, join};

/// Bytes of a ticket.
const TICKET_LEN: usize = 16;
/// How long a ticket waits for its connection; then its object is unpinned.
const TICKET_LIFETIME: Duration = Duration::from_secs(10);
/// How long a new connection has to send its ticket.
const TICKET_WAIT: Duration = Duration::from_secs(5);
/// How long a puller waits for its connection to a source.
const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// How long either side waits for the other to take or send bytes.
const STALL: Duration = Duration::from_secs(20);
/// Connections a store serves at once: in all, from one address, and from
/// one address without a ticket yet. A new connection over a bound closes
/// its address's oldest one without a ticket, or is closed at once when
/// there is none, so a client without tickets cannot keep pullers out.
const TRANSFER_CONNECTIONS: ConnectionBounds = ConnectionBounds {
    in_all: 256,
    per_client: 128,
    unproven_per_client: 8,
};
/// How long accepting waits after it failed, e.g. out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How many bytes a puller's socket gathers before it wakes the puller.
/// Every arrival wakes an epoll waiter, in the sender's thread on loopback;
/// with one stream and 192 KiB, 1 GiB went node to node at a median 87% of
/// one loopback stream (8 runs), against 80% waking on every arrival, 84%
/// with 128 KiB, about 83% with 256 KiB and 73% with 512 KiB.
const LOW_WATER: usize = 192 << 10;
/// The pipe a puller splices through, and so the most one splice moves:
/// the largest an unprivileged process may ask for by default.
const PIPE_BYTES: i32 = 1 << 20;

type Ticket = [u8; TICKET_LEN];

/// A range of a pinned, sealed object that one connection may read.
struct Ticketed {
    file: File,
    range: Range<u64>,
    _pin: Pinned,
}

/// The transfer port a store serves, once it does, and its open tickets.
#[derive(Default)]
pub(crate) struct Tickets {
    port: OnceLock<u16>,
    open: Mutex<HashMap<Ticket, Ticketed>>,
}

impl Tickets {
    fn redeem(&self, ticket: &Ticket) -> Option<Ticketed> {
        lock(&self.open).remove(ticket)
    }
}

impl SharedStore {
    /// Serves the ranges that `OpenTransfer` gives tickets for on
    /// `listener`, until dropped; the store gives tickets from this call
    /// on. Without TLS only: under TLS this serves nothing, and the store
    /// gives no tickets.
    pub fn serve_transfers(self: Arc<Self>, listener: TcpListener) -> impl Future<Output = Infallible> {
        let port = listener.local_addr().map(|address| address.port());
        let serving = match port {
            Ok(port) if !tls_is_on() => self.transfers.tickets.port.set(port).is_ok(),
            _ => false,
        };
        async move {
            match serving {
                true => self.accept_transfers(listener).await,
                false => std::future::pending().await,
            }
        }
    }

    async fn accept_transfers(self: Arc<Self>, listener: TcpListener) -> Infallible {
        let admission = Admission::new(TRANSFER_CONNECTIONS);
        let mut connections = JoinSet::new();
        loop {
            let accepted = listener.accept().await;
            while connections.try_join_next().is_some() {}
            match accepted {
                Ok((stream, peer)) => match admission.admit(peer.ip()) {
                    Some(slot) => {
                        connections.spawn(self.clone().serve_connection(CountedStream::new(stream, slot)));
                    }
                    None => tracing::warn!(%peer, "too many transfer connections from {}: closing one", peer.ip()),
                },
                Err(error) => {
                    tracing::warn!(%error, "accepting a transfer connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }

    /// Pins `range` of a sealed object for one connection to the transfer
    /// port; `None` when this store serves none.
    pub(crate) async fn open_transfer(self: &Arc<Self>, range: ChunkRange) -> Result<Option<TransferTicket>> {
        let Some(port) = self.transfers.tickets.port.get().copied() else {
            return Ok(None);
        };
        let (store, id) = (self.clone(), range.id);
        let (file, size) = join(tokio::task::spawn_blocking(move || store.pin_file(id))).await?;
        let pin = Pinned::new(self.clone(), id);
        let bytes = range.within(size)?;
        let ticket: Ticket = rand::random();
        let ticketed = Ticketed {
            file,
            range: bytes.start as u64..bytes.end as u64,
            _pin: pin,
        };
        lock(&self.transfers.tickets.open).insert(ticket, ticketed);
        tokio::spawn(self.clone().expire(ticket));
        Ok(Some(TransferTicket {
            object_size: size,
            port: port.into(),
            ticket: ticket.to_vec(),
        }))
    }

    async fn expire(self: Arc<Self>, ticket: Ticket) {
        tokio::time::sleep(TICKET_LIFETIME).await;
        self.transfers.tickets.redeem(&ticket);
    }

    async fn serve_connection(self: Arc<Self>, mut stream: CountedStream) {
        if let Err(error) = self.send_ticketed(&mut stream).await {
            let peer = stream.peer_addr().ok();
            tracing::debug!(?peer, %error, "a transfer connection ended early");
        }
    }

    /// Reads the connection's ticket (failing when it is closed to make room
    /// for a newer one of its client), then sends the ticket's range.
    async fn send_ticketed(&self, stream: &mut CountedStream) -> io::Result<()> {
        let mut ticket = Ticket::default();
        within(TICKET_WAIT, stream.read_exact(&mut ticket)).await?;
        let ticketed = self
            .transfers
            .tickets
            .redeem(&ticket)
            .ok_or_else(|| io::Error::new(io::ErrorKind::PermissionDenied, "an unknown or used ticket"))?;
        stream.slot().prove();
        send_range(stream.get_ref(), &ticketed, &self.served).await
    }
}

/// Sends a ticketed range through a pipe, a pipe's worth at a time: the
/// pages go by reference, as with `sendfile`, whose own pipe holds 64 KiB
/// (in a C test between two processes, 1 GiB went at 89–117% of one
/// loopback stream this way, at 85–111% with `sendfile`).
async fn send_range(stream: &TcpStream, ticketed: &Ticketed, served: &AtomicU64) -> io::Result<()> {
    let pipe = Pipe::new()?;
    let end = ticketed.range.end as i64;
    let mut offset = ticketed.range.start as i64;
    while offset < end {
        let wanted = pipe.capacity.min((end - offset) as usize);
        let moved = splice(
            &ticketed.file,
            Some(&mut offset),
            &pipe.write,
            None,
            wanted,
            SpliceFFlags::SPLICE_F_MOVE,
        )?;
        if moved == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the object ended early"));
        }
        let more = match offset < end {
            true => SpliceFFlags::SPLICE_F_MORE,
            false => SpliceFFlags::empty(),
        };
        send_piped(stream, &pipe, moved, more, served).await?;
    }
    Ok(())
}

/// Moves the `count` bytes in the pipe into the socket, as fast as it
/// takes them, counting them as `served`.
async fn send_piped(
    stream: &TcpStream,
    pipe: &Pipe,
    mut count: usize,
    more: SpliceFFlags,
    served: &AtomicU64,
) -> io::Result<()> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK | more;
    while count > 0 {
        let sending = stream.async_io(Interest::WRITABLE, || {
            Ok(splice(&pipe.read, None, stream, None, count, flags)?)
        });
        match within(STALL, sending).await? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            sent => {
                count -= sent;
                served.fetch_add(sent as u64, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// A pipe whose ends never block, as large as the process may make it.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let capacity =
            fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES)).or_else(|_| fcntl(&write, FcntlArg::F_GETPIPE_SZ))?;
        Ok(Pipe {
            read,
            write,
            capacity: capacity as usize,
        })
    }
}

impl Job {
    /// A ticket for `range` from the source; `None` when it serves no
    /// transfer port.
    pub(super) async fn open_transfer(
        &self,
        peer: &mut PeerClient,
        range: &Range<u64>,
    ) -> Result<Option<TransferTicket>, Failure> {
        match peer.open_transfer(self.read_request(range)).await {
            Ok(ticket) => Ok(Some(ticket.into_inner())),
            Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
            Err(status) => Err(Failure::Source(status.into())),
        }
    }

    /// Reads the ticketed `range` over a connection to the source at
    /// `address`, moving `range.start` past every byte written, so that on
    /// failure it is what is left.
    pub(super) async fn receive_over_tcp(
        &self,
        address: &str,
        ticket: TransferTicket,
        range: &mut Range<u64>,
    ) -> Result<(), Failure> {
        self.check_size(ticket.object_size).map_err(Failure::Source)?;
        let stream = connect(address, &ticket)
            .await
            .map_err(|error| self.source_failure(address, error))?;
        let pipe = Pipe::new().map_err(|error| Failure::Local(StoreError::io("making a pipe")(error)))?;
        let mut inbound = Inbound {
            stream,
            pipe,
            low_water: 0,
        };
        while !range.is_empty() {
            let moved = inbound
                .receive(range.end - range.start)
                .await
                .map_err(|error| self.source_failure(address, error))?;
            self.drain(&inbound.pipe, moved, range.start)
                .await
                .map_err(Failure::Local)?;
            range.start += moved as u64;
            self.store.pulled.fetch_add(moved as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes the `count` bytes in the pipe at `offset` of the object, one
    /// stream at a time, as [`Job::write`] does.
    async fn drain(&self, pipe: &Pipe, count: usize, offset: u64) -> Result<()> {
        let _turn = self.write_turn.lock().await;
        let end = (offset + count as u64) as i64;
        let mut offset = offset as i64;
        while offset < end {
            let left = (end - offset) as usize;
            let written = splice(
                &pipe.read,
                None,
                &self.file,
                Some(&mut offset),
                left,
                SpliceFFlags::empty(),
            );
            let context = || format!("writing pulled object {}", self.id);
            match written {
                Ok(0) => return Err(StoreError::io(context())(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(errno) => return Err(StoreError::io(context())(errno.into())),
            }
        }
        Ok(())
    }

    fn source_failure(&self, address: &str, error: io::Error) -> Failure {
        Failure::Source(raylet_proto::Error::Unavailable(format!(
            "the transfer of object {} from {address}: {error}",
            self.id
        )))
    }
}

/// Connects to the transfer port of the source at `address` and hands in
/// the ticket.
async fn connect(address: &str, ticket: &TransferTicket) -> io::Result<TcpStream> {
    let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidData, message);
    let host_and_port = raylet_proto::channel::host_and_port(address).map_err(|error| invalid(error.to_string()))?;
    let host = raylet_proto::channel::host_of(host_and_port);
    let port = u16::try_from(ticket.port).map_err(|_| invalid(format!("port {} is out of range", ticket.port)))?;
    if ticket.ticket.len() != TICKET_LEN {
        return Err(invalid(format!("a ticket of {} bytes", ticket.ticket.len())));
    }
    let mut stream = within(CONNECT_WAIT, TcpStream::connect((host, port))).await?;
    stream.write_all(&ticket.ticket).await?;
    Ok(stream)
}

/// A puller's connection to a source, the pipe it splices through, and
/// the low-water mark its socket has.
struct Inbound {
    stream: TcpStream,
    pipe: Pipe,
    low_water: usize,
}

impl Inbound {
    /// Moves what the socket holds of the `left` bytes still due, up to a
    /// pipe's worth, into the empty pipe, once [`LOW_WATER`] of them have
    /// arrived; fails when the source closes first.
    async fn receive(&mut self, left: u64) -> io::Result<usize> {
        let wanted = self.pipe.capacity.min(usize::try_from(left).unwrap_or(usize::MAX));
        let low_water = LOW_WATER.min(wanted);
        if low_water != self.low_water {
            set_low_water(&self.stream, low_water)?;
            self.low_water = low_water;
        }
        let (stream, pipe) = (&self.stream, &self.pipe);
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        let receiving = stream.async_io(Interest::READABLE, || {
            Ok(splice(stream, None, &pipe.write, None, wanted, flags)?)
        });
        match within(STALL, receiving).await? {
            0 => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the source closed the connection early",
            )),
            moved => Ok(moved),
        }
    }
}

/// Has the kernel tell that the socket is readable only once `bytes` have
/// arrived (`SO_RCVLOWAT`), or it is closed.
fn set_low_water(stream: &TcpStream, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let length = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is the stream's open socket, and the option's
    // value is a c_int that outlives the call, of the length given.
    let set = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const value).cast(),
            length,
        )
    };
    match set {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// `io` unless it takes longer than `limit`.
async fn within<T>(limit: Duration, io: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    match tokio::time::timeout(limit, io).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("timed out after {limit:?}"),
        )),
    }
}

/// Whether this process speaks TLS, or was told to and cannot.
pub(super) fn tls_is_on() -> bool {
    !matches!(raylet_common::tls::current(), Ok(None))
}
