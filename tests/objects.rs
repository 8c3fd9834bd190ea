//! The shared-memory object store end to end, with real worker processes:
//! large values in shared memory, a gigabyte read in place by another
//! process, spilling through a small store, reference counting across
//! processes (arguments, results, nested references) and a full spill disk.

use std::path::Path;
use std::time::{Duration, Instant};

use raylet::prelude::*;
use raylet::{DType, Error, NodeMemory, SharedBytes, current};
use serde_bytes::ByteBuf;

const MIB: usize = 1 << 20;

fn cluster_with(config: Config) -> Cluster {
    raylet::init_with(config.num_cpus(2.0).num_gpus(0.0)).unwrap()
}

/// `len` bytes in which every 4 KiB block starts with its index.
fn pattern(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    for (index, block) in data.chunks_mut(4096).enumerate() {
        let stamp = (index as u64).to_le_bytes();
        let n = stamp.len().min(block.len());
        block[..n].copy_from_slice(&stamp[..n]);
    }
    data
}

/// Anonymous (private) resident memory of this process, in bytes.
fn rss_anon() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// What a worker saw of a tensor it read in place.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
struct TensorView {
    hash: u64,
    len: u64,
    shape: Vec<usize>,
    rss_anon_growth: u64,
}

#[raylet::remote]
fn view_tensor(tensor: ObjectRef<Tensor>) -> TensorView {
    let before = rss_anon();
    let archived = tensor.get_archived().unwrap();
    let hash = xxhash_rust::xxh3::xxh3_64(archived.as_bytes());
    let after = rss_anon();
    TensorView {
        hash,
        len: archived.as_bytes().len() as u64,
        shape: archived.shape(),
        rss_anon_growth: after.saturating_sub(before),
    }
}

#[raylet::remote]
fn make_block(fill: u8, len: u64) -> ByteBuf {
    ByteBuf::from(vec![fill; len as usize])
}

#[raylet::remote]
fn first_and_len(block: ByteBuf) -> (u8, u64) {
    (block[0], block.len() as u64)
}

/// Puts blocks in this worker and returns references to them.
#[raylet::remote]
fn put_blocks(count: u8, len: u64) -> Vec<ObjectRef<ByteBuf>> {
    let cluster = current().unwrap();
    (0..count)
        .map(|i| cluster.put(&ByteBuf::from(vec![i; len as usize])).unwrap())
        .collect()
}

#[raylet::remote]
fn total_len(blocks: Vec<ObjectRef<ByteBuf>>) -> u64 {
    blocks.iter().map(|b| b.get().unwrap().len() as u64).sum()
}

/// References a worker keeps after its task returned.
static HELD: std::sync::Mutex<Vec<ObjectRef<ByteBuf>>> = std::sync::Mutex::new(Vec::new());

/// Keeps the references and returns this worker's pid.
#[raylet::remote]
fn hold_forever(refs: Vec<ObjectRef<ByteBuf>>) -> u32 {
    HELD.lock().unwrap().extend(refs);
    std::process::id()
}

#[raylet::remote]
fn fails_to_make_bytes() -> ByteBuf {
    panic!("no bytes today")
}

/// The sum of a buffer's bytes, or `u64::MAX` when getting it failed.
fn byte_sum(block: &ObjectRef<ByteBuf>) -> u64 {
    block
        .get()
        .map_or(u64::MAX, |bytes| bytes.iter().map(|b| *b as u64).sum())
}

/// Keeps references it is handed and reads them then and later.
#[raylet::actor]
#[derive(Default)]
pub struct Keeper {
    kept: Vec<ObjectRef<ByteBuf>>,
}

#[raylet::actor]
impl Keeper {
    pub fn new() -> Self {
        Keeper::default()
    }

    pub fn keep(&mut self, blocks: Vec<ObjectRef<ByteBuf>>) -> Vec<u64> {
        self.kept = blocks;
        self.kept.iter().map(byte_sum).collect()
    }

    pub fn read_kept(&self) -> Vec<u64> {
        self.kept.iter().map(byte_sum).collect()
    }
}

#[raylet::remote]
fn square(x: u64) -> u64 {
    x * x
}

fn memory(cluster: &Cluster) -> NodeMemory {
    let mut nodes = cluster.memory().unwrap();
    assert_eq!(nodes.len(), 1);
    nodes.remove(0)
}

