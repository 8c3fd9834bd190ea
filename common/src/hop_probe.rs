//! Hop probes: where a call's time goes between processes. With
//! `RAYLET_HOP_PROBES=DIR` set, each process writes a record (the
//! machine's monotonic clock in nanoseconds and the hop) each time a call
//! passes a marked point, into `DIR/<pid>.hops`, a file it maps into memory
//! so that nothing is lost when a worker is killed at the end of a run.
//! `bench/hop_breakdown.py` lines the records of the driver and its
//! workers up, call by call. Unset, a mark costs one load of a static.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use memmap2::MmapMut;

/// The environment variable that names the folder probes write to.
pub const PROBES_ENV: &str = "RAYLET_HOP_PROBES";

/// A marked point on the path of a synchronous call, in the order a call
/// passes them. The numbers are the file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Hop {
    /// The caller entered `remote()`.
    CallerSubmits = 1,
    /// The caller's thread wrote the call's frame to the stream.
    CallerWrote = 2,
    /// The worker read the frame off the stream.
    WorkerRead = 3,
    /// The worker took the call from its queue to run it.
    WorkerDequeued = 4,
    /// The worker resolved the call's arguments.
    WorkerArgsReady = 5,
    /// The function or method returned.
    WorkerRan = 6,
    /// The worker wrote the result's frame to the stream.
    WorkerWrote = 7,
    /// The caller's stream reader read the result's frame.
    CallerRead = 8,
    /// The result is in the caller's store; waiting gets may wake.
    CallerStored = 9,
    /// The caller's `get` woke with the result.
    CallerWoke = 10,
    /// The caller's `get` returned the decoded value.
    CallerGot = 11,
}

/// Records a call passing `hop`, if probes are on.
#[inline]
pub fn mark(hop: Hop) {
    if let Some(probes) = probes() {
        probes.record(hop);
    }
}

/// Bytes of one record: the clock's nanoseconds and the hop, two
/// little-endian `u64`s.
const RECORD_BYTES: usize = 16;
/// A process's file holds at most this many records; later ones are dropped.
const MAX_RECORDS: usize = 2 << 20;

struct Probes {
    /// The file's words, two per record.
    words: &'static [AtomicU64],
    /// Keeps the mapping that `words` lies in.
    _map: MmapMut,
    next: AtomicUsize,
}

fn probes() -> Option<&'static Probes> {
    static PROBES: OnceLock<Option<Probes>> = OnceLock::new();
    PROBES
        .get_or_init(|| {
            let dir = std::env::var_os(PROBES_ENV)?;
            Probes::open(Path::new(&dir))
                .inspect_err(|error| eprintln!("raylet: hop probes in {dir:?} are off: {error}"))
                .ok()
        })
        .as_ref()
}

impl Probes {
    fn open(dir: &Path) -> std::io::Result<Probes> {
        std::fs::create_dir_all(dir)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(format!("{}.hops", std::process::id())))?;
        file.set_len((RECORD_BYTES * MAX_RECORDS) as u64)?;
        // SAFETY: the file was just created for this process alone and
        // is never truncated while mapped; records are written at indices
        // that one atomic counter hands out once each.
        let mut map = unsafe { MmapMut::map_mut(&file)? };
        // SAFETY: the mapping is page-aligned and 2 * MAX_RECORDS words
        // long, and it lives as long as `Probes`, which lives in a static.
        let words = unsafe { std::slice::from_raw_parts(map.as_mut_ptr().cast::<AtomicU64>(), 2 * MAX_RECORDS) };
        Ok(Probes {
            words,
            _map: map,
            next: AtomicUsize::new(0),
        })
    }

    fn record(&self, hop: Hop) {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        if index >= MAX_RECORDS {
            return;
        }
        self.words[2 * index].store(monotonic_nanos().to_le(), Ordering::Relaxed);
        self.words[2 * index + 1].store(u64::from(hop as u8).to_le(), Ordering::Relaxed);
    }
}

/// The machine's monotonic clock, the same in every process.
fn monotonic_nanos() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_land_in_the_file_in_order_with_their_hops() {
        let dir = tempfile::tempdir().unwrap();
        let probes = Probes::open(dir.path()).unwrap();
        probes.record(Hop::CallerSubmits);
        probes.record(Hop::WorkerRead);
        let bytes = std::fs::read(dir.path().join(format!("{}.hops", std::process::id()))).unwrap();
        let first = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let second = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
        assert!(first > 0 && second >= first);
        assert_eq!((bytes[8], bytes[24], bytes[40]), (1, 3, 0));
    }
}
