//! The machine's limit for a call between two processes: a forked child
//! echoes a 64-byte message back over a Unix socket or loopback TCP, or
//! answers through a word of shared memory with futex wake-ups, with
//! nothing else in the way, so that every call row reads as a fraction of
//! one of these round trips, measured in the same run. The Unix socket is
//! measured twice: each side sleeping in `read` at once, and each side
//! polling for [`task_stream::SPIN`] first, as same-node task streams do.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use raylet_proto::task_stream;

use super::{Metric, metric};

/// Bytes of each message.
const MESSAGE: usize = 64;

/// The round-trip rows, each with its per-call latency.
pub(super) fn ping_pong_metrics() -> Vec<Metric<'static>> {
    vec![
        round_trips("ping-pong round trips, Unix socket (the machine)", || {
            let (ours, theirs) = UnixStream::pair()?;
            SocketPeer::fork(ours.into(), theirs.into(), Duration::ZERO)
        }),
        round_trips(
            "ping-pong round trips, Unix socket polled 50 us before sleeping (the machine)",
            || {
                let (ours, theirs) = UnixStream::pair()?;
                SocketPeer::fork(ours.into(), theirs.into(), task_stream::SPIN)
            },
        ),
        round_trips("ping-pong round trips, loopback TCP (the machine)", || {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let ours = TcpStream::connect(listener.local_addr()?)?;
            let (theirs, _) = listener.accept()?;
            ours.set_nodelay(true)?;
            theirs.set_nodelay(true)?;
            SocketPeer::fork(ours.into(), theirs.into(), Duration::ZERO)
        }),
        futex_round_trips(),
    ]
}

fn round_trips(name: &str, start: impl Fn() -> io::Result<SocketPeer> + 'static) -> Metric<'static> {
    let mut peer: Option<SocketPeer> = None;
    metric(
        name,
        1.0,
        Box::new(move || {
            if peer.is_none() {
                peer = Some(start()?);
            }
            Ok(peer.as_ref().expect("started above").round_trip()?)
        }),
    )
    .with_latency()
}

/// A forked child that echoes each message it reads on a socket, until the
/// socket closes.
struct SocketPeer {
    socket: OwnedFd,
    child: libc::pid_t,
    /// How long each side polls for the answer before it sleeps.
    spin: Duration,
}

impl SocketPeer {
    fn fork(ours: OwnedFd, theirs: OwnedFd, spin: Duration) -> io::Result<SocketPeer> {
        // SAFETY: the child calls only read, write and _exit, which are
        // async-signal-safe, so the locks other threads held at the fork
        // do not matter to it.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                drop(ours);
                echo(theirs.as_raw_fd(), spin)
            }
            child => Ok(SocketPeer {
                socket: ours,
                child,
                spin,
            }),
        }
    }

    fn round_trip(&self) -> io::Result<()> {
        let mut message = [7u8; MESSAGE];
        transfer(self.socket.as_raw_fd(), &mut message, Direction::Write)?;
        transfer(self.socket.as_raw_fd(), &mut message, Direction::Read(self.spin))
    }
}

impl Drop for SocketPeer {
    /// Closes the socket, which ends the child, and reaps it.
    fn drop(&mut self) {
        // SAFETY: shutting down a socket this peer owns.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        reap(self.child);
    }
}

/// The child's loop: reads a message and writes it back, until the socket
/// closes; never returns.
fn echo(socket: i32, spin: Duration) -> ! {
    let mut message = [0u8; MESSAGE];
    while transfer(socket, &mut message, Direction::Read(spin)).is_ok()
        && transfer(socket, &mut message, Direction::Write).is_ok()
    {}
    // SAFETY: ends the forked child without running the parent's exit handlers.
    unsafe { libc::_exit(0) }
}

#[derive(Clone, Copy)]
enum Direction {
    /// Reading, polling for this long before sleeping in `read`.
    Read(Duration),
    Write,
}