/// Waits until the node's store holds no object, or fails showing it.
fn wait_until_store_empty(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let node = memory(cluster);
        if node.objects.is_empty() && node.used_bytes == 0 && node.spilled_bytes == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the store still holds {} objects, {} B in memory, {} B spilled",
            node.objects.len(),
            node.used_bytes,
            node.spilled_bytes
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spill_files(dir: &Path) -> usize {
    walk(dir).len()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|entry| match entry.path().is_dir() {
            true => walk(&entry.path()),
            false => vec![entry.path()],
        })
        .collect()
}

#[test]
fn a_gigabyte_tensor_is_read_in_place_by_another_process() {
    let cluster = cluster_with(Config::new().object_store_memory(3 << 30));
    let data = pattern(1 << 30);
    let expected = xxhash_rust::xxh3::xxh3_64(&data);
    let tensor = Tensor::from_bytes(DType::U8, &[1 << 20, 1024], data).unwrap();
    let stored = cluster.put_archived(&tensor).unwrap();
    drop(tensor);
    let node = memory(&cluster);
    assert!(node.used_bytes >= 1 << 30, "the tensor lives in shared memory");

    let view = view_tensor::remote(&cluster, &stored).unwrap().get().unwrap();
    assert_eq!(view.hash, expected, "the worker read the same bytes");
    assert_eq!(view.len, 1 << 30);
    assert_eq!(view.shape, vec![1 << 20, 1024]);
    assert!(
        view.rss_anon_growth < 64 * MIB as u64,
        "reading 1 GiB in place grew the worker's private memory by {} B",
        view.rss_anon_growth
    );

    let before = rss_anon();
    let archived = stored.get_archived().unwrap();
    assert_eq!(xxhash_rust::xxh3::xxh3_64(archived.as_bytes()), expected);
    assert!(rss_anon().saturating_sub(before) < 64 * MIB as u64);
    drop(archived);
    drop(stored);
    wait_until_store_empty(&cluster);
}

/// What a worker saw of shared bytes it read.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
struct SharedBytesView {
    hash: u64,
    len: u64,
    in_shared_memory: bool,
    rss_anon_growth: u64,
}

impl SharedBytesView {
    fn of(bytes: &SharedBytes, before: u64) -> Self {
        SharedBytesView {
            hash: xxhash_rust::xxh3::xxh3_64(bytes),
            len: bytes.len() as u64,
            in_shared_memory: maps_a_memfd_at(bytes.as_ptr() as usize),
            rss_anon_growth: rss_anon().saturating_sub(before),
        }
    }
}

/// Whether this process maps a memfd (the store's shared memory) at `address`.
fn maps_a_memfd_at(address: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|line| {
        let range = line.split_whitespace().next().unwrap();
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (
            usize::from_str_radix(start, 16).unwrap(),
            usize::from_str_radix(end, 16).unwrap(),
        );
        (start..end).contains(&address) && line.contains("/memfd:")
    })
}

#[raylet::remote]
fn view_shared_bytes(bytes: ObjectRef<SharedBytes>) -> SharedBytesView {
    let before = rss_anon();
    SharedBytesView::of(&bytes.get().unwrap(), before)
}

#[raylet::remote]
fn view_shared_bytes_argument(bytes: SharedBytes) -> SharedBytesView {
    SharedBytesView::of(&bytes, rss_anon())
}

#[test]
fn shared_bytes_are_read_as_a_view_of_shared_memory_by_get_and_as_an_argument() {
    let cluster = cluster_with(Config::new().object_store_memory(1 << 30));
    let data = pattern(256 * MIB);
    let expected = xxhash_rust::xxh3::xxh3_64(&data);
    let stored = cluster.put(&SharedBytes::from(data)).unwrap();

    for view in [
        view_shared_bytes::remote(&cluster, &stored).unwrap().get().unwrap(),
        view_shared_bytes_argument::remote(&cluster, &stored)
            .unwrap()
            .get()
            .unwrap(),
    ] {
        assert_eq!((view.hash, view.len), (expected, 256 * MIB as u64), "the same bytes");
        assert!(view.in_shared_memory, "the worker's bytes point into the store's memfd");
        assert!(
            view.rss_anon_growth < 64 * MIB as u64,
            "reading 256 MiB as a view grew the worker's private memory by {} B",
            view.rss_anon_growth
        );
    }

    let before = rss_anon();
    let local = stored.get().unwrap();
    assert_eq!(xxhash_rust::xxh3::xxh3_64(&local), expected);
    assert!(
        maps_a_memfd_at(local.as_ptr() as usize),
        "the owner's get is a view too"
    );
    assert!(rss_anon().saturating_sub(before) < 64 * MIB as u64);

    drop(stored);
    assert_eq!(&local[..8], &0u64.to_le_bytes(), "a view outlives the ref");
    drop(local);
    wait_until_store_empty(&cluster);
}

