//! One object's shared memory: a memfd that the store creates, a client
//! fills through `/proc/<pid>/fd/<fd>`, and the store then seals against
//! shrinking and growth. Readers open it read-only and map it read-only,
//! so they cannot change it; its writer's mapping ends with the seal. Not
//! sealing against writes lets the store reuse the pages of a freed object,
//! once nobody but its writer maps it, for a new object of the same size.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use memmap2::{Mmap, MmapMut, MmapOptions};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// Numbers segments; a number is never given twice in a process.
static NEXT_SEGMENT_ID: AtomicU64 = AtomicU64::new(1);

/// A memfd holding one object's bytes.
#[derive(Debug)]
pub struct Segment {
    id: u64,
    file: File,
    size: u64,
    sealed: bool,
    /// The sealed bytes mapped in this process, made on first use.
    mapped: OnceLock<Bytes>,
    /// Whether its memfd was handed out to be spliced into sockets.
    sent: AtomicBool,
}

impl Segment {
    /// A zero-filled segment of `size` bytes; no memory is used until written.
    pub fn create(name: &str, size: u64) -> io::Result<Segment> {
        let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        let fd: OwnedFd = memfd_create(name, flags).map_err(io::Error::from)?;
        let file = File::from(fd);
        file.set_len(size)?;
        Ok(Segment {
            id: NEXT_SEGMENT_ID.fetch_add(1, Ordering::Relaxed),
            file,
            size,
            sealed: false,
            mapped: OnceLock::new(),
            sent: AtomicBool::new(false),
        })
    }

    /// A segment filled with the contents of `path`, e.g. a spill file.
    pub fn restore(name: &str, path: &Path) -> io::Result<Segment> {
        let mut source = File::open(path)?;
        let size = source.metadata()?.len();
        let mut segment = Segment::create(name, size)?;
        io::copy(&mut source, &mut segment.file)?;
        segment.seal()?;
        Ok(segment)
    }

    /// A sealed segment holding `bytes`.
    pub fn sealed_with(name: &str, bytes: &[u8]) -> io::Result<Segment> {
        let mut segment = Segment::create(name, bytes.len() as u64)?;
        io::Write::write_all(&mut segment.file, bytes)?;
        segment.seal()?;
        Ok(segment)
    }

    /// This segment's number, unique among the segments of this process.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Shrinks the segment to the length the writer used, then fixes its
    /// size for good. A reused segment has a fixed size already: it must be
    /// written whole.
    pub fn seal_at(&mut self, size: u64) -> io::Result<()> {
        if size > self.size || (self.sealed && size != self.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("sealed size {size} differs from the created size {}", self.size),
            ));
        }
        if size < self.size {
            self.file.set_len(size)?;
            self.size = size;
        }
        self.seal()
    }

    /// Whether the store may hand this segment to a new object: it is
    /// sealed, and was never mapped in this process nor sent to peers.
    pub fn reusable(&self) -> bool {
        self.sealed && self.mapped.get().is_none() && !self.sent.load(Ordering::Relaxed)
    }

    /// The memfd of a sealed segment, for splicing its bytes into sockets.
    /// The kernel sends its pages by reference, so a socket may hold them
    /// after the send returns: the segment is never reused, as a mapped one
    /// is not, and its pages are freed once the last reference goes. Fails
    /// on a segment that is not sealed.
    pub fn file_to_send(&self) -> io::Result<File> {
        if !self.sealed {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the segment is not sealed"));
        }
        self.sent.store(true, Ordering::Relaxed);
        self.file.try_clone()
    }

    /// The bytes of a sealed segment, mapped read-only once and shared by
    /// every reader in this process, such as peers pulling the object, so
    /// that its pages are faulted in once. Fails on a segment that is not
    /// sealed.
    pub fn bytes(&self) -> io::Result<Bytes> {
        if let Some(bytes) = self.mapped.get() {
            return Ok(bytes.clone());
        }
        if !self.sealed {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the segment is not sealed"));
        }
        // SAFETY: the segment is sealed against shrinking and growth, and
        // its writer writes it again only once the store reuses it for a new
        // object, which it never does with a segment mapped here, so the
        // mapped bytes never change underneath the readers.
        let map = unsafe { MmapOptions::new().map(&self.file)? };
        Ok(self.mapped.get_or_init(|| Bytes::from_owner(map)).clone())
    }

    fn seal(&mut self) -> io::Result<()> {
        if self.sealed {
            return Ok(());
        }
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&self.file, FcntlArg::F_ADD_SEALS(seals)).map_err(io::Error::from)?;
        self.sealed = true;
        Ok(())
    }

    /// The segment's bytes, read into memory (to send them elsewhere).
    pub fn contents(&self) -> io::Result<Vec<u8>> {
        let mut source = self.file.try_clone()?;
        std::io::Seek::rewind(&mut source)?;
        let mut bytes = Vec::with_capacity(self.size as usize);
        io::Read::read_to_end(&mut source, &mut bytes)?;
        Ok(bytes)
    }

    /// Writes the segment's bytes to a new file at `path`.
    pub fn spill_to(&self, path: &Path) -> io::Result<()> {
        let mut target = OpenOptions::new().write(true).create_new(true).open(path)?;
        let mut source = self.file.try_clone()?;
        std::io::Seek::rewind(&mut source)?;
        let copied = io::copy(&mut source, &mut target);
        if copied.is_err() {
            let _ = std::fs::remove_file(path);
        }
        copied.map(drop)
    }
}

