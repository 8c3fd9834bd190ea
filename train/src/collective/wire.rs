//! The links between the ranks of a group: one TCP stream per peer, read
//! and written from different threads at once, and with a peer on the same
//! host a pair of shared-memory pipes that carry the bytes instead (the
//! stream then only says whether the peer lives). Every message is framed
//! with the sequence number of the collective call it belongs to and its
//! length, so ranks that call different collectives fail instead of
//! mixing them up. A rank polls a TCP link briefly before it sleeps on
//! it, as MPI's ranks do.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytemuck::cast_slice_mut;

use super::CollectiveError;
use super::element::{Element, ReduceOp, combine};
use super::shared_memory::{Mapping, PeerLink, PipePair, PipeReader, PipeWriter, RING_BYTES, connect_pipes};

/// Bytes of a frame header: sequence number and payload length.
const HEADER: usize = 16;
/// The largest message a rank should write before it reads, without a
/// second thread: a ring step of a 1 MiB buffer on 2 ranks.
const INLINE_TARGET: usize = 512 << 10;
/// The send buffer a link asks the kernel for, which doubles it (within
/// `net.core.wmem_max`): room for two messages of [`INLINE_TARGET`] in
/// half of it (see [`inline_limit`]).
const SEND_BUFFER: usize = 2 * (INLINE_TARGET + 4096);
/// TCP payloads up to this many bytes are written before reading whatever
/// the send buffer's size: they fit even the kernel's smallest default.
const MIN_INLINE_TCP_SEND: usize = 4096;
/// TCP payloads up to this many bytes go out with their header in one
/// write, so that the peer does not wake for the header alone.
const ONE_WRITE: usize = 64 << 10;
/// How long a rank polls a TCP link for the next bytes before it sleeps.
const POLL: Duration = Duration::from_micros(50);

/// The read and write halves of the streams to every peer; `None` at this
/// rank's own index.
pub(crate) struct Links {
    pub(crate) readers: Vec<Option<Reader>>,
    pub(crate) writers: Vec<Option<Writer>>,
}

pub(crate) struct Reader {
    peer: usize,
    stream: TcpStream,
    /// The pipe the peer writes to, when it is on this host.
    pipe: Option<PipeReader>,
}

pub(crate) struct Writer {
    peer: usize,
    stream: TcpStream,
    /// The largest payload written before reading (see [`inline_limit`]).
    inline_tcp_send: usize,
    /// The pipe this rank writes to, when the peer is on this host.
    pipe: Option<PipeWriter>,
}

/// Closes one link while it is in use, so that a side blocked on it fails.
pub(crate) struct Stopper {
    stream: TcpStream,
    pipes: Vec<Arc<Mapping>>,
}

impl Stopper {
    pub(crate) fn stop(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        self.pipes.iter().for_each(|pipe| pipe.close());
    }
}