#[test]
fn a_gigabyte_of_objects_spills_through_a_64_mib_store_and_leaves_nothing_behind() {
    let temp = tempfile::tempdir().unwrap();
    let config = Config::new().object_store_memory(64 * MIB as u64).temp_dir(temp.path());
    let cluster = cluster_with(config);
    let refs: Vec<ObjectRef<ByteBuf>> = (0..64u8)
        .map(|i| cluster.put(&ByteBuf::from(vec![i; 16 * MIB])).unwrap())
        .collect();
    let node = memory(&cluster);
    assert!(node.used_bytes <= 64 * MIB as u64);
    assert!(node.spilled_bytes >= 900 * MIB as u64, "spilled {}", node.spilled_bytes);
    assert!(spill_files(temp.path()) >= 56);
    for (i, object) in refs.iter().enumerate() {
        let value = object.get().unwrap();
        assert!(value[..] == vec![i as u8; 16 * MIB][..], "object {i} reads back whole");
    }
    drop(refs);
    wait_until_store_empty(&cluster);
    assert_eq!(
        spill_files(temp.path()),
        0,
        "spill files are deleted with their objects"
    );
}

#[test]
fn ten_thousand_objects_leave_the_store_empty_once_their_refs_drop() {
    let cluster = cluster_with(Config::new().object_store_memory(512 * MIB as u64));
    let block = 100 * 1024;
    let puts: Vec<ObjectRef<ByteBuf>> = (0..5000u32)
        .map(|i| cluster.put(&ByteBuf::from(vec![i as u8; block])).unwrap())
        .collect();
    let made: Vec<ObjectRef<ByteBuf>> = (0..4000u32)
        .map(|i| make_block::remote(&cluster, i as u8, block as u64).unwrap())
        .collect();
    let read: Vec<ObjectRef<(u8, u64)>> = puts[..500]
        .iter()
        .chain(&made[..500])
        .map(|object| first_and_len::remote(&cluster, object).unwrap())
        .collect();
    for (i, result) in cluster.get_all(&read).unwrap().into_iter().enumerate() {
        assert_eq!(result, ((i % 500) as u8, block as u64));
    }
    let sample = made[3999].get().unwrap();
    assert_eq!((sample.len(), sample[0]), (block, (3999 % 256) as u8));
    let node = memory(&cluster);
    assert!(node.objects.len() >= 1000, "large values are in the store");
    drop((puts, made, read, sample));
    wait_until_store_empty(&cluster);
}

#[test]
fn an_object_referenced_only_from_inside_another_lives_until_the_outer_one_drops() {
    let cluster = cluster_with(Config::new());
    let inner = cluster.put(&ByteBuf::from(vec![7u8; 4 * MIB])).unwrap();
    let inner_id = inner.id();
    let outer = cluster.put(&vec![inner]).unwrap();
    let in_store = |cluster: &Cluster| memory(cluster).objects.iter().any(|o| o.id == inner_id);
    std::thread::sleep(Duration::from_millis(200));
    assert!(in_store(&cluster), "the outer object keeps the inner one");
    let refs = outer.get().unwrap();
    assert_eq!(refs[0].get().unwrap()[..], vec![7u8; 4 * MIB][..]);
    assert_eq!(
        total_len::remote(&cluster, &outer).unwrap().get().unwrap(),
        4 * MIB as u64
    );
    drop(refs);
    std::thread::sleep(Duration::from_millis(200));
    assert!(in_store(&cluster));
    drop(outer);
    wait_until_store_empty(&cluster);
}

/// Small values inside an argument travel with the call up to a budget
/// (1 MiB); the rest, and every later read, come from the driver. Either
/// way the actor reads the same bytes, and a failed task's error.
#[test]
fn small_values_inside_an_argument_read_the_same_whether_sent_along_or_fetched() {
    let cluster = cluster_with(Config::new());
    const BLOCK: usize = 60 << 10;
    let mut blocks: Vec<ObjectRef<ByteBuf>> = (0..40u8)
        .map(|i| cluster.put(&ByteBuf::from(vec![i; BLOCK])).unwrap())
        .collect();
    let failed = fails_to_make_bytes::remote(&cluster).unwrap();
    assert!(failed.get().is_err());
    blocks.push(failed);
    let mut expected: Vec<u64> = (0..40u64).map(|i| i * BLOCK as u64).collect();
    expected.push(u64::MAX);
    let keeper = Keeper::remote(&cluster).num_cpus(0.0).spawn().unwrap();
    assert_eq!(keeper.keep(blocks.clone()).get().unwrap(), expected);
    drop(blocks);
    assert_eq!(keeper.read_kept().get().unwrap(), expected);
}

