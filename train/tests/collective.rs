//! The collective group over real TCP on loopback and over shared-memory
//! pipes (both transports, each test), its ranks threads of this process
//! that meet through an embedded cluster's key-value store: allreduce
//! against a sequential reduction for 1 to 4 ranks and sizes from one
//! element to 64 MiB, the other collectives, tensors in three float types,
//! fusion, and failures (a rank
//! that dies or goes silent mid-call, ranks out of step).

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use raylet::Cluster;
use raylet_test_support::Need;
use raylet_train::collective::{CollectiveError, CollectiveGroup, GroupOptions, ReduceOp, segment_range};

fn cluster() -> Cluster {
    raylet::init().unwrap()
}

/// Both transports: ranks on one host through shared memory, and over TCP.
const TRANSPORTS: [bool; 2] = [true, false];

fn options(shared_memory: bool) -> GroupOptions {
    GroupOptions {
        shared_memory,
        ..GroupOptions::default()
    }
}

/// Runs `work` on `world` ranks of a new group, each on its own thread;
/// returns their results by rank.
fn on_ranks<R: Send + 'static>(
    cluster: &Cluster,
    world: usize,
    options: GroupOptions,
    work: impl Fn(CollectiveGroup) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let name = format!("test-{:016x}", rand_name());
    let work = Arc::new(work);
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let (cluster, name, options, work) = (cluster.clone(), name.clone(), options.clone(), work.clone());
            std::thread::spawn(move || {
                let group = CollectiveGroup::join(&cluster, &name, rank, world, options).unwrap();
                work(group)
            })
        })
        .collect();
    threads.into_iter().map(|thread| thread.join().unwrap()).collect()
}

fn rand_name() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

/// Rank `rank`'s input: halves of small integers, so that every order of
/// summing gives the same bits.
fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7 + rank * 13) % 101) as f32 * 0.5).collect()
}

fn sequential(world: usize, len: usize, op: ReduceOp) -> Vec<f32> {
    let mut reduced = input(0, len);
    for rank in 1..world {
        for (into, value) in reduced.iter_mut().zip(input(rank, len)) {
            *into = match op {
                ReduceOp::Max => into.max(value),
                ReduceOp::Sum | ReduceOp::Mean => *into + value,
            };
        }
    }
    if op == ReduceOp::Mean {
        reduced.iter_mut().for_each(|value| *value /= world as f32);
    }
    reduced
}

#[test]
fn allreduce_matches_a_sequential_reduction_for_1_to_4_ranks_and_1_element_to_64_mib() {
    let cluster = cluster();
    // 1 << 18 elements: a 1 MiB buffer, whose ring steps on 2 ranks are the
    // largest TCP messages a rank writes before it reads, on one thread.
    let sizes = [1, 3, 1_000, 16_385, 1 << 18, 1_000_003, 16 << 20];
    for shared_memory in TRANSPORTS {
        for world in 1..=4 {
            for len in sizes {
                let ops: &[ReduceOp] = match len {
                    1_000_003 => &[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max],
                    _ => &[ReduceOp::Sum],
                };
                for &op in ops {
                    check_allreduce(&cluster, shared_memory, world, len, op);
                }
            }
        }
    }
}

fn check_allreduce(cluster: &Cluster, shared_memory: bool, world: usize, len: usize, op: ReduceOp) {
    let started = Instant::now();
    let results = on_ranks(cluster, world, options(shared_memory), move |mut group| {
        let pipes = group.shared_memory_links();
        let mut values = input(group.rank(), len);
        group.allreduce(&mut values, op).unwrap();
        (pipes, values)
    });
    let expected = sequential(world, len, op);
    let case = format!("{world} ranks, {len} elements, {op:?}, shared memory {shared_memory}");
    for (rank, (pipes, result)) in results.iter().enumerate() {
        let expected_pipes = if shared_memory { world - 1 } else { 0 };
        assert_eq!(*pipes, expected_pipes, "{case}: rank {rank}'s links to the others");
        assert!(result == &expected, "{case}: rank {rank} differs");
    }
    println!("{case}: {:?}", started.elapsed());
}

