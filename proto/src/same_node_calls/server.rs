//! The server's end: a thread with an epoll set of its own over the socket
//! and its connections, answering each request at once. A connection's
//! answers are written before more of its requests are read, so a caller
//! that does not read them is not read either, and holds at most one
//! answer here. A connection that has not sent its opening frame within
//! the handshake timeout is closed, so a silent one holds no place for long.

use std::collections::{HashMap, VecDeque};
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

use crate::task_stream::{FrameBuffer, HANDSHAKE_TIMEOUT, Reading, SPIN, encode_frame, welcome_for};
use crate::v1::TaskStreamHello;
use crate::{Result, local_socket};

/// The reply to a request, made on the server's thread: it must not block.
/// An error closes the caller's connection.
pub type Answer<Request, Reply> = Box<dyn Fn(Request) -> Result<Reply> + Send>;

/// Connections served at once at most; more are closed as they come, and
/// their callers take gRPC.
const MAX_CONNECTIONS: usize = 1024;

const WAKER: Token = Token(0);
const LISTENER: Token = Token(1);

/// A same-node call service; it stops, and its socket file goes, when
/// dropped.
pub struct CallServer {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl CallServer {
    /// Serves `purpose` (calls named for the log, such as "object gets")
    /// beside the gRPC port `address` on a thread named `thread`, with
    /// `answer`; `None` (logged) when those calls take gRPC only: with TLS,
    /// or when the socket or the thread cannot be had.
    pub fn start<Request, Reply>(
        address: SocketAddr,
        token: AuthToken,
        (purpose, thread): (&str, &str),
        answer: Answer<Request, Reply>,
    ) -> Option<Self>
    where
        Request: prost::Message + Default + 'static,
        Reply: prost::Message + 'static,
    {
        let path = local_socket::socket_for(address)?;
        let listener = local_socket::bind(address, purpose)?;
        match Self::spawn(listener, token, answer, path.clone(), thread) {
            Ok(server) => Some(server),
            Err(error) => {
                tracing::warn!(%error, "{purpose} from this machine take gRPC");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn spawn<Request, Reply>(
        listener: UnixListener,
        token: AuthToken,
        answer: Answer<Request, Reply>,
        path: PathBuf,
        thread: &str,
    ) -> std::io::Result<Self>
    where
        Request: prost::Message + Default + 'static,
        Reply: prost::Message + 'static,
    {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let fd = listener.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), LISTENER, Interest::READABLE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Serving {
            listener,
            token,
            answer,
            connections: HashMap::new(),
            awaiting_hello: VecDeque::new(),
            next_token: LISTENER.0 + 1,
        };
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || serving.run(poll, &thread_stop))?;
        Ok(CallServer {
            stop,
            waker,
            thread: Some(thread),
            path,
        })
    }
}

impl Drop for CallServer {
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
struct Serving<Request, Reply> {
    listener: UnixListener,
    token: AuthToken,
    answer: Answer<Request, Reply>,
    connections: HashMap<Token, Connection>,
    /// The connections accepted, in order, with when each must have sent
    /// its opening frame.
    awaiting_hello: VecDeque<(Instant, Token)>,
    next_token: usize,
}

impl<Request: prost::Message + Default, Reply: prost::Message> Serving<Request, Reply> {
    /// Serves until `stop`; after each request it polls for [`SPIN`]
    /// before it sleeps, as the caller's next request likely follows.
    fn run(mut self, mut poll: Poll, stop: &AtomicBool) {
        let mut events = Events::with_capacity(256);
        let mut busy_since: Option<Instant> = None;
        while !stop.load(Ordering::Acquire) {
            let timeout = match busy_since {
                Some(_) => Some(std::time::Duration::ZERO),
                None => self.next_hello_due(),
            };
            if let Err(error) = poll.poll(&mut events, timeout) {
                if error.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(%error, "a same-node call thread cannot wait; its calls take gRPC");
                    return;
                }
                continue;
            }
            self.close_silent(poll.registry());
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
                    tracing::debug!(%error, "cannot accept a same-node call connection");
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
                self.await_hello(token);
                self.serve(registry, token);
            }
        }
    }