#[test]
fn objects_a_worker_puts_and_returns_live_while_the_driver_holds_them() {
    let cluster = cluster_with(Config::new());
    let blocks = put_blocks::remote(&cluster, 4, MIB as u64).unwrap();
    let refs = blocks.get().unwrap();
    drop(blocks);
    std::thread::sleep(Duration::from_millis(200));
    for (i, block) in refs.iter().enumerate() {
        assert_eq!(block.get().unwrap()[..], vec![i as u8; MIB][..]);
    }
    let total = total_len::remote(&cluster, refs.clone()).unwrap();
    assert_eq!(total.get().unwrap(), 4 * MIB as u64);
    drop(refs);
    wait_until_store_empty(&cluster);
}

#[test]
fn a_borrower_that_dies_holding_a_reference_leaks_nothing() {
    let cluster = cluster_with(Config::new());
    let block = cluster.put(&ByteBuf::from(vec![4u8; MIB])).unwrap();
    let worker = hold_forever::remote(&cluster, vec![block.clone()])
        .unwrap()
        .get()
        .unwrap();
    drop(block);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(memory(&cluster).objects.len(), 1, "the worker still holds the block");
    // The node may have ended the idle worker already.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    wait_until_store_empty(&cluster);
}

#[test]
fn a_large_task_result_is_read_from_shared_memory() {
    let cluster = cluster_with(Config::new());
    let block = make_block::remote(&cluster, 9, 32 * MIB as u64).unwrap();
    assert_eq!(block.get().unwrap()[..], vec![9u8; 32 * MIB][..]);
    assert_eq!(memory(&cluster).objects.len(), 1);
    let (first, len) = first_and_len::remote(&cluster, &block).unwrap().get().unwrap();
    assert_eq!((first, len), (9, 32 * MIB as u64));
    drop(block);
    wait_until_store_empty(&cluster);
    let started = Instant::now();
    cluster.shutdown().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a store session does not hold the shutdown up"
    );
}

#[test]
fn reading_a_value_in_the_other_format_is_a_clear_error() {
    let cluster = cluster_with(Config::new());
    let archived = cluster.put_archived(&Tensor::zeros(DType::F32, &[256, 256])).unwrap();
    let error = archived.get().unwrap_err();
    assert!(matches!(error, Error::WrongFormat { .. }), "{error}");
    assert!(error.to_string().contains("get_archived"), "{error}");
    let plain = cluster.put(&Tensor::zeros(DType::F32, &[4])).unwrap();
    let error = plain.get_archived().unwrap_err();
    assert!(error.to_string().contains("with get()"), "{error}");
    let small = cluster
        .put_archived(&Tensor::from_f32(&[3], &[1.0, 2.0, 3.0]).unwrap())
        .unwrap();
    assert_eq!(small.get_archived().unwrap().as_f32().unwrap(), &[1.0, 2.0, 3.0]);
}

#[test]
fn a_full_spill_disk_is_a_clear_object_store_full_and_the_cluster_keeps_working() {
    let temp = tempfile::tempdir().unwrap();
    let config = Config::new()
        .object_store_memory(32 * MIB as u64)
        .max_spill_bytes(32 * MIB as u64)
        .object_store_full_timeout(Duration::from_millis(500))
        .temp_dir(temp.path());
    let cluster = cluster_with(config);
    let mut held = Vec::new();
    let error = loop {
        match cluster.put(&ByteBuf::from(vec![1u8; 8 * MIB])) {
            Ok(object) => held.push(object),
            Err(error) => break error,
        }
        assert!(held.len() < 20, "the store never filled up");
    };
    let Error::ObjectStoreFull(message) = &error else {
        panic!("expected ObjectStoreFull, got {error}");
    };
    assert!(message.contains("spilled to disk"), "{message}");
    assert!(message.contains(&held[0].owner_address().to_string()), "{message}");
    assert!(held.iter().any(|o| message.contains(&o.id().to_string())), "{message}");
    assert_eq!(square::remote(&cluster, 12).unwrap().get().unwrap(), 144);
    held.truncate(held.len() / 2);
    std::thread::sleep(Duration::from_millis(300));
    let again = cluster.put(&ByteBuf::from(vec![2u8; 8 * MIB])).unwrap();
    assert_eq!(again.get().unwrap()[0], 2);
}
