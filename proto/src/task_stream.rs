//! Task streams: an owner's tasks to one worker and the worker's results
//! back, as length-prefixed protobuf frames over a TCP connection of their
//! own, opened with the cluster token and the protocol version. A frame is
//! sent from any thread without waking the runtime: it is written at once
//! while the socket has room, and only what does not fit waits for a
//! flushing task. gRPC's HTTP/2 framing cost a synchronous call about a
//! fifth of its round trip here; see notes/rpc.md. With TLS, the stream is
//! mutual TLS and every frame goes through the flushing task.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;
use tokio_rustls::TlsStream;
use tonic::{Code, Status};

use crate::channel::{host_and_port, host_of, with_backoff};
use crate::server::MAX_DATA_MESSAGE;
use crate::v1::{TaskBatch, TaskStreamHello, TaskStreamWelcome, WorkerEvents};
use crate::{Error, PROTOCOL_VERSION, Result};
use raylet_common::auth::AuthToken;
use raylet_common::tls;

/// How long either side waits for the other's opening frame.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const LENGTH_PREFIX: usize = 4;
/// What a reader sets aside at most before a frame's bytes arrive, so that
/// a bogus length does not allocate a gigabyte.
const MAX_RESERVE: usize = 1 << 20;
/// The largest opening frame: a token and a version, or a refusal. Until a
/// stream is admitted, a peer cannot make either side set aside more.
const MAX_OPENING_FRAME: usize = 64 << 10;

/// The owner's end: tasks out, results in.
pub type TaskSender = FrameSender<TaskBatch>;
pub type EventReader = FrameReader<WorkerEvents>;
/// The worker's end: tasks in, results out.
pub type TaskReader = FrameReader<TaskBatch>;
pub type EventSender = FrameSender<WorkerEvents>;

/// Opens a task stream to the worker at `address`, retrying the connection
/// until `patience` has passed.
pub async fn open(address: &str, token: &AuthToken, patience: Duration) -> Result<(TaskSender, EventReader)> {
    let bare = host_and_port(address)?;
    let socket = with_backoff(address, patience, || TcpStream::connect(bare)).await?;
    socket.set_nodelay(true)?;
    let (read, mut write) = match tls::current()? {
        Some(tls) => split_tls(TlsStream::Client(tls.connect(host_of(bare), socket).await?)),
        None => split_plain(socket),
    };
    let hello = TaskStreamHello {
        token: token.expose().to_string(),
        protocol_version: PROTOCOL_VERSION,
    };
    write.write_all(&encode_frame(&hello)).await?;
    let mut events = FrameReader::new(read);
    let welcome: TaskStreamWelcome = within_handshake(address, events.next_as()).await?;
    if welcome.refusal_code != 0 {
        return Err(Status::new(Code::from(welcome.refusal_code), welcome.refusal).into());
    }
    Ok((FrameSender::new(write), events.admitted()))
}

/// Admits a task stream that an owner opened on `socket`: checks its token
/// and protocol version, and tells it whether it may send tasks.
pub async fn accept(socket: TcpStream, token: &AuthToken) -> Result<(TaskReader, EventSender)> {
    socket.set_nodelay(true)?;
    let peer = socket
        .peer_addr()
        .map_or_else(|_| "a peer".to_string(), |a| a.to_string());
    let (read, mut write) = match tls::current()? {
        Some(tls) => split_tls(TlsStream::Server(accept_tls(&tls, socket, &peer).await?)),
        None => split_plain(socket),
    };
    let mut tasks = FrameReader::new(read);
    let hello: TaskStreamHello = within_handshake(&peer, tasks.next_as()).await?;
    let version = hello.protocol_version.to_string();
    let admitted = token.admit(Some(hello.token.as_bytes()), Some(&version));
    let welcome = match &admitted {
        Ok(()) => TaskStreamWelcome::default(),
        Err(error) => {
            let status = Status::from(error.clone());
            TaskStreamWelcome {
                refusal_code: status.code() as i32,
                refusal: status.message().to_string(),
            }
        }
    };
    write.write_all(&encode_frame(&welcome)).await?;
    admitted?;
    Ok((tasks.admitted(), FrameSender::new(write)))
}

async fn accept_tls(
    tls: &tls::ClusterTls,
    socket: TcpStream,
    peer: &str,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, tls.stream_acceptor().accept(socket)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) => Err(Error::Unauthenticated(format!("TLS with {peer} failed: {error}"))),
        Err(_) => Err(Error::DeadlineExceeded(format!(
            "{peer} did not complete TLS within {:?}",
            tls::HANDSHAKE_TIMEOUT
        ))),
    }
}

/// The bytes read from a stream, plain or TLS.
type ReadSide = Box<dyn AsyncRead + Send + Unpin>;

fn split_plain(socket: TcpStream) -> (ReadSide, Writer) {
    let (read, write) = socket.into_split();
    (Box::new(read), Writer::Plain(write))
}

fn split_tls(stream: TlsStream<TcpStream>) -> (ReadSide, Writer) {
    let (read, write) = tokio::io::split(stream);
    (Box::new(read), Writer::Tls(tokio::sync::Mutex::new(write)))
}

