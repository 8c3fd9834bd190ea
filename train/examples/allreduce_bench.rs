//! Allreduce bandwidth of the collective group on one host, as nccl-tests
//! reports it: for each size, the median time of a sum allreduce of f32 on
//! 2 and 4 ranks (each an actor in a worker process of its own), its
//! algorithm bandwidth (bytes / time) and bus bandwidth (algbw × 2(n-1)/n),
//! over each transport: TCP links on loopback (as between hosts) and the
//! shared-memory pipes ranks on one host use. Beside them, loopback TCP
//! throughput measured in the same run: one stream alone, and each of n
//! streams running at once, as the n links of an n-rank ring do (on a
//! machine with few cores they share its CPUs).
//!
//! `cargo run --release -p raylet-train --example allreduce_bench [-- --max-mib 256] [--json FILE]`
//!
//! With `--json`, each measurement also goes to FILE as a JSON line
//! (`{"system": "raylet-tcp", "ranks": 2, "bytes": 1024, "median_s": .., "reps": ..}`,
//! `raylet-shm` for shared memory,
//! and `{"system": "loopback-tcp", "streams": n, "gbps": ..}`), which
//! `bench/compare_allreduce.sh` sets beside torch.distributed's Gloo and
//! Open MPI.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use raylet::ObjectRef;
use raylet_train::collective::{CollectiveGroup, GroupOptions, ReduceOp};
use serde_json::json;

/// Each size is timed for at least this long (after one warm-up call).
const BUDGET: Duration = Duration::from_millis(600);
/// The group sizes measured.
const WORLDS: [usize; 2] = [2, 4];
/// The transports measured: (name, whether ranks use shared memory).
const TRANSPORTS: [(&str, bool); 2] = [("tcp", false), ("shm", true)];

/// One rank of a group, in a worker process of its own.
#[raylet::actor]
struct Rank;

#[raylet::actor]
impl Rank {
    fn new() -> Self {
        Rank
    }

    /// Joins the group `name` and times an allreduce of each size: the
    /// median seconds and how many calls were timed.
    fn time_allreduces(
        &self,
        name: String,
        rank: usize,
        world: usize,
        shared_memory: bool,
        sizes: Vec<usize>,
    ) -> Vec<(f64, usize)> {
        let cluster = raylet::current().expect("actors run in a cluster");
        let options = GroupOptions {
            shared_memory,
            ..GroupOptions::default()
        };
        let mut group = CollectiveGroup::join(&cluster, &name, rank, world, options).expect("the ranks meet");
        let expected_pipes = if shared_memory { world - 1 } else { 0 };
        assert_eq!(group.shared_memory_links(), expected_pipes, "the transport asked for");
        sizes
            .iter()
            .map(|&bytes| {
                let mut values = vec![rank as f32; bytes / 4];
                let (median, reps) = median_time(&mut group, &mut values);
                (median.as_secs_f64(), reps)
            })
            .collect()
    }
}

fn main() {
    let max_mib: usize = flag("--max-mib").map_or(256, |mib| mib.parse().expect("--max-mib takes a number"));
    let mut json_lines = Vec::new();
    let cluster = raylet::init().expect("an embedded cluster");
    let tcp = loopback_tcp_gbps(1);
    let concurrent: Vec<f64> = WORLDS.iter().map(|&world| loopback_tcp_gbps(world)).collect();
    for (streams, gbps) in [(1, tcp)]
        .into_iter()
        .chain(WORLDS.into_iter().zip(concurrent.iter().copied()))
    {
        json_lines.push(json!({"system": "loopback-tcp", "streams": streams, "gbps": gbps}));
    }
    println!(
        "Loopback TCP: one stream alone {tcp:.2} GB/s; each of 2 streams at once {:.2} GB/s; each of 4 at once {:.2} GB/s.",
        concurrent[0], concurrent[1]
    );
    println!(
        "| transport | ranks | size | time (median) | algbw GB/s | busbw GB/s | busbw / one stream alone | busbw / one of n streams at once |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut bytes = 1 << 10;
    let mut sizes = Vec::new();
    while bytes <= max_mib << 20 {
        sizes.push(bytes);
        bytes *= 4;
    }
    for (transport, shared_memory) in TRANSPORTS {
        for (&world, &shared) in WORLDS.iter().zip(&concurrent) {
            let times = time_allreduces(&cluster, world, shared_memory, &sizes);
            for (&bytes, (seconds, reps)) in sizes.iter().zip(times) {
                let algbw = bytes as f64 / seconds / 1e9;
                let busbw = algbw * 2.0 * (world - 1) as f64 / world as f64;
                println!(
                    "| {transport} | {world} | {} | {} | {algbw:.3} | {busbw:.3} | {:.0}% | {:.0}% |",
                    human(bytes),
                    format_time(Duration::from_secs_f64(seconds)),
                    100.0 * busbw / tcp,
                    100.0 * busbw / shared
                );
                json_lines.push(json!({"system": format!("raylet-{transport}"), "ranks": world, "bytes": bytes, "median_s": seconds, "reps": reps}));
            }
        }
    }
    cluster.shutdown().expect("the cluster stops");
    if let Some(path) = flag("--json") {
        let text: String = json_lines.iter().map(|line| format!("{line}\n")).collect();
        std::fs::write(&path, text).expect("the JSON lines are written");
    }
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != name).nth(1)
}