impl Links {
    /// Links over `streams` (one per peer, `None` at this rank), whose reads
    /// and writes give up after `timeout`; with `shared_memory`, peers on
    /// this host get pipes as well.
    pub(crate) fn new(
        mut streams: Vec<Option<TcpStream>>,
        timeout: Duration,
        shared_memory: bool,
    ) -> Result<Self, CollectiveError> {
        for (peer, stream) in streams.iter().enumerate() {
            if let Some(stream) = stream {
                set_up(stream, timeout)
                    .map_err(|e| CollectiveError::Rendezvous(format!("setting up the link to rank {peer}: {e}")))?;
            }
        }
        let mut pipes = match shared_memory {
            true => pipes_on_this_host(&mut streams)?,
            false => streams.iter().map(|_| None).collect(),
        };
        let mut readers = Vec::with_capacity(streams.len());
        let mut writers = Vec::with_capacity(streams.len());
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                readers.push(None);
                writers.push(None);
                continue;
            };
            let clone = || {
                stream
                    .try_clone()
                    .map_err(|e| CollectiveError::Rendezvous(format!("setting up the link to rank {peer}: {e}")))
            };
            let link = || -> Result<PeerLink, CollectiveError> {
                Ok(PeerLink {
                    peer,
                    stream: clone()?,
                    timeout,
                })
            };
            let (incoming, outgoing) = match pipes[peer].take() {
                Some(PipePair { outgoing, incoming }) => (
                    Some(PipeReader {
                        mapping: incoming,
                        link: link()?,
                    }),
                    Some(PipeWriter {
                        mapping: outgoing,
                        link: link()?,
                    }),
                ),
                None => (None, None),
            };
            writers.push(Some(Writer {
                peer,
                inline_tcp_send: inline_limit(&stream),
                stream: clone()?,
                pipe: outgoing,
            }));
            readers.push(Some(Reader {
                peer,
                stream,
                pipe: incoming,
            }));
        }
        Ok(Links { readers, writers })
    }

    /// How many links carry their bytes through shared memory.
    pub(crate) fn shared_memory_links(&self) -> usize {
        self.readers
            .iter()
            .flatten()
            .filter(|reader| reader.pipe.is_some())
            .count()
    }

    /// Closes every link, so that peers blocked on this rank fail at once.
    pub(crate) fn shut_down(&self) {
        for reader in self.readers.iter().flatten() {
            let _ = reader.stream.shutdown(Shutdown::Both);
        }
        for peer in 0..self.readers.len() {
            self.pipes_of(peer).iter().for_each(|pipe| pipe.close());
        }
    }

    /// A handle that can close the link to `peer` while it is in use.
    pub(crate) fn stopper(&self, peer: usize) -> Result<Stopper, CollectiveError> {
        let writer = self.writers[peer].as_ref().expect("a rank has no link to itself");
        let stream = writer
            .stream
            .try_clone()
            .map_err(|e| CollectiveError::from_io(peer, e))?;
        Ok(Stopper {
            stream,
            pipes: self.pipes_of(peer),
        })
    }

    fn pipes_of(&self, peer: usize) -> Vec<Arc<Mapping>> {
        let incoming = self.readers[peer]
            .as_ref()
            .and_then(|r| r.pipe.as_ref())
            .map(|p| p.mapping.clone());
        let outgoing = self.writers[peer]
            .as_ref()
            .and_then(|w| w.pipe.as_ref())
            .map(|p| p.mapping.clone());
        incoming.into_iter().chain(outgoing).collect()
    }

    pub(crate) fn reader(&mut self, peer: usize) -> &mut Reader {
        self.readers[peer].as_mut().expect("a rank has no link to itself")
    }

    pub(crate) fn writer(&mut self, peer: usize) -> &mut Writer {
        self.writers[peer].as_mut().expect("a rank has no link to itself")
    }
}

impl Writer {
    /// Whether a message of `len` bytes can be written before this rank
    /// reads, in a group of `world`, without waiting for the peer: it fits a
    /// socket's buffer, or a pipe's ring holds it even with a whole lap of
    /// the ring's messages unread (a peer is never further behind).
    pub(crate) fn sends_without_waiting(&self, len: usize, world: usize) -> bool {
        match self.pipe {
            Some(_) => 2 * world * (len + HEADER) <= RING_BYTES,
            None => len <= self.inline_tcp_send,
        }
    }

    /// Sends one message of collective call `seq`.
    pub(crate) fn send(&mut self, seq: u64, payload: &[u8]) -> Result<(), CollectiveError> {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(&seq.to_le_bytes());
        header[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let peer = self.peer;
        if let Some(pipe) = &mut self.pipe {
            pipe.write_all(&header)?;
            return pipe.write_all(payload);
        }
        let written = match payload.len() <= ONE_WRITE {
            true => self.stream.write_all(&[&header[..], payload].concat()),
            false => self
                .stream
                .write_all(&header)
                .and_then(|()| self.stream.write_all(payload)),
        };
        written.map_err(|e| CollectiveError::from_io(peer, e))
    }
}

impl Reader {
    /// Reads the header of the next message of call `seq`; returns its length.
    pub(crate) fn header(&mut self, seq: u64) -> Result<usize, CollectiveError> {
        let mut header = [0u8; HEADER];
        self.read(&mut header)?;
        let got = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        if got != seq {
            return Err(CollectiveError::OutOfStep {
                peer: self.peer,
                expected: seq,
                got,
            });
        }
        Ok(u64::from_le_bytes(header[8..].try_into().expect("8 bytes")) as usize)
    }

