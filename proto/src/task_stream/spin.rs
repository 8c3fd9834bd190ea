//! Waiting briefly without sleeping for the next frame of a same-node
//! stream. Waking a thread that slept costs about 20 us on a quiet
//! virtual machine here, several times a whole round trip between two
//! threads that keep polling (see `raylet microbenchmark`'s ping-pong
//! rows), so a thread that just handled a frame polls its streams for up
//! to [`SPIN`] before it sleeps: a caller that sends the next call at once
//! finds it awake. A thread that saw no frame for a while sleeps at once.
//! Between polls it yields its core to any thread waiting for one, so that
//! on a busy machine polling takes no time from work (without the yield,
//! tasks async ran at 0.88 of the throughput before polling on 2 cores).
//! A thread that hands work to another runtime and awaits it (Serve's
//! replica runs user code on a runtime of its own) is woken from there: the
//! other side calls [`wake_spinning`] after it wakes the waiting task, and
//! the polling thread stops at once instead of polling out its time.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a thread polls before it sleeps.
pub const SPIN: Duration = Duration::from_micros(50);
/// A thread polls only if a frame arrived this recently.
const RECENT: Duration = Duration::from_millis(2);

/// How many times another thread said it woke a task here
/// ([`wake_spinning`]).
static WAKES_FROM_ELSEWHERE: AtomicU64 = AtomicU64::new(0);

/// Tells a runtime thread polling before it parks that another thread has
/// just woken one of its tasks: it stops polling, and its runtime then
/// finds the task (the wake already signalled the runtime) without
/// sleeping. Call it after the wake (a channel's send, say), never before.
pub fn wake_spinning() {
    WAKES_FROM_ELSEWHERE.fetch_add(1, Ordering::Release);
}

/// The same-node streams that this process's runtime reads, in an epoll
/// set of their own (level-triggered) that a parking thread polls, and
/// when one of them last had a frame.
struct Watched {
    epoll: OwnedFd,
    epoch: Instant,
    last_frame_micros: AtomicU64,
}

fn watched() -> Option<&'static Watched> {
    static WATCHED: OnceLock<Option<Watched>> = OnceLock::new();
    WATCHED
        .get_or_init(|| {
            // SAFETY: creates a new epoll descriptor, owned below.
            let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if epoll < 0 {
                return None;
            }
            // SAFETY: `epoll` was just created and is owned by nothing else.
            let epoll = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(epoll) };
            Some(Watched {
                epoll,
                epoch: Instant::now(),
                last_frame_micros: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Polls `socket` too while this process's runtime is about to park. It
/// leaves the set by itself once the socket is closed.
pub(super) fn poll_before_parking(socket: &StdUnixStream) {
    let Some(watched) = watched() else {
        return;
    };
    let mut event = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: both descriptors are open; the event is read, not kept.
    unsafe {
        libc::epoll_ctl(
            watched.epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            socket.as_raw_fd(),
            &mut event,
        )
    };
}

/// Notes that a same-node frame just arrived.
pub(super) fn frame_arrived() {
    if let Some(watched) = watched() {
        let now = watched.epoch.elapsed().as_micros() as u64;
        watched.last_frame_micros.store(now, Ordering::Relaxed);
    }
}

/// Before a runtime thread parks: if a same-node frame arrived in the last
/// [`RECENT`], polls the streams for up to [`SPIN`] and returns as soon as
/// one has bytes or another thread woke a task ([`wake_spinning`]); the
/// runtime's own poll then finds them without sleeping.
pub fn spin_before_parking() {
    let Some(watched) = watched() else {
        return;
    };
    let last = Duration::from_micros(watched.last_frame_micros.load(Ordering::Relaxed));
    if watched.epoch.elapsed().saturating_sub(last) > RECENT {
        return;
    }
    let started = Instant::now();
    let wakes = WAKES_FROM_ELSEWHERE.load(Ordering::Acquire);
    let mut event = libc::epoll_event { events: 0, u64: 0 };
    while started.elapsed() < SPIN && WAKES_FROM_ELSEWHERE.load(Ordering::Acquire) == wakes {
        // SAFETY: polls the set without waiting into one event's room.
        let ready = unsafe { libc::epoll_wait(watched.epoll.as_raw_fd(), &mut event, 1, 0) };
        if ready != 0 {
            return;
        }
        std::thread::yield_now();
    }
}
