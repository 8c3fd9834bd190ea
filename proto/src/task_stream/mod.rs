//! Task streams: an owner's tasks to one worker and the worker's results
//! back, as length-prefixed protobuf frames over a connection of their
//! own, opened with the cluster token and the protocol version: a Unix
//! socket when the worker runs on the caller's machine (see
//! [`crate::local_socket`]; not with TLS), TCP otherwise. A frame is
//! sent from any thread without waking the runtime: it is written at once
//! while the socket has room, and only what does not fit waits for a
//! flushing task. gRPC's HTTP/2 framing cost a synchronous call about a
//! fifth of its round trip here; see notes/rpc.md. With TLS, the stream is
//! mutual TLS and every frame goes through the flushing task.

use std::net::SocketAddr;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsStream;
use tonic::{Code, Status};

use crate::channel::{host_and_port, host_of, with_backoff};
use crate::local_socket;
use crate::v1::{TaskBatch, TaskStreamHello, TaskStreamWelcome, WorkerEvents};
use crate::{Error, PROTOCOL_VERSION, Result};
use raylet_common::auth::AuthToken;
use raylet_common::tls;

pub(crate) use self::frames::{FrameBuffer, Reading, encode_frame};
use self::frames::{LocalSocket, ReadSide};
use self::local_reader::LocalStream;
use self::sender::{PlainWriter, Writer};

pub use self::frames::{FrameReader, messages_of};
pub use self::local_reader::{EventHandler, read_last_sent_until};
pub use self::sender::{FrameSender, StreamClosed};

pub use self::spin::{SPIN, spin_before_parking, wake_spinning};

mod frames;
mod local_reader;
mod sender;
mod spin;

/// How long either side waits for the other's opening frame.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    if let Some(socket) = connect_local(bare).await {
        return open_local(address, socket, token).await;
    }
    let tls = tls::current()?;
    let socket = with_backoff(address, patience, || TcpStream::connect(bare)).await?;
    socket.set_nodelay(true)?;
    let (read, mut write) = match tls {
        Some(tls) => split_tls(TlsStream::Client(tls.connect(host_of(bare), socket).await?)),
        None => split_tcp(socket),
    };
    write.write_all(&encode_frame(&hello(token))).await?;
    let mut events = FrameReader::new(read, FrameBuffer::opening());
    welcomed(within_handshake(address, events.next_as()).await?)?;
    events.frames.admit();
    Ok((FrameSender::new(write), events))
}

pub(crate) fn hello(token: &AuthToken) -> TaskStreamHello {
    TaskStreamHello {
        token: token.expose().to_string(),
        protocol_version: PROTOCOL_VERSION,
    }
}

/// The answer to an opening frame, and whether it was admitted: the
/// cluster's token and this protocol version, else a refusal that says
/// which is wrong.
pub(crate) fn welcome_for(hello: &TaskStreamHello, token: &AuthToken) -> (TaskStreamWelcome, Result<()>) {
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
    (welcome, admitted)
}

/// The worker's refusal as an error, if it refused.
pub(crate) fn welcomed(welcome: TaskStreamWelcome) -> Result<()> {
    match welcome.refusal_code {
        0 => Ok(()),
        code => Err(Status::new(Code::from(code), welcome.refusal).into()),
    }
}

/// Opens the stream on a same-node socket: after the opening frames, its
/// caller's end leaves the runtime's watch for reading, so that a reader
/// thread can take its results (see [`FrameReader::deliver`]).
async fn open_local(address: &str, mut socket: UnixStream, token: &AuthToken) -> Result<(TaskSender, EventReader)> {
    socket.write_all(&encode_frame(&hello(token))).await?;
    let mut frames = FrameBuffer::opening();
    welcomed(within_handshake(address, frames.read_message(&mut socket)).await?)?;
    frames.admit();
    let (stream, write) = local_ends(socket)?;
    let sender = FrameSender::new(write).sending_on(&stream);
    Ok((
        sender,
        FrameReader::new(ReadSide::Local(LocalSocket::new(stream)), frames),
    ))
}

/// The Unix socket of the worker at `address` when it runs on this
/// machine and takes connections there; `None` means TCP.
async fn connect_local(address: &str) -> Option<UnixStream> {
    let path = local_socket::socket_for(address.parse::<SocketAddr>().ok()?)?;
    UnixStream::connect(path).await.ok()
}

/// A connection an owner opened to a worker's task stream.
pub enum StreamSocket {
    Tcp(TcpStream),
    /// A caller on this machine, through [`crate::local_socket`].
    Unix(UnixStream),
}

/// Admits a task stream that an owner opened on `socket`: checks its token
/// and protocol version, and tells it whether it may send tasks.
pub async fn accept(socket: StreamSocket, token: &AuthToken) -> Result<(TaskReader, EventSender)> {
    let (peer, (read, mut write)) = match socket {
        StreamSocket::Unix(socket) => {
            let (stream, write) = local_ends(socket)?;
            let read = ReadSide::Local(LocalSocket::new(stream));
            ("a caller on this machine".to_string(), (read, write))
        }
        StreamSocket::Tcp(socket) => {
            socket.set_nodelay(true)?;
            let peer = socket
                .peer_addr()
                .map_or_else(|_| "a peer".to_string(), |a| a.to_string());
            let split = match tls::current()? {
                Some(tls) => split_tls(TlsStream::Server(accept_tls(&tls, socket, &peer).await?)),
                None => split_tcp(socket),
            };
            (peer, split)
        }
    };
    let mut tasks = FrameReader::new(read, FrameBuffer::opening());
    let hello: TaskStreamHello = within_handshake(&peer, tasks.next_as()).await?;
    let (welcome, admitted) = welcome_for(&hello, token);
    write.write_all(&encode_frame(&welcome)).await?;
    admitted?;
    tasks.frames.admit();
    if let ReadSide::Local(local) = &tasks.socket {
        spin::poll_before_parking(&local.stream.socket);
    }
    Ok((tasks, FrameSender::new(write)))
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

fn split_tcp(socket: TcpStream) -> (ReadSide, Writer) {
    let (read, write) = socket.into_split();
    (ReadSide::Async(Box::new(read)), Writer::Plain(PlainWriter::Tcp(write)))
}

/// A same-node socket's ends, out of the runtime's watch until used (see
/// [`PlainWriter::Local`]): the stream its readers share, and its writer.
fn local_ends(socket: UnixStream) -> Result<(Arc<LocalStream>, Writer)> {
    let socket: StdUnixStream = socket.into_std()?;
    socket.set_nonblocking(true)?;
    let write = PlainWriter::local(&socket)?;
    Ok((LocalStream::new(socket), Writer::Plain(write)))
}

fn split_tls(stream: TlsStream<TcpStream>) -> (ReadSide, Writer) {
    let (read, write) = tokio::io::split(stream);
    (
        ReadSide::Async(Box::new(read)),
        Writer::Tls(tokio::sync::Mutex::new(write)),
    )
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
                let _ = accept(StreamSocket::Tcp(socket), &server_token).await;
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
        let refused = accept(StreamSocket::Tcp(socket), &AuthToken::generate())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(refused.contains("over the limit of 65536"), "{refused}");
    }
}