    /// Reads the next message of call `seq` into `into`, which it must fill.
    pub(crate) fn recv_exact(&mut self, seq: u64, into: &mut [u8]) -> Result<(), CollectiveError> {
        let len = self.header(seq)?;
        self.expect_len(len, into.len())?;
        self.read(into)
    }

    /// Reads the next message of call `seq`, whatever its length.
    pub(crate) fn recv_vec(&mut self, seq: u64) -> Result<Vec<u8>, CollectiveError> {
        let len = self.header(seq)?;
        let mut payload = vec![0u8; len];
        self.read(&mut payload)?;
        Ok(payload)
    }

    pub(crate) fn expect_len(&self, got: usize, expected: usize) -> Result<(), CollectiveError> {
        match got == expected {
            true => Ok(()),
            false => Err(CollectiveError::SizeMismatch {
                peer: self.peer,
                expected,
                got,
            }),
        }
    }

    /// Fills `into` from the link.
    pub(crate) fn read(&mut self, into: &mut [u8]) -> Result<(), CollectiveError> {
        let peer = self.peer;
        if let Some(pipe) = &mut self.pipe {
            return pipe.read_exact(into);
        }
        read_polling(&mut self.stream, into).map_err(|e| CollectiveError::from_io(peer, e))
    }

    /// Combines the next `part.len()` elements of the link into `part`:
    /// from a pipe straight out of shared memory, from TCP through a
    /// scratch buffer of `chunk` elements at a time.
    pub(crate) fn reduce_into<T: Element>(
        &mut self,
        part: &mut [T],
        op: ReduceOp,
        chunk: usize,
    ) -> Result<(), CollectiveError> {
        if let Some(pipe) = &mut self.pipe {
            return pipe.reduce_into(part, op);
        }
        let mut scratch = vec![T::zeroed(); chunk.max(1).min(part.len())];
        for part in part.chunks_mut(chunk.max(1)) {
            let scratch = &mut scratch[..part.len()];
            self.read(cast_slice_mut(scratch))?;
            combine(part, scratch, op);
        }
        Ok(())
    }
}

/// Fills `into` from `stream`: polling it without blocking while bytes
/// keep coming, for up to [`POLL`] since the last ones, then blocking.
/// Waking a thread that slept costs about 20 us here, more than a small
/// message's whole trip, and a collective call is a chain of such trips.
fn read_polling(stream: &mut TcpStream, into: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    let mut last_bytes = Instant::now();
    while filled < into.len() && last_bytes.elapsed() < POLL {
        let rest = &mut into[filled..];
        // SAFETY: `rest` is valid for writes of its length; the descriptor
        // is open while `stream` is borrowed.
        let read = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match read {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            count if count > 0 => {
                filled += count as usize;
                last_bytes = Instant::now();
            }
            _ => match std::io::Error::last_os_error() {
                error if error.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
                error if error.kind() == std::io::ErrorKind::Interrupted => {}
                error => return Err(error),
            },
        }
    }
    stream.read_exact(&mut into[filled..])
}

fn set_up(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    socket2::SockRef::from(stream).set_send_buffer_size(SEND_BUFFER)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))
}

/// The largest payload a rank may write on `stream` before it reads: two
/// messages (a peer is at most one call behind) in half the send buffer
/// the kernel gave (it counts its own overhead against the other half),
/// whatever the peer's receive buffer holds.
fn inline_limit(stream: &TcpStream) -> usize {
    let granted = socket2::SockRef::from(stream).send_buffer_size().unwrap_or(0);
    (granted / 4).saturating_sub(HEADER).max(MIN_INLINE_TCP_SEND)
}

/// Pipes with the peers whose streams join this host to itself (both ends
/// on one address); `None` for the others.
fn pipes_on_this_host(streams: &mut [Option<TcpStream>]) -> Result<Vec<Option<PipePair>>, CollectiveError> {
    let mut local: Vec<Option<&mut TcpStream>> = streams
        .iter_mut()
        .map(|stream| stream.as_mut().filter(|stream| same_host(stream)))
        .collect();
    connect_pipes(&mut local).map_err(|e| CollectiveError::Rendezvous(format!("setting up shared memory: {e}")))
}

fn same_host(stream: &TcpStream) -> bool {
    match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) => local.ip() == peer.ip(),
        _ => false,
    }
}
