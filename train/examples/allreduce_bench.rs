//! Allreduce bandwidth of the collective group on loopback, as nccl-tests
//! reports it: for each size, the median time of a sum allreduce of f32 on
//! 2 and 4 ranks (threads of this process, each with its own TCP links),
//! its algorithm bandwidth (bytes / time) and bus bandwidth (algbw ×
//! 2(n-1)/n), beside loopback TCP throughput measured in the same run: one
//! stream alone, and each of n streams running at once, as the n links of
//! an n-rank ring do (on a machine with few cores they share its CPUs).
//!
//! `cargo run --release -p raylet-train --example allreduce_bench [-- --max-mib 256] [--write bench/allreduce.md]`
//!
//! With `--write`, the table also goes to that file, which
//! `bench/compare_ray.py` puts into BENCHMARKS.md.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use raylet_train::collective::{CollectiveGroup, GroupOptions, ReduceOp};

/// Each size is timed for at least this long (after one warm-up call).
const BUDGET: Duration = Duration::from_millis(600);
/// The group sizes measured.
const WORLDS: [usize; 2] = [2, 4];

fn main() {
    let max_mib: usize = flag("--max-mib").map_or(256, |mib| mib.parse().expect("--max-mib takes a number"));
    let cluster = raylet::init().expect("an embedded cluster");
    let tcp = loopback_tcp_gbps(1);
    let concurrent: Vec<f64> = WORLDS.iter().map(|&world| loopback_tcp_gbps(world)).collect();
    let mut report = vec![
        format!("Loopback TCP measured in the same run: one stream alone {tcp:.2} GB/s; each of 2 streams at once {:.2} GB/s; each of 4 at once {:.2} GB/s.", concurrent[0], concurrent[1]),
        String::new(),
        "| ranks | size | time (median) | algbw GB/s | busbw GB/s | busbw / one stream alone | busbw / one of n streams at once |".into(),
        "|---|---|---|---|---|---|---|".into(),
    ];
    report.iter().for_each(|line| println!("{line}"));
    let mut bytes = 1 << 10;
    let mut sizes = Vec::new();
    while bytes <= max_mib << 20 {
        sizes.push(bytes);
        bytes *= 4;
    }
    for (&world, &shared) in WORLDS.iter().zip(&concurrent) {
        let times = time_allreduces(&cluster, world, &sizes);
        for (&bytes, time) in sizes.iter().zip(times) {
            let algbw = bytes as f64 / time.as_secs_f64() / 1e9;
            let busbw = algbw * 2.0 * (world - 1) as f64 / world as f64;
            let row = format!(
                "| {world} | {} | {} | {algbw:.3} | {busbw:.3} | {:.0}% | {:.0}% |",
                human(bytes),
                format_time(time),
                100.0 * busbw / tcp,
                100.0 * busbw / shared
            );
            println!("{row}");
            report.push(row);
        }
    }
    cluster.shutdown().expect("the cluster stops");
    if let Some(path) = flag("--write") {
        std::fs::write(&path, report.join("\n") + "\n").expect("the report is written");
    }
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != name).nth(1)
}

/// The median time of an allreduce of each size on `world` ranks.
fn time_allreduces(cluster: &raylet::Cluster, world: usize, sizes: &[usize]) -> Vec<Duration> {
    let name = format!("bench-{world}-{}", std::process::id());
    let start = Arc::new(Barrier::new(world));
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            let (cluster, name, sizes, start) = (cluster.clone(), name.clone(), sizes.to_vec(), start.clone());
            std::thread::spawn(move || {
                let mut group = CollectiveGroup::join(&cluster, &name, rank, world, GroupOptions::default())
                    .expect("the ranks meet");
                sizes
                    .iter()
                    .map(|&bytes| {
                        let mut values = vec![rank as f32; bytes / 4];
                        start.wait();
                        median_time(&mut group, &mut values)
                    })
                    .collect::<Vec<Duration>>()
            })
        })
        .collect();
    let per_rank: Vec<Vec<Duration>> = ranks.into_iter().map(|rank| rank.join().expect("a rank")).collect();
    (0..sizes.len())
        .map(|i| per_rank.iter().map(|times| times[i]).max().expect("ranks"))
        .collect()
}

/// Times allreduces until the budget is spent; every rank runs as many,
/// as rank 0 decides through the group itself.
fn median_time(group: &mut CollectiveGroup, values: &mut [f32]) -> Duration {
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
    times[times.len() / 2]
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
