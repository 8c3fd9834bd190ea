//! Sending a task stream's frames from any thread: a frame is written at
//! once while the socket has room, and only what does not fit waits for a
//! flushing task of the runtime. With TLS, every frame goes through the
//! flushing task.

use std::io::Write;
use std::marker::PhantomData;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::{Buf, BytesMut};
use prost::Message;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest, WriteHalf};
use tokio::net::{TcpStream, tcp};
use tokio::sync::Notify;
use tokio_rustls::TlsStream;

use super::frames::encode_frame;
use super::local_reader::{LocalStream, sent_on};

/// Where a stream's frames are written: a plain socket, written from any
/// thread at once; or TLS, written by the flushing task.
pub(super) enum Writer {
    Plain(PlainWriter),
    Tls(tokio::sync::Mutex<WriteHalf<TlsStream<TcpStream>>>),
}

/// The writing half of a plain socket.
pub(super) enum PlainWriter {
    Tcp(tcp::OwnedWriteHalf),
    /// Either end of a same-node Unix socket. The runtime watches it only
    /// while a frame waits for room: a Unix socket signals room each time
    /// its peer reads, which would wake a runtime thread at every message.
    Local(StdUnixStream),
}

impl Drop for PlainWriter {
    /// Ends a same-node socket's writing side: its other clones keep the
    /// socket open, so closing this one alone would not tell the peer.
    fn drop(&mut self) {
        if let PlainWriter::Local(socket) = self {
            let _ = socket.shutdown(std::net::Shutdown::Write);
        }
    }
}

impl PlainWriter {
    /// An end of a same-node socket, written through a clone of it.
    pub(super) fn local(socket: &StdUnixStream) -> std::io::Result<Self> {
        Ok(PlainWriter::Local(socket.try_clone()?))
    }

    fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            PlainWriter::Tcp(socket) => socket.try_write(bytes),
            PlainWriter::Local(socket) => (&*socket).write(bytes),
        }
    }

    async fn writable(&self) -> std::io::Result<()> {
        match self {
            PlainWriter::Tcp(socket) => socket.writable().await,
            PlainWriter::Local(socket) => {
                // SAFETY: the clone owns its descriptor and gives the same
                // one while the AsyncFd holds it, which is dropped here.
                let watched = unsafe { AsyncFd::register_with_interest(socket.try_clone()?, Interest::WRITABLE)? };
                watched.writable().await?.retain_ready();
                Ok(())
            }
        }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            PlainWriter::Tcp(socket) => socket.write_all(bytes).await,
            PlainWriter::Local(_) => {
                let mut written = 0;
                while written < bytes.len() {
                    written += write_now(self, &bytes[written..])?;
                    if written < bytes.len() {
                        self.writable().await?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl Writer {
    pub(super) async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Writer::Plain(socket) => socket.write_all(bytes).await,
            Writer::Tls(stream) => {
                let stream = stream.get_mut();
                stream.write_all(bytes).await?;
                stream.flush().await
            }
        }
    }
}

/// Sends frames of `M` on a stream, from any thread. Clones send on the
/// same stream; the last one to go closes it once its frames are out.
pub struct FrameSender<M> {
    shared: Arc<SenderShared>,
    /// The same-node stream whose answers come back to this sender: a
    /// thread that sends on it may read them itself while it waits.
    answers_on: Weak<LocalStream>,
    _message: PhantomData<fn(M)>,
}

impl<M> Clone for FrameSender<M> {
    fn clone(&self) -> Self {
        FrameSender {
            shared: self.shared.clone(),
            answers_on: self.answers_on.clone(),
            _message: PhantomData,
        }
    }
}

/// The stream has failed; nothing more can be sent on it.
#[derive(Debug)]
pub struct StreamClosed;

impl<M: Message> FrameSender<M> {
    /// Takes over `writer`, flushing what does not fit at once on a task of
    /// the current runtime.
    pub(super) fn new(writer: Writer) -> Self {
        let flush = Arc::new(Notify::new());
        let shared = Arc::new(SenderShared {
            writer: Some(writer),
            backlog: Mutex::new(Backlog::default()),
            flush: flush.clone(),
            runtime: tokio::runtime::Handle::current(),
        });
        tokio::spawn(flush_when_told(Arc::downgrade(&shared), flush));
        FrameSender {
            shared,
            answers_on: Weak::new(),
            _message: PhantomData,
        }
    }

    /// A sender whose answers come back on the same-node `stream`.
    pub(super) fn sending_on(mut self, stream: &Arc<LocalStream>) -> Self {
        self.answers_on = Arc::downgrade(stream);
        self
    }

    /// Whether `other` sends on the same stream.
    pub fn same_stream(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Sends one message, in order after those sent before.
    pub fn send(&self, message: &M) -> std::result::Result<(), StreamClosed> {
        self.shared.send(&encode_frame(message))?;
        sent_on(&self.answers_on);
        Ok(())
    }
}

struct SenderShared {
    /// Taken only when the last sender goes.
    writer: Option<Writer>,
    backlog: Mutex<Backlog>,
    flush: Arc<Notify>,
    runtime: tokio::runtime::Handle,
}

/// Bytes sent but not yet written, in order.
#[derive(Default)]
struct Backlog {
    bytes: BytesMut,
    broken: bool,
}

impl SenderShared {
    fn writer(&self) -> &Writer {
        self.writer.as_ref().expect("the writer is taken only on drop")
    }

    fn backlog(&self) -> MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, frame: &[u8]) -> std::result::Result<(), StreamClosed> {
        let mut backlog = self.backlog();
        if backlog.broken {
            return Err(StreamClosed);
        }
        let mut written = 0;
        if let (true, Writer::Plain(socket)) = (backlog.bytes.is_empty(), self.writer()) {
            written = write_now(socket, frame).map_err(|_| {
                backlog.broken = true;
                StreamClosed
            })?;
        }
        if written < frame.len() {
            backlog.bytes.extend_from_slice(&frame[written..]);
            self.flush.notify_one();
        }
        Ok(())
    }

    /// Writes the backlog out as the stream makes room.
    async fn flush_backlog(&self) {
        match self.writer() {
            Writer::Plain(socket) => self.flush_plain(socket).await,
            Writer::Tls(stream) => self.flush_tls(stream).await,
        }
    }

    async fn flush_tls(&self, stream: &tokio::sync::Mutex<WriteHalf<TlsStream<TcpStream>>>) {
        let mut stream = stream.lock().await;
        loop {
            let bytes = {
                let mut backlog = self.backlog();
                if backlog.broken {
                    return;
                }
                std::mem::take(&mut backlog.bytes)
            };
            if bytes.is_empty() {
                return;
            }
            if stream.write_all(&bytes).await.is_err() || stream.flush().await.is_err() {
                self.backlog().broken = true;
                return;
            }
        }
    }

    async fn flush_plain(&self, socket: &PlainWriter) {
        loop {
            {
                let mut backlog = self.backlog();
                if backlog.broken || backlog.bytes.is_empty() {
                    return;
                }
                match write_now(socket, &backlog.bytes) {
                    Ok(written) => backlog.bytes.advance(written),
                    Err(_) => backlog.broken = true,
                }
                if backlog.broken || backlog.bytes.is_empty() {
                    return;
                }
            }
            if socket.writable().await.is_err() {
                self.backlog().broken = true;
            }
        }
    }
}

impl Drop for SenderShared {
    /// Closes the stream once what is left in the backlog is written.
    fn drop(&mut self) {
        self.flush.notify_one();
        let backlog = std::mem::take(&mut *self.backlog());
        match self.writer.take() {
            Some(Writer::Plain(mut socket)) if !backlog.broken && !backlog.bytes.is_empty() => {
                self.runtime.spawn(async move {
                    let _ = socket.write_all(&backlog.bytes).await;
                });
            }
            Some(Writer::Tls(stream)) if !backlog.broken => {
                self.runtime.spawn(async move {
                    let mut stream = stream.into_inner();
                    let _ = stream.write_all(&backlog.bytes).await;
                    let _ = stream.shutdown().await;
                });
            }
            _ => {}
        }
    }
}

/// Writes as much of `bytes` as the socket takes without waiting.
fn write_now(socket: &PlainWriter, bytes: &[u8]) -> std::io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match socket.try_write(&bytes[written..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(count) => written += count,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => return Err(error),
        }
    }
    Ok(written)
}

/// Flushes the backlog each time a sender leaves one, until the senders
/// are gone.
async fn flush_when_told(shared: Weak<SenderShared>, told: Arc<Notify>) {
    loop {
        told.notified().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.flush_backlog().await;
    }
}
