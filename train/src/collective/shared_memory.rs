//! One-way byte pipes in shared memory between two ranks on the same host,
//! as NCCL's and Open MPI's shared-memory transports do: a ring buffer in a
//! `/dev/shm` file both processes map, byte counters the writer and the
//! reader advance, and futexes they sleep on while the ring is full or
//! empty. A byte crosses with one copy into the ring and one out of it (or
//! a reduction straight out of it), with no socket stack in between. The
//! TCP stream of the link stays open beside the pipes: its end says the
//! peer is gone.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use super::CollectiveError;
use super::element::{Element, ReduceOp, combine};

/// Bytes of a pipe's ring.
pub(crate) const RING_BYTES: usize = 4 << 20;
/// Where the ring starts in the file: after the control block, on a page.
const RING_OFFSET: usize = 4096;
/// At most this many bytes are copied before the other side is told, so
/// that it works on the first part while the next is copied.
const STEP_BYTES: usize = 256 << 10;
/// How often a side checks that the ring is ready, spinning, before it
/// yields the CPU: briefly, since ranks may outnumber cores.
const SPINS: u32 = 256;
/// How often it then yields the CPU and checks again before it sleeps.
const YIELDS: u32 = 16;
/// How long a side sleeps at a time before it checks that its peer lives.
const SLEEP: Duration = Duration::from_millis(20);
/// Where the pipes' files are made.
const SHM_DIR: &str = "/dev/shm";

/// The control block at the start of a pipe's file; each counter on a
/// cache line of its own.
#[repr(C, align(64))]
struct Control {
    /// Bytes the writer has put in the ring, ever.
    written: Padded<AtomicU64>,
    /// Bytes the reader has taken out of the ring, ever.
    read: Padded<AtomicU64>,
    /// 1 while the reader sleeps on it (a futex word).
    reader_sleeps: Padded<AtomicU32>,
    /// 1 while the writer sleeps on it (a futex word).
    writer_sleeps: Padded<AtomicU32>,
    /// Set by either side when it closes the pipe.
    closed: Padded<AtomicU32>,
}

#[repr(C, align(64))]
struct Padded<T>(T);

/// A pipe's file mapped into this process.
pub(crate) struct Mapping {
    map: MmapMut,
}

impl Mapping {
    fn control(&self) -> &Control {
        // SAFETY: the map is RING_OFFSET + RING_BYTES long, page-aligned,
        // zeroed when made, and holds only atomics at its start.
        unsafe { &*(self.map.as_ptr() as *const Control) }
    }

    fn ring(&self) -> *mut u8 {
        // SAFETY: RING_OFFSET is inside the map.
        unsafe { (self.map.as_ptr() as *mut u8).add(RING_OFFSET) }
    }

    /// Marks the pipe closed and wakes whoever sleeps on it.
    pub(crate) fn close(&self) {
        let control = self.control();
        control.closed.0.store(1, Ordering::SeqCst);
        wake(&control.reader_sleeps.0);
        wake(&control.writer_sleeps.0);
    }

    /// Waits until `ready` holds, sleeping on `sleeps` after a short spin;
    /// fails when the pipe closes, `peer`'s stream ends or nothing happens
    /// for `timeout`.
    fn wait(
        &self,
        sleeps: &AtomicU32,
        ready: impl Fn(&Control) -> bool,
        link: &PeerLink,
    ) -> Result<(), CollectiveError> {
        let control = self.control();
        for spin in 0..SPINS + YIELDS {
            if ready(control) {
                return Ok(());
            }
            match spin < SPINS {
                true => std::hint::spin_loop(),
                false => std::thread::yield_now(),
            }
        }
        let deadline = Instant::now() + link.timeout;
        loop {
            sleeps.store(1, Ordering::SeqCst);
            if ready(control) {
                sleeps.store(0, Ordering::SeqCst);
                return Ok(());
            }
            if control.closed.0.load(Ordering::SeqCst) != 0 {
                return Err(link.lost("the link was closed"));
            }
            futex_wait(sleeps, SLEEP);
            if ready(control) {
                sleeps.store(0, Ordering::SeqCst);
                return Ok(());
            }
            link.check_alive()?;
            if Instant::now() >= deadline {
                return Err(CollectiveError::Timeout { peer: link.peer });
            }
        }
    }
}