#[test]
fn no_shared_memory_file_outlives_the_forming_of_a_group() {
    let cluster = cluster();
    let prefix = format!("raylet-collective-{}-", std::process::id());
    let files = on_ranks(&cluster, 4, options(true), move |mut group| {
        group.barrier().unwrap();
        let files: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with(&prefix))
            .collect();
        (group.shared_memory_links(), files)
    });
    for (pipes, files) in files {
        assert_eq!(pipes, 3);
        assert!(files.is_empty(), "pipes' files are unlinked once mapped: {files:?}");
    }
}

/// A `/dev/shm` too small for every pipe (a container's is 64 MiB) leaves
/// the links whose pipes do not fit on TCP, instead of a SIGBUS later:
/// here room for two of the six pipes of 3 ranks, so at most one link is
/// shared memory, and the group still reduces right.
#[test]
fn a_full_dev_shm_leaves_links_on_tcp_and_the_group_still_reduces() {
    let cluster = cluster();
    let ranks = std::thread::spawn(move || {
        if let Err(why) = mount_small_dev_shm("size=10m") {
            raylet_test_support::missing(Need::ShmMount, &why);
            return None;
        }
        Some(on_ranks(&cluster, 3, options(true), |mut group| {
            let pipes = group.shared_memory_links();
            let mut values = input(group.rank(), 1_000_003);
            group.allreduce(&mut values, ReduceOp::Sum).unwrap();
            (pipes, values)
        }))
    })
    .join()
    .unwrap();
    let Some(ranks) = ranks else { return };
    let pipes: Vec<usize> = ranks.iter().map(|(pipes, _)| *pipes).collect();
    assert!(pipes.iter().sum::<usize>() <= 2, "at most one link fits: {pipes:?}");
    let expected = sequential(3, 1_000_003, ReduceOp::Sum);
    assert!(ranks.iter().all(|(_, values)| values == &expected));
    println!("links through shared memory, by rank: {pipes:?}");
}

/// Gives this thread (and the threads it starts) a mount namespace of its
/// own with a small tmpfs on `/dev/shm`; needs root.
fn mount_small_dev_shm(options: &str) -> Result<(), String> {
    // SAFETY: plain syscalls on this thread's own namespace, with
    // NUL-terminated strings that outlive them.
    unsafe {
        if libc::geteuid() != 0 || libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err("mounting a small /dev/shm needs root and mount namespaces".into());
        }
        let private = libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        let options = std::ffi::CString::new(options).unwrap();
        let tmpfs = libc::mount(
            c"tmpfs".as_ptr(),
            c"/dev/shm".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            options.as_ptr().cast(),
        );
        match (private, tmpfs) {
            (0, 0) => Ok(()),
            _ => Err(format!("mount: {}", std::io::Error::last_os_error())),
        }
    }
}

#[test]
fn f64_means_are_the_same_bits_on_every_rank() {
    let cluster = cluster();
    for shared_memory in TRANSPORTS {
        f64_means_on_every_rank(&cluster, shared_memory);
    }
}

fn f64_means_on_every_rank(cluster: &Cluster, shared_memory: bool) {
    let results = on_ranks(cluster, 3, options(shared_memory), |mut group| {
        let mut values: Vec<f64> = (0..300_001)
            .map(|i| (i as f64).sin() * (group.rank() + 1) as f64)
            .collect();
        group.allreduce(&mut values, ReduceOp::Mean).unwrap();
        values
    });
    assert!(results.windows(2).all(|pair| pair[0] == pair[1]));
    let expected: Vec<f64> = (0..300_001).map(|i| (i as f64).sin() * 6.0 / 3.0).collect();
    let worst = results[0]
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-12, "{worst}");
}

