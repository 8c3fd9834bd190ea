//! The owner's end: a thread with an epoll set of its own over the socket
//! and its connections, answering each request from the owner's table at
//! once. A connection's answers are written before more of its requests
//! are read, so a getter that does not read them is not read either, and
//! holds at most one answer here.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use raylet_common::auth::AuthToken;

use crate::ids::ObjectId;
use crate::task_stream::{FrameBuffer, Reading, SPIN, encode_frame, welcome_for};
use crate::v1::{GetObjectReply, GetObjectRequest, ObjectOutcome, TaskStreamHello};
use crate::{Result, local_socket};

/// What the owner has finished for an object, if anything, as it goes on
/// the wire. Called on the server's thread: it must not block.
pub type Lookup = Box<dyn Fn(ObjectId) -> Option<ObjectOutcome> + Send>;

/// Connections served at once at most; more are closed as they come, and
/// their getters ask over gRPC.
const MAX_CONNECTIONS: usize = 1024;

const WAKER: Token = Token(0);
const LISTENER: Token = Token(1);

/// An owner's same-node get service; it stops, and its socket file goes,
/// when dropped.
pub struct OwnerGetServer {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl OwnerGetServer {
    /// Serves same-node gets beside the owner's gRPC port `address` with
    /// `lookup`; `None` (logged) when gets take gRPC only: with TLS, or
    /// when the socket or the thread cannot be had.
    pub fn start(address: SocketAddr, token: AuthToken, lookup: Lookup) -> Option<Self> {
        let path = local_socket::socket_for(address)?;
        let listener = local_socket::bind(address, "object gets")?;
        match Self::spawn(listener, token, lookup, path.clone()) {
            Ok(server) => Some(server),
            Err(error) => {
                tracing::warn!(%error, "object gets from this machine take gRPC");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn spawn(listener: UnixListener, token: AuthToken, lookup: Lookup, path: PathBuf) -> std::io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let fd = listener.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), LISTENER, Interest::READABLE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Serving {
            listener,
            token,
            lookup,
            connections: HashMap::new(),
            next_token: LISTENER.0 + 1,
        };
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("raylet-owner-gets".into())
            .spawn(move || serving.run(poll, &thread_stop))?;
        Ok(OwnerGetServer {
            stop,
            waker,
            thread: Some(thread),
            path,
        })
    }
}

impl Drop for OwnerGetServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if self.waker.wake().is_ok()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The server thread's state.
struct Serving {
    listener: UnixListener,
    token: AuthToken,
    lookup: Lookup,
    connections: HashMap<Token, Connection>,
    next_token: usize,
}

impl Serving {
    /// Serves until `stop`; after each request it polls for [`SPIN`]
    /// before it sleeps, as the getter's next request likely follows.
    fn run(mut self, mut poll: Poll, stop: &AtomicBool) {
        let mut events = Events::with_capacity(256);
        let mut busy_since: Option<Instant> = None;
        while !stop.load(Ordering::Acquire) {
            let timeout = busy_since.map(|_| std::time::Duration::ZERO);
            if let Err(error) = poll.poll(&mut events, timeout) {
                if error.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(%error, "the owner's get thread cannot wait; gets take gRPC");
                    return;
                }
                continue;
            }
            if events.is_empty() {
                busy_since = busy_since.filter(|since| since.elapsed() < SPIN);
                std::thread::yield_now();
                continue;
            }
            for event in &events {
                match event.token() {
                    WAKER => {}
                    LISTENER => self.accept_all(poll.registry()),
                    token => self.serve(poll.registry(), token),
                }
            }
            busy_since = Some(Instant::now());
        }
    }

    fn accept_all(&mut self, registry: &Registry) {
        loop {
            let socket = match self.listener.accept() {
                Ok((socket, _)) => socket,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(error) => {
                    tracing::debug!(%error, "cannot accept a same-node get connection");
                    return;
                }
            };
            if self.connections.len() >= MAX_CONNECTIONS || socket.set_nonblocking(true).is_err() {
                continue;
            }
            let token = Token(self.next_token);
            self.next_token += 1;
            let fd = socket.as_raw_fd();
            if registry.register(&mut SourceFd(&fd), token, Interest::READABLE).is_ok() {
                self.connections.insert(token, Connection::new(socket));
                self.serve(registry, token);
            }
        }
    }