/// What a waiting side knows of the link: the peer, its TCP stream (whose
/// end says it is gone) and the group's timeout.
pub(crate) struct PeerLink {
    pub(crate) peer: usize,
    pub(crate) stream: TcpStream,
    pub(crate) timeout: Duration,
}

impl PeerLink {
    fn lost(&self, reason: &str) -> CollectiveError {
        CollectiveError::PeerLost {
            peer: self.peer,
            reason: reason.to_string(),
        }
    }

    /// Fails when the peer's TCP stream has ended (it closed its links, or
    /// its process is gone).
    fn check_alive(&self) -> Result<(), CollectiveError> {
        let mut byte = [0u8; 1];
        // SAFETY: a one-byte peek into a local buffer on an open socket.
        let got = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match got {
            0 => Err(self.lost("its link ended")),
            n if n > 0 => Ok(()),
            _ => match std::io::Error::last_os_error() {
                error if error.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
                error => Err(self.lost(&error.to_string())),
            },
        }
    }
}

/// Bytes a message takes in the ring: its length rounded up to 8, so that
/// every message starts 8-aligned and every count the two sides pass each
/// other is a multiple of 8 (no element is ever split or misaligned).
fn padded(len: usize) -> usize {
    len.next_multiple_of(8)
}

/// The writing end of a pipe.
pub(crate) struct PipeWriter {
    pub(crate) mapping: Arc<Mapping>,
    pub(crate) link: PeerLink,
}

impl PipeWriter {
    /// Puts all of `bytes` in the ring (then padding), as room frees up.
    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> Result<(), CollectiveError> {
        let (mapping, link) = (&self.mapping, &self.link);
        let control = mapping.control();
        let (total, mut sent) = (padded(bytes.len()), 0);
        while sent < total {
            let written = control.written.0.load(Ordering::Relaxed);
            let has_room = |control: &Control| control.read.0.load(Ordering::SeqCst) + RING_BYTES as u64 > written;
            mapping.wait(&control.writer_sleeps.0, has_room, link)?;
            let free = RING_BYTES - (written - control.read.0.load(Ordering::SeqCst)) as usize;
            let at = (written % RING_BYTES as u64) as usize;
            let count = free.min(RING_BYTES - at).min(total - sent).min(STEP_BYTES);
            let useful = count.min(bytes.len().saturating_sub(sent));
            // SAFETY: [at, at + count) is inside the ring and free: the
            // reader does not touch it until `written` says it is filled.
            unsafe { std::ptr::copy_nonoverlapping(bytes[sent..].as_ptr(), mapping.ring().add(at), useful) };
            control.written.0.store(written + count as u64, Ordering::SeqCst);
            if control.reader_sleeps.0.swap(0, Ordering::SeqCst) == 1 {
                wake(&control.reader_sleeps.0);
            }
            sent += count;
        }
        Ok(())
    }
}

/// The reading end of a pipe.
pub(crate) struct PipeReader {
    pub(crate) mapping: Arc<Mapping>,
    pub(crate) link: PeerLink,
}

impl PipeReader {
    /// The filled part of the ring that starts where reading is, up to
    /// `limit` bytes, once there is one: where reading is, the part's
    /// address and its length (a multiple of 8, 8-aligned).
    fn filled(&self, limit: usize) -> Result<(u64, *const u8, usize), CollectiveError> {
        let (mapping, link) = (&self.mapping, &self.link);
        let control = mapping.control();
        let read = control.read.0.load(Ordering::Relaxed);
        let has_bytes = |control: &Control| control.written.0.load(Ordering::SeqCst) > read;
        mapping.wait(&control.reader_sleeps.0, has_bytes, link)?;
        let filled = (control.written.0.load(Ordering::SeqCst) - read) as usize;
        let at = (read % RING_BYTES as u64) as usize;
        let count = filled.min(RING_BYTES - at).min(limit).min(STEP_BYTES);
        // SAFETY: `at` is inside the ring.
        Ok((read, unsafe { mapping.ring().add(at) }, count))
    }