/// Reads or writes all of `message` on `socket` with plain system calls.
fn transfer(socket: i32, message: &mut [u8; MESSAGE], direction: Direction) -> io::Result<()> {
    let started = Instant::now();
    let mut done = 0;
    while done < MESSAGE {
        let rest = &mut message[done..];
        // SAFETY: `rest` is valid for its length, for reading or writing.
        let count = unsafe {
            match direction {
                Direction::Read(spin) if started.elapsed() < spin => {
                    libc::recv(socket, rest.as_mut_ptr().cast(), rest.len(), libc::MSG_DONTWAIT)
                }
                Direction::Read(_) => libc::read(socket, rest.as_mut_ptr().cast(), rest.len()),
                Direction::Write => libc::write(socket, rest.as_ptr().cast(), rest.len()),
            }
        };
        match count {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            count if count < 0 => {
                let error = io::Error::last_os_error();
                if !matches!(error.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) {
                    return Err(error);
                }
            }
            count => done += count as usize,
        }
    }
    Ok(())
}

fn reap(child: libc::pid_t) {
    // SAFETY: waits for a child this process forked.
    unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
}

fn futex_round_trips() -> Metric<'static> {
    let mut peer: Option<FutexPeer> = None;
    metric(
        "ping-pong round trips, shared memory and futex (the machine)",
        1.0,
        Box::new(move || {
            if peer.is_none() {
                peer = Some(FutexPeer::fork()?);
            }
            peer.as_mut().expect("started above").round_trip();
            Ok(())
        }),
    )
    .with_latency()
}

/// The word's value that tells the child to exit.
const EXIT: u32 = u32::MAX;

/// A forked child that answers each odd value of a shared word with the
/// next even one, sleeping on the word with a futex in between.
struct FutexPeer {
    word: *const AtomicU32,
    child: libc::pid_t,
    next: u32,
}

impl FutexPeer {
    fn fork() -> io::Result<FutexPeer> {
        // SAFETY: a fresh shared anonymous page; it is unmapped on drop.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let word = page.cast::<AtomicU32>();
        // SAFETY: as for the socket peers, the child only makes system calls
        // and touches the shared word.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            // SAFETY: the page is mapped in the child too and is aligned.
            0 => answer(unsafe { &*word }),
            child => Ok(FutexPeer { word, child, next: 1 }),
        }
    }

    fn round_trip(&mut self) {
        // SAFETY: the page stays mapped while the peer lives.
        let word = unsafe { &*self.word };
        word.store(self.next, Ordering::Release);
        futex_wake(word);
        wait_for(word, self.next + 1);
        self.next += 2;
        if self.next >= EXIT - 2 {
            self.next = 1;
            word.store(0, Ordering::Release);
        }
    }
}

impl Drop for FutexPeer {
    fn drop(&mut self) {
        // SAFETY: the page stays mapped until the unmap below.
        let word = unsafe { &*self.word };
        word.store(EXIT, Ordering::Release);
        futex_wake(word);
        reap(self.child);
        // SAFETY: the child is gone and no reference to the page is left.
        unsafe { libc::munmap(self.word as *mut libc::c_void, 4096) };
    }
}

/// The child's loop: answers each odd value with the next one until told
/// to exit; never returns.
fn answer(word: &AtomicU32) -> ! {
    let mut seen = 0;
    loop {
        let value = word.load(Ordering::Acquire);
        if value == EXIT {
            // SAFETY: ends the forked child without running exit handlers.
            unsafe { libc::_exit(0) }
        }
        if value % 2 == 1 && value != seen {
            seen = value;
            word.store(value + 1, Ordering::Release);
            futex_wake(word);
            continue;
        }
        futex_wait(word, value);
    }
}

fn wait_for(word: &AtomicU32, wanted: u32) {
    loop {
        let value = word.load(Ordering::Acquire);
        if value == wanted {
            return;
        }
        futex_wait(word, value);
    }
}

/// Sleeps while `word` holds `value` (or returns at once if it does not).
fn futex_wait(word: &AtomicU32, value: u32) {
    // SAFETY: FUTEX_WAIT on a live, aligned word, without a timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            value,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1) };
}
