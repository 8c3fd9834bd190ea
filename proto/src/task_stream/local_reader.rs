//! Reading the results of a caller's same-node task streams. A thread of
//! its own waits on an epoll set of those streams, so that a result wakes
//! one thread (this one, which stores it and wakes the waiting `get`)
//! instead of the runtime's I/O driver and then one of its workers. And a
//! thread about to wait for a result reads the stream it last sent a call
//! on itself for a short while ([`read_last_sent_until`]), with the stream
//! out of the reader thread's set meanwhile: on this machine a sleeping
//! thread takes about 20 us to wake, several times a round trip.
//!
//! A stream's handler runs on whichever thread reads, inside the runtime
//! that started the reader thread, so it must not block. A stream whose
//! peer ends it, sends garbage or whose handler panics is dropped after
//! its handler hears why.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use prost::Message;

use super::frames::{FrameBuffer, FrameReader, ReadSide, Reading};
use crate::Result;

/// What a stream's reader does with each message (`Ok(Some)`), and then
/// once with its end: `Ok(None)` when the peer closed it, or the error.
pub type EventHandler<M> = Box<dyn FnMut(Result<Option<M>>) + Send>;

/// One end of a same-node stream, as its readers share it.
pub(crate) struct LocalStream {
    pub(super) socket: StdUnixStream,
    /// The frames read and who takes them, once delivered; `None` before,
    /// and once the stream ended.
    delivery: Mutex<Option<Box<dyn Delivery>>>,
    /// Its token in the reader thread's set; 0 until it is added.
    token: AtomicUsize,
}

impl LocalStream {
    pub(super) fn new(socket: StdUnixStream) -> Arc<Self> {
        Arc::new(LocalStream {
            socket,
            delivery: Mutex::default(),
            token: AtomicUsize::new(0),
        })
    }

    fn delivery(&self) -> MutexGuard<'_, Option<Box<dyn Delivery>>> {
        self.delivery.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads what arrived and hands it over; `false` once the stream ended.
    fn read_now(&self) -> bool {
        let mut delivery = self.delivery();
        let open = delivery
            .as_mut()
            .is_some_and(|delivery| delivery.on_readable(&self.socket));
        if !open {
            *delivery = None;
        }
        open
    }
}

/// A delivered stream's frames and handler.
trait Delivery: Send {
    /// Reads what arrived and hands it over; `false` once the stream is
    /// done with.
    fn on_readable(&mut self, socket: &StdUnixStream) -> bool;
}

struct Handing<M> {
    frames: FrameBuffer,
    handler: EventHandler<M>,
}

impl<M: Message + Default + Send + 'static> FrameReader<M> {
    /// Hands every message, then the stream's end, to `handler`: on the
    /// same-node reader thread (or a thread waiting for a result) for a
    /// caller's end of a same-node socket, else on a task of the current
    /// runtime.
    pub fn deliver(self, handler: EventHandler<M>) {
        let FrameReader { socket, frames, .. } = self;
        match socket {
            ReadSide::Local(socket) => {
                let stream = socket.stream;
                *stream.delivery() = Some(Box::new(Handing { frames, handler }));
                if let Err(stream) = watch(stream) {
                    tokio::spawn(read_on_runtime(stream));
                }
            }
            ReadSide::Async(socket) => {
                tokio::spawn(FrameReader::new(ReadSide::Async(socket), frames).hand_over_all(handler));
            }
        }
    }

    async fn hand_over_all(mut self, mut handler: EventHandler<M>) {
        loop {
            let message = self.message().await;
            let ended = !matches!(message, Ok(Some(_)));
            handler(message);
            if ended {
                return;
            }
        }
    }
}

/// Reads a delivered stream through the runtime, where the reader thread
/// cannot start.
async fn read_on_runtime(stream: Arc<LocalStream>) {
    let Ok(socket) = stream.socket.try_clone() else {
        return;
    };
    // SAFETY: the clone owns its descriptor and gives the same one while
    // the AsyncFd holds it.
    let Ok(watched) =
        (unsafe { tokio::io::unix::AsyncFd::register_with_interest(socket, tokio::io::Interest::READABLE) })
    else {
        return;
    };
    loop {
        let Ok(mut ready) = watched.readable().await else {
            return;
        };
        if !stream.read_now() {
            return;
        }
        ready.clear_ready();
    }
}