#[test]
fn broadcast_barrier_allgather_and_reduce_scatter_do_what_they_say() {
    let cluster = cluster();
    for shared_memory in TRANSPORTS {
        other_collectives(&cluster, shared_memory);
    }
}

fn other_collectives(cluster: &Cluster, shared_memory: bool) {
    let results = on_ranks(cluster, 3, options(shared_memory), |mut group| {
        let rank = group.rank();
        let mut values = vec![rank as f32; 100_000];
        group.broadcast(&mut values, 1).unwrap();
        let mut record = match rank {
            2 => b"rank two's model record, 37 bytes".to_vec(),
            _ => Vec::new(),
        };
        group.broadcast_bytes(&mut record, 2).unwrap();
        group.barrier().unwrap();
        let gathered = group.allgather(&[rank as f64, 10.0 * rank as f64]).unwrap();
        let scattered = group.reduce_scatter(&input(rank, 1_000), ReduceOp::Sum).unwrap();
        (values, record, gathered, scattered)
    });
    let summed = sequential(3, 1_000, ReduceOp::Sum);
    for (rank, (values, record, gathered, scattered)) in results.into_iter().enumerate() {
        assert!(values.iter().all(|&v| v == 1.0), "rank {rank} has rank 1's values");
        assert_eq!(record, b"rank two's model record, 37 bytes");
        assert_eq!(gathered, [0.0, 0.0, 1.0, 10.0, 2.0, 20.0]);
        assert_eq!(scattered, summed[segment_range(1_000, 3, rank)]);
    }
}

#[test]
fn fused_allreduce_reduces_every_buffer_across_fusion_boundaries() {
    let cluster = cluster();
    let options = GroupOptions {
        fusion_bytes: 4_000,
        ..GroupOptions::default()
    };
    let lengths = [10, 500, 1, 2_000, 7, 300];
    let results = on_ranks(&cluster, 2, options, move |mut group| {
        let mut buffers: Vec<Vec<f32>> = lengths.iter().map(|&len| input(group.rank(), len)).collect();
        let mut views: Vec<&mut [f32]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
        group.allreduce_fused(&mut views, ReduceOp::Sum).unwrap();
        buffers
    });
    for buffers in results {
        for (buffer, &len) in buffers.iter().zip(&lengths) {
            assert_eq!(buffer, &sequential(2, len, ReduceOp::Sum));
        }
    }
}

#[test]
fn a_rank_that_dies_mid_allreduce_fails_every_other_rank_at_once() {
    let cluster = cluster();
    for shared_memory in TRANSPORTS {
        a_dying_rank_fails_the_others(&cluster, shared_memory);
    }
}