    /// Gives `count` bytes read from `read` on back to the writer.
    fn consume(&self, read: u64, count: usize) {
        let control = self.mapping.control();
        control.read.0.store(read + count as u64, Ordering::SeqCst);
        if control.writer_sleeps.0.swap(0, Ordering::SeqCst) == 1 {
            wake(&control.writer_sleeps.0);
        }
    }

    /// Fills `into` from the ring (a message the writer wrote whole).
    pub(crate) fn read_exact(&mut self, into: &mut [u8]) -> Result<(), CollectiveError> {
        let (total, mut consumed) = (padded(into.len()), 0);
        while consumed < total {
            let (read, from, count) = self.filled(total - consumed)?;
            let useful = count.min(into.len().saturating_sub(consumed));
            // SAFETY: [from, from + count) is filled and the writer leaves
            // it alone until it is consumed.
            unsafe { std::ptr::copy_nonoverlapping(from, into[consumed..].as_mut_ptr(), useful) };
            self.consume(read, count);
            consumed += count;
        }
        Ok(())
    }

    /// Combines the next message, `part.len()` elements, into `part`
    /// straight out of the ring.
    pub(crate) fn reduce_into<T: Element>(&mut self, part: &mut [T], op: ReduceOp) -> Result<(), CollectiveError> {
        let size = std::mem::size_of::<T>();
        let (total, mut consumed) = (padded(std::mem::size_of_val(part)), 0);
        while consumed < total {
            let (read, from, count) = self.filled(total - consumed)?;
            let first = consumed / size;
            let whole = (count / size).min(part.len() - first);
            debug_assert!((from as usize).is_multiple_of(std::mem::align_of::<T>()));
            // SAFETY: `whole` elements lie filled at `from`, aligned (the
            // ring starts on a page and every count is a multiple of 8),
            // left alone by the writer until they are consumed.
            let incoming = unsafe { std::slice::from_raw_parts(from as *const T, whole) };
            combine(&mut part[first..first + whole], incoming, op);
            self.consume(read, count);
            consumed += count;
        }
        Ok(())
    }
}