    /// Gives the connection of `token` until the handshake timeout to send
    /// its opening frame. Connections that closed or were admitted leave
    /// the queue before it holds more than [`MAX_CONNECTIONS`], so callers
    /// that connect and hang up at once cannot grow it.
    fn await_hello(&mut self, token: Token) {
        if self.awaiting_hello.len() >= MAX_CONNECTIONS {
            let connections = &self.connections;
            self.awaiting_hello
                .retain(|(_, waiting)| connections.get(waiting).is_some_and(|c| !c.admitted));
        }
        self.awaiting_hello
            .push_back((Instant::now() + HANDSHAKE_TIMEOUT, token));
    }

    /// How long until the oldest connection that may still owe its
    /// opening frame is due.
    fn next_hello_due(&self) -> Option<std::time::Duration> {
        let (due, _) = self.awaiting_hello.front()?;
        Some(due.saturating_duration_since(Instant::now()))
    }

    /// Closes the connections past their handshake timeout that have not
    /// sent their opening frame.
    fn close_silent(&mut self, registry: &Registry) {
        let now = Instant::now();
        while let Some(&(due, token)) = self.awaiting_hello.front() {
            if due > now {
                return;
            }
            self.awaiting_hello.pop_front();
            if self.connections.get(&token).is_some_and(|c| !c.admitted) {
                tracing::debug!("a same-node call connection sent no opening frame in time; it is closed");
                self.close(registry, token);
            }
        }
    }

    fn close(&mut self, registry: &Registry, token: Token) {
        if let Some(connection) = self.connections.remove(&token) {
            let _ = registry.deregister(&mut SourceFd(&connection.socket.as_raw_fd()));
        }
    }

    /// Answers what the connection of `token` asked; closes it once it
    /// ended, was refused, or sent garbage.
    fn serve(&mut self, registry: &Registry, token: Token) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        let open = match connection.serve(&self.token, &self.answer) {
            Ok(Progress::Open) => connection.watch(registry, token, Interest::READABLE),
            Ok(Progress::Blocked) => connection.watch(registry, token, Interest::READABLE | Interest::WRITABLE),
            Ok(Progress::Closed) => false,
            Err(error) => {
                tracing::debug!(%error, "a same-node call connection is closed");
                false
            }
        };
        if !open {
            self.close(registry, token);
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

/// One caller's connection.
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
    fn serve<Request: prost::Message + Default, Reply: prost::Message>(
        &mut self,
        token: &AuthToken,
        answer: &Answer<Request, Reply>,
    ) -> Result<Progress> {
        let mut drained = false;
        loop {
            if !self.flush()? {
                return Ok(Progress::Blocked);
            }
            if self.refused {
                return Ok(Progress::Closed);
            }
            if self.answer_next(token, answer)? {
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
    /// frame with a welcome or a refusal, then each request.
    fn answer_next<Request: prost::Message + Default, Reply: prost::Message>(
        &mut self,
        token: &AuthToken,
        answer: &Answer<Request, Reply>,
    ) -> Result<bool> {
        if !self.admitted {
            let Some(hello) = self.frames.next_message::<TaskStreamHello>()? else {
                return Ok(false);
            };
            let (welcome, admitted) = welcome_for(&hello, token);
            self.unsent = encode_frame(&welcome);
            self.admitted = admitted.is_ok();
            self.refused = admitted.is_err();
            if self.admitted {
                self.frames.admit();
            }
            return Ok(true);
        }
        let Some(request) = self.frames.next_message::<Request>()? else {
            return Ok(false);
        };
        self.unsent = encode_frame(&answer(request)?);
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