fn a_dying_rank_fails_the_others(cluster: &Cluster, shared_memory: bool) {
    let options = GroupOptions {
        timeout: Duration::from_secs(30),
        shared_memory,
        ..GroupOptions::default()
    };
    let started = Instant::now();
    let results = on_ranks(cluster, 3, options, |mut group| {
        if group.rank() == 2 {
            std::thread::sleep(Duration::from_millis(300));
            drop(group);
            return None;
        }
        let mut values = input(group.rank(), 1 << 20);
        let first = group.allreduce(&mut values, ReduceOp::Sum).unwrap_err();
        let again = group.barrier().unwrap_err();
        Some((first, again))
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no rank waited out the timeout"
    );
    for (first, again) in results.into_iter().flatten() {
        assert!(
            matches!(first, CollectiveError::PeerLost { .. }),
            "a lost peer is named: {first}"
        );
        assert!(matches!(again, CollectiveError::Broken(_)), "{again}");
    }
}

#[test]
fn a_rank_that_goes_silent_fails_the_others_after_the_timeout_and_nothing_hangs() {
    let cluster = cluster();
    for shared_memory in TRANSPORTS {
        a_silent_rank_times_the_others_out(&cluster, shared_memory);
    }
}

fn a_silent_rank_times_the_others_out(cluster: &Cluster, shared_memory: bool) {
    let options = GroupOptions {
        timeout: Duration::from_secs(1),
        shared_memory,
        ..GroupOptions::default()
    };
    let started = Instant::now();
    let results = on_ranks(cluster, 3, options, |mut group| {
        if group.rank() == 0 {
            std::thread::sleep(Duration::from_secs(3));
            return group.barrier().unwrap_err();
        }
        let mut values = input(group.rank(), 100_000);
        group.allreduce(&mut values, ReduceOp::Sum).unwrap_err()
    });
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let timeouts = results
        .iter()
        .filter(|error| matches!(error, CollectiveError::Timeout { .. }))
        .count();
    assert!(timeouts >= 1, "a silent rank times out: {results:?}");
}

#[test]
fn ranks_that_call_different_collectives_fail_instead_of_mixing_them_up() {
    let cluster = cluster();
    for shared_memory in TRANSPORTS {
        ranks_out_of_step_fail(&cluster, shared_memory);
    }
}

fn ranks_out_of_step_fail(cluster: &Cluster, shared_memory: bool) {
    let results = on_ranks(cluster, 2, options(shared_memory), |mut group| match group.rank() {
        0 => group.barrier().and_then(|()| group.barrier()).err(),
        _ => {
            let mut values = vec![0f32; 10];
            group.allreduce(&mut values, ReduceOp::Sum).err()
        }
    });
    assert!(results.iter().any(Option::is_some), "{results:?}");
    let described = format!("{results:?}");
    assert!(
        described.contains("SizeMismatch") || described.contains("OutOfStep"),
        "{described}"
    );
}

#[test]
fn joining_as_a_rank_outside_the_group_or_alone_in_time_fails_clearly() {
    let cluster = cluster();
    let error = CollectiveGroup::join(&cluster, "bad", 3, 3, GroupOptions::default())
        .err()
        .unwrap();
    assert!(error.to_string().contains("rank 3 is not in a group of 3"), "{error}");
    let options = GroupOptions {
        rendezvous_timeout: Duration::from_millis(500),
        ..GroupOptions::default()
    };
    let error = CollectiveGroup::join(&cluster, "lonely", 1, 2, options).err().unwrap();
    assert!(
        error
            .to_string()
            .contains("rank 0 of group 'lonely' did not join in time"),
        "{error}"
    );
}

/// A `[4, 25]` tensor of `value`s in `dtype` on the CPU, as a GPU rank's
/// would be on its GPU.
fn filled(value: f32, dtype: DType) -> Tensor<2> {
    let data = TensorData::new(vec![value; 100], [4, 25]).convert_dtype(dtype);
    Tensor::from_data(data, (&raylet_train::cpu_device(), dtype))
}

#[test]
fn tensors_are_reduced_and_broadcast_in_their_own_float_type_and_device() {
    let cluster = cluster();
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let results = on_ranks(&cluster, 3, options(true), move |mut group| {
            let rank = group.rank();
            let summed = group
                .allreduce_tensor(filled(rank as f32 + 1.0, dtype), ReduceOp::Sum)
                .unwrap();
            let broadcast = group.broadcast_tensor(filled(rank as f32 * 10.0, dtype), 1).unwrap();
            (summed, broadcast)
        });
        for (rank, (summed, broadcast)) in results.into_iter().enumerate() {
            for (tensor, expected) in [(summed, 6.0), (broadcast, 10.0)] {
                assert_eq!(tensor.dtype(), dtype, "rank {rank} keeps its type");
                assert_eq!(tensor.dims(), [4, 25]);
                assert_eq!(tensor.device(), raylet_train::cpu_device());
                let values = tensor.into_data().try_into_vec_as::<f32>().unwrap();
                assert!(
                    values.iter().all(|&v| v == expected),
                    "rank {rank} {dtype:?}: {values:?}"
                );
            }
        }
    }
}