/// Where a stream's frames are written: a plain socket, written from any
/// thread at once; or TLS, written by the flushing task.
enum Writer {
    Plain(OwnedWriteHalf),
    Tls(tokio::sync::Mutex<WriteHalf<TlsStream<TcpStream>>>),
}

impl Writer {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
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

async fn within_handshake<T>(peer: &str, opening: impl Future<Output = Result<Option<T>>>) -> Result<T> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, opening).await {
        Ok(Ok(Some(frame))) => Ok(frame),
        Ok(Ok(None)) => Err(Error::Unavailable(format!(
            "{peer} closed the task stream before it opened"
        ))),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(Error::DeadlineExceeded(format!(
            "{peer} did not open the task stream within {HANDSHAKE_TIMEOUT:?}"
        ))),
    }
}

/// A message as a frame: its length, big-endian, then its bytes.
fn encode_frame(message: &impl Message) -> Vec<u8> {
    let length = message.encoded_len();
    let mut frame = Vec::with_capacity(LENGTH_PREFIX + length);
    frame.put_u32(length as u32);
    message.encode(&mut frame).expect("a Vec grows to fit the message");
    frame
}

/// Reads frames of `M` from a stream.
pub struct FrameReader<M> {
    socket: ReadSide,
    buffer: BytesMut,
    max_frame: usize,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message + Default> FrameReader<M> {
    /// A reader that takes only an opening frame until [`Self::admitted`].
    fn new(socket: ReadSide) -> Self {
        FrameReader {
            socket,
            buffer: BytesMut::new(),
            max_frame: MAX_OPENING_FRAME,
            _message: PhantomData,
        }
    }

    /// Takes frames up to [`MAX_DATA_MESSAGE`] from now on.
    fn admitted(mut self) -> Self {
        self.max_frame = MAX_DATA_MESSAGE;
        self
    }

    /// The next message; `None` once the peer closed the stream between
    /// frames. Cancel-safe: bytes read stay for the next call.
    pub async fn message(&mut self) -> Result<Option<M>> {
        self.next_as().await
    }

    async fn next_as<T: Message + Default>(&mut self) -> Result<Option<T>> {
        loop {
            if let Some(frame) = self.next_frame()? {
                let message = T::decode(frame)
                    .map_err(|e| Error::InvalidArgument(format!("a task stream frame is garbled: {e}")))?;
                return Ok(Some(message));
            }
            if self.socket.read_buf(&mut self.buffer).await? == 0 {
                return match self.buffer.is_empty() {
                    true => Ok(None),
                    false => Err(Error::Unavailable("the task stream ended inside a frame".into())),
                };
            }
        }
    }

    fn next_frame(&mut self) -> Result<Option<Bytes>> {
        let Some(prefix) = self.buffer.get(..LENGTH_PREFIX) else {
            return Ok(None);
        };
        let length = u32::from_be_bytes(prefix.try_into().expect("four bytes")) as usize;
        if length > self.max_frame {
            return Err(Error::InvalidArgument(format!(
                "a task stream frame of {length} bytes is over the limit of {}",
                self.max_frame
            )));
        }
        let missing = (LENGTH_PREFIX + length).saturating_sub(self.buffer.len());
        if missing > 0 {
            self.buffer.reserve(missing.min(MAX_RESERVE));
            return Ok(None);
        }
        self.buffer.advance(LENGTH_PREFIX);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }
}

/// Sends frames of `M` on a stream, from any thread. Clones send on the
/// same stream; the last one to go closes it once its frames are out.
pub struct FrameSender<M> {
    shared: Arc<SenderShared>,
    _message: PhantomData<fn(M)>,
}

impl<M> Clone for FrameSender<M> {
    fn clone(&self) -> Self {
        FrameSender {
            shared: self.shared.clone(),
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
    fn new(writer: Writer) -> Self {
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
            _message: PhantomData,
        }
    }

    /// Whether `other` sends on the same stream.
    pub fn same_stream(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Sends one message, in order after those sent before.
    pub fn send(&self, message: &M) -> std::result::Result<(), StreamClosed> {
        self.shared.send(&encode_frame(message))
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

    async fn flush_plain(&self, socket: &OwnedWriteHalf) {
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
fn write_now(socket: &OwnedWriteHalf, bytes: &[u8]) -> std::io::Result<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_opened_without_the_clusters_token_is_refused() {
        let token = AuthToken::generate();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server_token = token.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let _ = accept(socket, &server_token).await;
            }
        });
        let patience = Duration::from_secs(2);
        for presented in [AuthToken::generate(), AuthToken::parse(&"0".repeat(64)).unwrap()] {
            let refused = open(&address, &presented, patience).await.err();
            assert!(matches!(refused, Some(crate::Error::Unauthenticated(_))), "{refused:?}");
        }
        assert!(open(&address, &token, patience).await.is_ok());
    }

    #[tokio::test]
    async fn an_opening_frame_over_its_bound_is_refused_before_its_bytes_arrive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut peer = TcpStream::connect(address).await.unwrap();
        let (socket, _) = listener.accept().await.unwrap();
        peer.write_all(&(512u32 << 20).to_be_bytes()).await.unwrap();
        let refused = accept(socket, &AuthToken::generate()).await.err().unwrap().to_string();
        assert!(refused.contains("over the limit of 65536"), "{refused}");
    }
}