/// Where another process opens the segment of process `pid`.
pub fn proc_path(pid: u32, fd: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/fd/{fd}"))
}

/// Opens a segment for its creator to fill with positioned writes.
pub fn open_writable(path: &Path, size: u64) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    check_size(&file, size)?;
    Ok(file)
}

/// Maps a segment writable, for its creator to fill, with its pages mapped
/// up front: one pass in the kernel instead of a fault per 4 KiB.
pub fn map_writable(path: &Path, size: u64) -> io::Result<MmapMut> {
    let file = open_writable(path, size)?;
    // SAFETY: the segment is a memfd that only its writer maps writable;
    // the writer drops this mapping before a seal that shrinks it, and a
    // sealed segment keeps its size.
    unsafe { MmapOptions::new().populate().map_mut(&file) }
}

/// Maps a sealed segment read-only.
pub fn map_readonly(path: &Path, size: u64) -> io::Result<Mmap> {
    let file = File::open(path)?;
    check_size(&file, size)?;
    // SAFETY: the segment is sealed against shrinking and growth, and its
    // writer writes it again only once the store reuses it, which it does
    // only when no reader pins it, so the mapped bytes never change
    // underneath the reader.
    unsafe { Mmap::map(&file) }
}

fn check_size(file: &File, size: u64) -> io::Result<()> {
    let actual = file.metadata()?.len();
    if actual != size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the segment holds {actual} bytes, {size} were expected"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_segment_reads_back_and_keeps_its_size() {
        let mut segment = Segment::create("test", 8192).unwrap();
        let path = proc_path(std::process::id(), segment.raw_fd());
        let mut writable = map_writable(&path, 8192).unwrap();
        writable[..5].copy_from_slice(b"hello");
        drop(writable);
        segment.seal_at(5).unwrap();
        let readable = map_readonly(&path, 5).unwrap();
        assert_eq!(&readable[..], b"hello");
        let resized = OpenOptions::new().write(true).open(&path).unwrap().set_len(4096);
        assert!(
            resized.is_err(),
            "a sealed segment can neither shrink nor grow under its readers"
        );
    }

    #[test]
    fn a_sealed_segment_reused_for_a_new_object_must_be_written_whole() {
        let mut segment = Segment::create("test", 4096).unwrap();
        segment.seal_at(4096).unwrap();
        assert!(segment.reusable());
        assert!(segment.seal_at(100).is_err());
        segment.seal_at(4096).unwrap();
    }

    #[test]
    fn a_segment_handed_out_to_be_sent_is_never_reused() {
        let mut segment = Segment::create("test", 4096).unwrap();
        assert!(segment.file_to_send().is_err(), "only a sealed segment is sent");
        segment.seal_at(4096).unwrap();
        assert!(segment.reusable());
        let file = segment.file_to_send().unwrap();
        assert_eq!(file.metadata().unwrap().len(), 4096);
        assert!(!segment.reusable(), "a socket may still hold its pages");
    }

    #[test]
    fn only_a_sealed_segment_maps_as_shared_bytes() {
        let mut segment = Segment::create("test", 4).unwrap();
        assert!(segment.bytes().is_err());
        let path = proc_path(std::process::id(), segment.raw_fd());
        map_writable(&path, 4).unwrap().copy_from_slice(b"abcd");
        segment.seal_at(4).unwrap();
        assert_eq!(&segment.bytes().unwrap()[..], b"abcd");
        assert_eq!(segment.bytes().unwrap().as_ptr(), segment.bytes().unwrap().as_ptr());
    }

    #[test]
    fn a_spilled_segment_restores_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create("test", 3).unwrap();
        let path = proc_path(std::process::id(), segment.raw_fd());
        map_writable(&path, 3).unwrap().copy_from_slice(b"abc");
        segment.seal_at(3).unwrap();
        let spill = dir.path().join("object");
        segment.spill_to(&spill).unwrap();
        let restored = Segment::restore("test", &spill).unwrap();
        let path = proc_path(std::process::id(), restored.raw_fd());
        assert_eq!(&map_readonly(&path, 3).unwrap()[..], b"abc");
    }
}