/// Makes the pipe this rank writes to `peer` through: a new file under
/// `/dev/shm`, only this user's, its memory reserved, mapped here. Returns
/// its mapping and path.
fn make_pipe(peer: usize) -> std::io::Result<(Arc<Mapping>, PathBuf)> {
    let path = Path::new(SHM_DIR).join(format!(
        "raylet-collective-{}-to-{peer}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    if let Err(error) = reserve(&file) {
        let _ = std::fs::remove_file(&path);
        return Err(error);
    }
    Ok((map(&file)?, path))
}

/// Allocates the file's pages now: a full `/dev/shm` (64 MiB in a default
/// container) then fails here, and the link uses TCP, instead of a write
/// into the mapping killing the process with SIGBUS later.
fn reserve(file: &File) -> std::io::Result<()> {
    // SAFETY: posix_fallocate on an open file descriptor.
    let failed = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, (RING_OFFSET + RING_BYTES) as libc::off_t) };
    match failed {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

fn map(file: &File) -> std::io::Result<Arc<Mapping>> {
    // SAFETY: the file is a pipe's, sized by its maker; both sides touch it
    // only through the atomics of its control block and the ring parts the
    // counters hand them.
    let map = unsafe { MmapMut::map_mut(file)? };
    match map.len() == RING_OFFSET + RING_BYTES {
        true => Ok(Arc::new(Mapping { map })),
        false => Err(std::io::Error::other("a pipe's file has the wrong size")),
    }
}

/// The pipes of one link, both ways.
pub(crate) struct PipePair {
    pub(crate) outgoing: Arc<Mapping>,
    pub(crate) incoming: Arc<Mapping>,
}

/// Sets up pipes with every peer in `streams` (one per rank, `None` at this
/// rank and at peers to reach over TCP only): each side makes its outgoing
/// pipe and names it over the stream, opens the peer's, and says whether it
/// could; a link uses pipes when both sides could, TCP otherwise. Every
/// write is a few bytes, so all are written before any is read. A pipe's
/// file is unlinked once the peer has said it opened it (or could not).
pub(crate) fn connect_pipes(streams: &mut [Option<&mut TcpStream>]) -> Result<Vec<Option<PipePair>>, std::io::Error> {
    let mut made = Vec::with_capacity(streams.len());
    for (peer, stream) in streams.iter_mut().enumerate() {
        let pipe = stream.as_ref().and_then(|_| make_pipe(peer).ok());
        made.push(pipe);
    }
    let paired = pair_pipes(streams, &made);
    for (_, path) in made.iter().flatten() {
        let _ = std::fs::remove_file(path);
    }
    let opened = paired?;
    Ok(made
        .into_iter()
        .zip(opened)
        .map(|(own, theirs)| {
            Some(PipePair {
                outgoing: own?.0,
                incoming: theirs?,
            })
        })
        .collect())
}

/// The exchange of [`connect_pipes`] over the streams, with this rank's
/// pipes `made`: the peer's pipe of each link both sides could set up.
fn pair_pipes(
    streams: &mut [Option<&mut TcpStream>],
    made: &[Option<(Arc<Mapping>, PathBuf)>],
) -> std::io::Result<Vec<Option<Arc<Mapping>>>> {
    for (stream, own) in streams.iter_mut().zip(made) {
        if let Some(stream) = stream {
            let name = own
                .as_ref()
                .map_or(String::new(), |(_, path)| path.display().to_string());
            write_frame(stream, name.as_bytes())?;
        }
    }
    let mut opened = Vec::with_capacity(streams.len());
    for (stream, own) in streams.iter_mut().zip(made) {
        let Some(stream) = stream else {
            opened.push(None);
            continue;
        };
        let name = String::from_utf8(read_frame(stream)?).map_err(std::io::Error::other)?;
        let theirs = open_pipe(&name).ok();
        stream.write_all(&[u8::from(own.is_some() && theirs.is_some())])?;
        opened.push(theirs);
    }
    for (stream, theirs) in streams.iter_mut().zip(opened.iter_mut()) {
        if let Some(stream) = stream {
            let mut both = [0u8];
            stream.read_exact(&mut both)?;
            if both[0] != 1 {
                *theirs = None;
            }
        }
    }
    Ok(opened)
}

/// Maps a peer's pipe by the name it sent; only a file of this module's
/// own under `/dev/shm` is taken.
fn open_pipe(name: &str) -> std::io::Result<Arc<Mapping>> {
    let path = Path::new(name);
    let ours = path.parent() == Some(Path::new(SHM_DIR))
        && path
            .file_name()
            .and_then(|file| file.to_str())
            .is_some_and(|file| file.starts_with("raylet-collective-"));
    if !ours {
        return Err(std::io::Error::other("not a pipe's name"));
    }
    map(&OpenOptions::new().read(true).write(true).open(path)?)
}

fn write_frame(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(&(bytes.len() as u32).to_le_bytes())?;
    stream.write_all(bytes)
}

/// Reads a frame [`write_frame`] wrote; a name is short, so a long one is refused.
fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 4096 {
        return Err(std::io::Error::other("a pipe's name is too long"));
    }
    let mut bytes = vec![0u8; len];
    stream.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// Sleeps on `word` while it is 1, for at most `timeout`.
fn futex_wait(word: &AtomicU32, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a shared (not private) futex wait on a live, aligned u32 of
    // the mapping, with a relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            1u32,
            &timeout as *const libc::timespec,
        )
    };
}

/// Wakes whoever sleeps on `word`, in any process.
fn wake(word: &AtomicU32) {
    // SAFETY: a shared futex wake on a live, aligned u32 of the mapping.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}