    /// Answers what the connection of `token` asked; closes it once it
    /// ended, was refused, or sent garbage.
    fn serve(&mut self, registry: &Registry, token: Token) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        let open = match connection.serve(&self.token, &self.lookup) {
            Ok(Progress::Open) => connection.watch(registry, token, Interest::READABLE),
            Ok(Progress::Blocked) => connection.watch(registry, token, Interest::READABLE | Interest::WRITABLE),
            Ok(Progress::Closed) => false,
            Err(error) => {
                tracing::debug!(%error, "a same-node get connection is closed");
                false
            }
        };
        if !open && let Some(connection) = self.connections.remove(&token) {
            let _ = registry.deregister(&mut SourceFd(&connection.socket.as_raw_fd()));
        }
    }
}

/// Where a connection is after it was served.
enum Progress {
    /// Everything it sent was answered; it is read again when it sends more.
    Open,
    /// An answer waits for room in the socket.
    Blocked,
    /// It ended, or was refused.
    Closed,
}

/// One getter's connection.
struct Connection {
    socket: UnixStream,
    frames: FrameBuffer,
    admitted: bool,
    /// Refused: closed once the refusal is out.
    refused: bool,
    /// An answer's bytes not written yet.
    unsent: Vec<u8>,
    interest: Interest,
}

impl Connection {
    fn new(socket: UnixStream) -> Self {
        Connection {
            socket,
            frames: FrameBuffer::opening(),
            admitted: false,
            refused: false,
            unsent: Vec::new(),
            interest: Interest::READABLE,
        }
    }

    /// Writes what waits, then answers the requests read, then reads more,
    /// until the socket has nothing more or an answer waits for room.
    fn serve(&mut self, token: &AuthToken, lookup: &Lookup) -> Result<Progress> {
        let mut drained = false;
        loop {
            if !self.flush()? {
                return Ok(Progress::Blocked);
            }
            if self.refused {
                return Ok(Progress::Closed);
            }
            if self.answer_next(token, lookup)? {
                continue;
            }
            if drained {
                return Ok(Progress::Open);
            }
            match self.frames.read_some(&self.socket)? {
                Reading::Drained => drained = true,
                Reading::More => {}
                Reading::Ended => return Ok(Progress::Closed),
            }
        }
    }

    /// Answers the next whole frame read, if there is one: the opening
    /// frame with a welcome or a refusal, then each request with what the
    /// owner has.
    fn answer_next(&mut self, token: &AuthToken, lookup: &Lookup) -> Result<bool> {
        if !self.admitted {
            let Some(hello) = self.frames.next_message::<TaskStreamHello>()? else {
                return Ok(false);
            };
            let (welcome, admitted) = welcome_for(&hello, token);
            self.unsent = encode_frame(&welcome);
            self.admitted = admitted.is_ok();
            self.refused = admitted.is_err();
            return Ok(true);
        }
        let Some(request) = self.frames.next_message::<GetObjectRequest>()? else {
            return Ok(false);
        };
        let outcome = lookup(ObjectId::from_wire(&request.object_id)?);
        self.unsent = encode_frame(&GetObjectReply { outcome });
        Ok(true)
    }

    /// Writes what waits; `false` if some still waits for room.
    fn flush(&mut self) -> Result<bool> {
        let mut written = 0;
        while written < self.unsent.len() {
            match self.socket.write(&self.unsent[written..]) {
                Ok(count) => written += count,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    self.unsent.drain(..written);
                    return Ok(false);
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error.into()),
            }
        }
        self.unsent.clear();
        Ok(true)
    }

    /// Watches the socket for `interest`; `false` if it cannot be.
    fn watch(&mut self, registry: &Registry, token: Token, interest: Interest) -> bool {
        if self.interest == interest {
            return true;
        }
        self.interest = interest;
        let fd = self.socket.as_raw_fd();
        registry.reregister(&mut SourceFd(&fd), token, interest).is_ok()
    }
}