/// The median time of an allreduce of each size on `world` ranks, and
/// how many calls it was taken over, as rank 0 saw them.
fn time_allreduces(cluster: &raylet::Cluster, world: usize, shared_memory: bool, sizes: &[usize]) -> Vec<(f64, usize)> {
    let name = format!("bench-{world}-{shared_memory}-{}", std::process::id());
    let ranks: Vec<RankHandle> = (0..world)
        .map(|_| Rank::remote(cluster).num_cpus(0.0).spawn())
        .collect::<raylet::Result<_>>()
        .expect("the ranks start");
    let times: Vec<ObjectRef<Vec<(f64, usize)>>> = ranks
        .iter()
        .enumerate()
        .map(|(rank, actor)| actor.time_allreduces(name.clone(), rank, world, shared_memory, sizes.to_vec()))
        .collect();
    let mut per_rank = cluster.get_all(&times).expect("every rank times its allreduces");
    for actor in &ranks {
        cluster.kill(actor, true).expect("a rank ends");
    }
    per_rank.swap_remove(0)
}

/// Times allreduces until the budget is spent; every rank runs as many,
/// as rank 0 decides through the group itself. The median time, and how
/// many calls were timed.
fn median_time(group: &mut CollectiveGroup, values: &mut [f32]) -> (Duration, usize) {
    group.allreduce(values, ReduceOp::Sum).expect("warm-up");
    let mut times = Vec::new();
    let started = Instant::now();
    loop {
        let mut more = [f32::from(started.elapsed() < BUDGET && times.len() < 10_000)];
        group.broadcast(&mut more, 0).expect("a broadcast");
        if more[0] == 0.0 {
            break;
        }
        let call = Instant::now();
        group.allreduce(values, ReduceOp::Sum).expect("an allreduce");
        times.push(call.elapsed());
    }
    times.sort();
    (times[times.len() / 2], times.len())
}

/// The throughput of each of `streams` TCP streams over loopback that run
/// at once (as the `streams` links of a ring do), 1 GiB each in 4 MiB writes.
fn loopback_tcp_gbps(streams: usize) -> f64 {
    let total: usize = 1 << 30;
    let start = Arc::new(Barrier::new(streams));
    let receivers: Vec<_> = (0..streams)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || one_stream(total, &start))
        })
        .collect();
    let slowest = receivers
        .into_iter()
        .map(|receiver| receiver.join().expect("a stream"))
        .max()
        .expect("at least one stream");
    total as f64 / slowest.as_secs_f64() / 1e9
}

/// Sends `total` bytes over a fresh loopback connection once `start`
/// opens; returns how long the receiving side took.
fn one_stream(total: usize, start: &Barrier) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let address = listener.local_addr().expect("its address");
    let sender = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(address).expect("a connection");
        let block = vec![7u8; 4 << 20];
        for _ in 0..total / block.len() {
            stream.write_all(&block).expect("a write");
        }
    });
    let (mut stream, _) = listener.accept().expect("the connection");
    let mut block = vec![0u8; 4 << 20];
    start.wait();
    let started = Instant::now();
    let mut received = 0;
    while received < total {
        received += stream.read(&mut block).expect("a read");
    }
    let elapsed = started.elapsed();
    sender.join().expect("the sender");
    elapsed
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b >> 10),
    }
}

fn format_time(time: Duration) -> String {
    match time.as_micros() {
        us if us >= 10_000 => format!("{:.1} ms", us as f64 / 1000.0),
        us => format!("{us} µs"),
    }
}