impl<M: Message + Default + Send + 'static> Handing<M> {
    /// Hands `event` to the handler; `false` if it panicked.
    fn hand_over(&mut self, event: Result<Option<M>>) -> bool {
        let handler = &mut self.handler;
        let handled = catch_unwind(AssertUnwindSafe(|| handler(event)));
        if handled.is_err() {
            tracing::error!("a task stream's handler panicked; the stream is dropped");
        }
        handled.is_ok()
    }

    /// Hands over every whole message read so far.
    fn hand_over_frames(&mut self) -> bool {
        loop {
            match self.frames.next_message::<M>() {
                Ok(Some(message)) => {
                    if !self.hand_over(Ok(Some(message))) {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(error) => {
                    self.hand_over(Err(error));
                    return false;
                }
            }
        }
    }
}

impl<M: Message + Default + Send + 'static> Delivery for Handing<M> {
    fn on_readable(&mut self, socket: &StdUnixStream) -> bool {
        loop {
            let read = self.frames.read_some(socket);
            if !self.hand_over_frames() {
                return false;
            }
            match read {
                Ok(Reading::More) => continue,
                Ok(Reading::Drained) => return true,
                Ok(Reading::Ended) => {
                    let end = self.frames.ended();
                    self.hand_over(end);
                    return false;
                }
                Err(error) => {
                    self.hand_over(Err(error.into()));
                    return false;
                }
            }
        }
    }
}

thread_local! {
    /// The same-node stream this thread last sent a frame on.
    static LAST_SENT: RefCell<Weak<LocalStream>> = const { RefCell::new(Weak::new()) };
}

/// Notes that this thread just sent a frame whose answer comes back on
/// `stream` (none for a stream that is not a caller's same-node one).
pub(super) fn sent_on(stream: &Weak<LocalStream>) {
    if stream.strong_count() == 0 {
        return;
    }
    LAST_SENT.with(|last| {
        if !last.borrow().ptr_eq(stream) {
            *last.borrow_mut() = stream.clone();
        }
    });
}

/// Reads the same-node stream this thread last sent a call on, here, for
/// up to `spin`, until `done` holds: the result of the call this thread
/// waits for likely comes back on it. Returns whether `done` held.
pub fn read_last_sent_until(done: &dyn Fn() -> bool, spin: Duration) -> bool {
    if done() || spin.is_zero() {
        return done();
    }
    let Some(stream) = LAST_SENT.with(|last| last.borrow().upgrade()) else {
        return false;
    };
    let Some(reader) = READER.get().and_then(Option::as_ref) else {
        return false;
    };
    let _runtime = reader.runtime.as_ref().map(tokio::runtime::Handle::enter);
    let mut delivery = stream.delivery();
    if delivery.is_none() {
        return done();
    }
    let fd = stream.socket.as_raw_fd();
    let token = Token(stream.token.load(Ordering::Acquire));
    let unwatched = token.0 != 0 && reader.registry.deregister(&mut SourceFd(&fd)).is_ok();
    let started = Instant::now();
    let mut open = true;
    let held = loop {
        if done() {
            break true;
        }
        if !open || started.elapsed() >= spin {
            break false;
        }
        open = delivery
            .as_mut()
            .is_some_and(|delivery| delivery.on_readable(&stream.socket));
        std::thread::yield_now();
    };
    if !open {
        *delivery = None;
    }
    // Put back even once ended: the reader thread then sees the end and
    // lets the stream go.
    if unwatched {
        let watched = reader.registry.register(&mut SourceFd(&fd), token, Interest::READABLE);
        if let Err(error) = watched {
            tracing::error!(%error, "a same-node stream could not be watched again");
        }
    }
    held
}

/// Streams handed to the reader thread that it has not taken yet.
type Added = Arc<Mutex<Vec<Arc<LocalStream>>>>;

/// The reader thread: streams to add, how to wake it for them, its set's
/// registry (which waiting threads take a stream out of and put back in),
/// and the runtime handlers run in.
struct Reader {
    added: Added,
    waker: Waker,
    registry: Registry,
    runtime: Option<tokio::runtime::Handle>,
}

static READER: OnceLock<Option<Reader>> = OnceLock::new();

const WAKER: Token = Token(0);

/// Has the thread read `stream`, starting the thread on first use; gives
/// the stream back if the thread cannot start.
fn watch(stream: Arc<LocalStream>) -> std::result::Result<(), Arc<LocalStream>> {
    let Some(reader) = READER.get_or_init(start).as_ref() else {
        return Err(stream);
    };
    lock(&reader.added).push(stream);
    if let Err(error) = reader.waker.wake() {
        tracing::error!(%error, "cannot wake the same-node reader thread");
    }
    Ok(())
}

fn lock(added: &Added) -> MutexGuard<'_, Vec<Arc<LocalStream>>> {
    added.lock().unwrap_or_else(|p| p.into_inner())
}

fn start() -> Option<Reader> {
    let started = Poll::new().and_then(|poll| {
        let waker = Waker::new(poll.registry(), WAKER)?;
        let registry = poll.registry().try_clone()?;
        Ok((poll, waker, registry))
    });
    let (poll, waker, registry) = match started {
        Ok(started) => started,
        Err(error) => {
            tracing::warn!(%error, "no same-node reader thread; the runtime reads same-node results");
            return None;
        }
    };
    let added = Added::default();
    let runtime = tokio::runtime::Handle::try_current().ok();
    let (thread_added, thread_runtime) = (added.clone(), runtime.clone());
    let spawned = std::thread::Builder::new()
        .name("raylet-local-reader".into())
        .spawn(move || {
            let _runtime = thread_runtime.as_ref().map(tokio::runtime::Handle::enter);
            read_forever(poll, &thread_added);
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "no same-node reader thread; the runtime reads same-node results");
        return None;
    }
    Some(Reader {
        added,
        waker,
        registry,
        runtime,
    })
}

fn read_forever(mut poll: Poll, added: &Added) {
    let mut streams: HashMap<Token, Arc<LocalStream>> = HashMap::new();
    let mut next_token = 1;
    let mut events = Events::with_capacity(256);
    loop {
        if let Err(error) = poll.poll(&mut events, None) {
            if error.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(%error, "the same-node reader thread cannot wait");
            }
            continue;
        }
        for event in &events {
            let token = event.token();
            if let Some(stream) = streams.get(&token)
                && !stream.read_now()
            {
                forget(&poll, &mut streams, token);
            }
        }
        for stream in std::mem::take(&mut *lock(added)) {
            let token = Token(next_token);
            next_token += 1;
            let fd = stream.socket.as_raw_fd();
            // The token is set before the registration, under the stream's
            // lock, so that a waiting thread never puts it back without one.
            let delivery = stream.delivery();
            stream.token.store(token.0, Ordering::Release);
            if let Err(error) = poll.registry().register(&mut SourceFd(&fd), token, Interest::READABLE) {
                tracing::warn!(%error, "the same-node reader thread cannot watch a stream; the runtime reads it");
                drop(delivery);
                tokio::spawn(read_on_runtime(stream));
                continue;
            }
            drop(delivery);
            streams.insert(token, stream.clone());
            // Frames read before the hand-over, and bytes that arrived
            // before the registration, are taken now.
            if !stream.read_now() {
                forget(&poll, &mut streams, token);
            }
        }
    }
}

/// Stops watching the stream of `token`, which closes it.
fn forget(poll: &Poll, streams: &mut HashMap<Token, Arc<LocalStream>>, token: Token) {
    if let Some(stream) = streams.remove(&token) {
        let fd = stream.socket.as_raw_fd();
        let _ = poll.registry().deregister(&mut SourceFd(&fd));
    }
}
