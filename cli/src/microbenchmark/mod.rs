//! `raylet microbenchmark`: the metrics of `ray microbenchmark`, measured
//! the same way (a warm-up, then timed trials of repeated calls) and printed
//! in the same words (but for the put and get calls, which stay in the
//! driver's own memory here and are named so), with object rows whose bytes
//! cross a process, on an embedded cluster whose workers are this binary,
//! or on the cluster at `RAYLET_ADDRESS`, where a second node started with
//! the `microbenchmark_peer` resource adds node-to-node transfer, beside one
//! loopback TCP stream measured between its trials; then the control
//! plane's scale simulations (alone with `--filter scheduler`).

use std::time::{Duration, Instant};

use raylet::{Amount, ResourceSet};
use raylet::{Bundle, Cluster, Config, DType, ObjectRef, PlacementGroup, PlacementStrategy, Tensor};
use serde_bytes::ByteBuf;

use crate::args::MicrobenchmarkArgs;

mod actors;
mod generators;
mod loopback;
mod objects;
mod ping_pong;
mod scheduler;

#[raylet::remote]
fn small_value() -> ByteBuf {
    ByteBuf::from(b"ok".to_vec())
}

/// Puts `count` zero-filled buffers of 80 MiB, each made just before its
/// put, as Ray's `do_put` puts `np.zeros(10 * 1024 * 1024, dtype=np.int64)`.
#[raylet::remote]
fn put_zeroed_buffers(count: usize) {
    let cluster = raylet::current().expect("tasks run in a cluster");
    for _ in 0..count {
        cluster.put(&zeroed_like_numpy(80 * 1024 * 1024)).expect("put");
    }
}

/// A zero-filled buffer allocated as numpy allocates `np.zeros` of 4 MiB
/// and more: untouched zero pages, advised to be huge pages, so that reading
/// it faults once per 2 MiB rather than once per 4 KiB.
fn zeroed_like_numpy(len: usize) -> ByteBuf {
    const HUGE_PAGE: usize = 2 * 1024 * 1024;
    let buffer = vec![0u8; len];
    let start = buffer.as_ptr().addr().next_multiple_of(HUGE_PAGE);
    let end = (buffer.as_ptr().addr() + len) / HUGE_PAGE * HUGE_PAGE;
    if let Some(aligned) = std::ptr::NonNull::new(buffer.as_ptr().with_addr(start).cast_mut())
        && end > start
    {
        // SAFETY: the range lies inside `buffer`, and the advice changes
        // how its pages are backed, never their contents.
        let advised =
            unsafe { nix::sys::mman::madvise(aligned.cast(), end - start, nix::sys::mman::MmapAdvise::MADV_HUGEPAGE) };
        if let Err(error) = advised {
            tracing::debug!(%error, "huge pages cannot be advised");
        }
    }
    ByteBuf::from(buffer)
}

/// Bytes of the tensor that node-to-node transfer moves.
const TRANSFER_BYTES: usize = 1 << 30;
/// The custom resource of the node that node-to-node transfer pulls to.
const PEER_RESOURCE: &str = "microbenchmark_peer";
const TRANSFER_METRIC: &str = "node-to-node transfer gigabytes";

/// Maps a tensor that lives on another node, which pulls it to this one;
/// returns the seconds that took.
#[raylet::remote(num_cpus = 0, resources(microbenchmark_peer = 1))]
fn time_pull(tensor: ObjectRef<Tensor>) -> f64 {
    let started = Instant::now();
    let archived = tensor.get_archived().expect("pulling the tensor");
    std::hint::black_box(archived.as_bytes().len());
    started.elapsed().as_secs_f64()
}

#[raylet::remote]
fn create_object_containing_ref() -> Vec<ObjectRef<u64>> {
    let cluster = raylet::current().expect("tasks run in a cluster");
    (0..10_000).map(|_| cluster.put(&1u64).expect("put")).collect()
}

/// How long to warm up and to time each trial.
struct Timing {
    warmup: Duration,
    trial: Duration,
    trials: usize,
}

/// One metric: a name as Ray prints it, and work that counts `multiplier` operations.
struct Metric<'a> {
    name: String,
    multiplier: f64,
    run: Box<dyn FnMut() -> raylet::Result<()> + 'a>,
    /// Whether each run is one call whose latency is printed too.
    latency: bool,
}

impl Metric<'_> {
    /// Prints the median and 99th percentile of a run's time beside the rate.
    fn with_latency(mut self) -> Self {
        self.latency = true;
        self
    }
}

pub fn microbenchmark(args: MicrobenchmarkArgs) -> anyhow::Result<()> {
    let timing = match args.quick {
        true => Timing {
            warmup: Duration::from_millis(100),
            trial: Duration::from_millis(300),
            trials: 2,
        },
        false => Timing {
            warmup: Duration::from_secs(1),
            trial: Duration::from_secs(2),
            trials: 4,
        },
    };
    crate::init_logging("warn");
    if args.filter.as_deref().is_some_and(|f| f.starts_with(scheduler::PREFIX)) {
        scheduler::run(args.quick);
        return Ok(());
    }
    let pg_resource = ResourceSet::new().with(PG_RESOURCE, Amount::whole(100));
    let cluster = raylet::init_with(Config::from_env().log_to_driver(false).resources(pg_resource))?;
    let metrics = metrics(&cluster)?;
    let mut ran = 0;
    for mut metric in metrics {
        if !args.filter.as_ref().is_none_or(|f| metric.name.contains(f.as_str())) {
            continue;
        }
        let measured = measure(&mut metric, &timing)?;
        let (mean, deviation) = mean_and_deviation(&measured.rates);
        println!("{} per second {mean:.2} +- {deviation:.2}", metric.name);
        if let Some((p50, p99)) = measured.latency_percentiles() {
            println!("{} latency p50 {p50:.1} us p99 {p99:.1} us", metric.name);
        }
        ran += 1;
    }
    if args
        .filter
        .as_ref()
        .is_none_or(|f| TRANSFER_METRIC.contains(f.as_str()))
    {
        match measure_transfer(&cluster, &timing)? {
            Some(rates) => print_transfer(&rates),
            None => println!(
                "{TRANSFER_METRIC}: skipped; it needs RAYLET_ADDRESS of a cluster with a second node \
                 started with --resources '{{\"{PEER_RESOURCE}\": 1}}'"
            ),
        }
        ran += 1;
    }
    cluster.shutdown()?;
    if args.filter.is_none() {
        scheduler::run(args.quick);
        ran += 1;
    }
    if ran == 0 {
        anyhow::bail!("no metric matches --filter {:?}", args.filter.unwrap_or_default());
    }
    Ok(())
}

/// A metric's rate in each trial, and each run's time in microseconds when
/// it asks for its latency.
struct Measured {
    rates: Vec<f64>,
    run_micros: Vec<f32>,
}

impl Measured {
    /// The median and the 99th percentile of a run's time.
    fn latency_percentiles(mut self) -> Option<(f32, f32)> {
        if self.run_micros.is_empty() {
            return None;
        }
        self.run_micros.sort_by(f32::total_cmp);
        let at = |share: f64| self.run_micros[((self.run_micros.len() - 1) as f64 * share).round() as usize];
        Some((at(0.5), at(0.99)))
    }
}

fn measure(metric: &mut Metric<'_>, timing: &Timing) -> raylet::Result<Measured> {
    let started = Instant::now();
    while started.elapsed() < timing.warmup {
        (metric.run)()?;
    }
    let mut measured = Measured {
        rates: Vec::with_capacity(timing.trials),
        run_micros: Vec::new(),
    };
    for _ in 0..timing.trials {
        let started = Instant::now();
        let mut count = 0u64;
        let mut run_started = started;
        while run_started - started < timing.trial {
            (metric.run)()?;
            let run_ended = Instant::now();
            if metric.latency {
                measured.run_micros.push((run_ended - run_started).as_secs_f32() * 1e6);
            }
            run_started = run_ended;
            count += 1;
        }
        measured
            .rates
            .push(metric.multiplier * count as f64 / started.elapsed().as_secs_f64());
    }
    Ok(measured)
}

fn mean_and_deviation(rates: &[f64]) -> (f64, f64) {
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let variance = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rates.len() as f64;
    (mean, variance.sqrt())
}

/// GB/s of node-to-node transfer and of one loopback TCP stream, trial by
/// trial.
struct TransferRates {
    transfer: Vec<f64>,
    stream: Vec<f64>,
}

/// GB/s of pulling a fresh 1 GiB tensor, put on the driver's node, to the
/// node with [`PEER_RESOURCE`], timed inside the task that maps it there:
/// one warm-up, then one pull per trial, each followed by a trial of one
/// loopback TCP stream. `None` without such a node.
fn measure_transfer(cluster: &Cluster, timing: &Timing) -> anyhow::Result<Option<TransferRates>> {
    let status = cluster.status()?;
    if !status
        .alive()
        .any(|node| node.total.get(PEER_RESOURCE) > Default::default())
    {
        return Ok(None);
    }
    let mut rates = TransferRates {
        transfer: Vec::with_capacity(timing.trials),
        stream: Vec::with_capacity(timing.trials),
    };
    for trial in 0..=timing.trials {
        let tensor = cluster.put_archived(&Tensor::zeros(DType::U8, &[TRANSFER_BYTES]))?;
        let seconds = time_pull::remote(cluster, &tensor)?.get()?;
        if trial > 0 {
            rates.transfer.push(TRANSFER_BYTES as f64 / seconds / 1e9);
            rates.stream.push(loopback::stream_rate(timing.trial)?);
        }
    }
    Ok(Some(rates))
}

/// Prints both rates, and the transfer's as a share of the stream's.
fn print_transfer(rates: &TransferRates) {
    let (transfer, transfer_deviation) = mean_and_deviation(&rates.transfer);
    let (stream, stream_deviation) = mean_and_deviation(&rates.stream);
    println!("{TRANSFER_METRIC} per second {transfer:.2} +- {transfer_deviation:.2}");
    println!("{} per second {stream:.2} +- {stream_deviation:.2}", loopback::METRIC);
    println!(
        "{TRANSFER_METRIC}: {:.0}% of one loopback TCP stream",
        100.0 * transfer / stream
    );
}

fn metrics(cluster: &Cluster) -> raylet::Result<Vec<Metric<'_>>> {
    let value = cluster.put(&0u64)?;
    let mut large: Option<ByteBuf> = None;
    let mut written: Option<ByteBuf> = None;
    let containing = create_object_containing_ref::remote(cluster)?;
    let mut tensor: Option<ObjectRef<Tensor>> = None;
    let mut task_clients: Option<Vec<actors::EchoHandle>> = None;
    let mut metrics = vec![
        metric(
            "single client get calls (in-process, owner's memory)",
            1.0,
            Box::new(move || value.get().map(drop)),
        ),
        metric(
            "single client put calls (in-process, owner's memory)",
            1.0,
            Box::new(|| cluster.put(&0u64).map(drop)),
        ),
        metric(
            "single client put gigabytes",
            0.8,
            Box::new(move || {
                let large = large.get_or_insert_with(|| zeroed_like_numpy(800 * 1024 * 1024));
                cluster.put(large).map(drop)
            }),
        ),
        metric(
            "single client put gigabytes from written memory",
            0.8,
            Box::new(move || {
                let written = written.get_or_insert_with(|| ByteBuf::from(vec![1u8; 800 * 1024 * 1024]));
                cluster.put(written).map(drop)
            }),
        ),
        metric(
            "multi client put gigabytes",
            8.0,
            Box::new(|| multi_client_put(cluster, 10, 10)),
        ),
        metric(
            "single client get 1 GiB tensor zero-copy",
            1.0,
            Box::new(move || {
                let tensor = match &tensor {
                    Some(tensor) => tensor,
                    None => tensor.insert(cluster.put_archived(&Tensor::zeros(DType::U8, &[1 << 30]))?),
                };
                let archived = tensor.get_archived()?;
                std::hint::black_box(archived.as_bytes().len());
                Ok(())
            }),
        ),
        metric(
            "single client tasks and get batch",
            1.0,
            Box::new(|| tasks_and_get(cluster, 1000)),
        ),
        metric(
            "single client get object containing 10k refs",
            1.0,
            Box::new(move || containing.get().map(drop)),
        ),
        metric(
            "single client wait 1k refs",
            1.0,
            Box::new(|| wait_one_by_one(cluster, 1000)),
        ),
        metric(
            "single client tasks sync",
            1.0,
            Box::new(|| small_value::remote(cluster)?.get().map(drop)),
        )
        .with_latency(),
        metric(
            "single client tasks async",
            1000.0,
            Box::new(|| tasks_and_get(cluster, 1000)),
        ),
        metric(
            "multi client tasks async",
            40_000.0,
            Box::new(move || {
                let clients = once(&mut task_clients, || (0..4).map(|_| actors::echo(cluster)).collect())?;
                let batches: Vec<ObjectRef<usize>> = clients.iter().map(|c| c.small_value_batch(10_000)).collect();
                cluster.get_all(&batches).map(drop)
            }),
        ),
    ];
    metrics.extend(objects::object_metrics(cluster));
    metrics.extend(actors::actor_metrics(cluster));
    metrics.extend(generators::generator_metrics(cluster));
    metrics.extend(ping_pong::ping_pong_metrics());
    metrics.push(metric(
        "placement group create/removal",
        PLACEMENT_GROUPS as f64,
        Box::new(|| placement_group_create_removal(cluster, PLACEMENT_GROUPS)),
    ));
    Ok(metrics)
}

/// Placement groups created, waited for and removed per round, as Ray's
/// microbenchmark does, each of one bundle of a sliver of [`PG_RESOURCE`].
const PLACEMENT_GROUPS: usize = 100;
/// The custom resource the embedded node offers for placement group bundles.
const PG_RESOURCE: &str = "custom";

fn placement_group_create_removal(cluster: &Cluster, count: usize) -> raylet::Result<()> {
    let bundle = || vec![Bundle::new().resource(PG_RESOURCE, 0.001)];
    let groups: Vec<PlacementGroup> = (0..count)
        .map(|_| cluster.placement_group(bundle(), PlacementStrategy::Pack))
        .collect::<raylet::Result<_>>()?;
    for group in &groups {
        group.ready_timeout(Duration::from_secs(30))?;
    }
    groups.iter().try_for_each(PlacementGroup::remove)
}

/// Sets up once, on the first run, what a metric's runs share.
fn once<S>(state: &mut Option<S>, make: impl FnOnce() -> raylet::Result<S>) -> raylet::Result<&S> {
    if state.is_none() {
        *state = Some(make()?);
    }
    Ok(state.as_ref().expect("set above"))
}

fn metric<'a>(
    name: impl Into<String>,
    multiplier: f64,
    run: Box<dyn FnMut() -> raylet::Result<()> + 'a>,
) -> Metric<'a> {
    Metric {
        name: name.into(),
        multiplier,
        run,
        latency: false,
    }
}

fn tasks_and_get(cluster: &Cluster, count: usize) -> raylet::Result<()> {
    let refs: Vec<ObjectRef<ByteBuf>> = (0..count)
        .map(|_| small_value::remote(cluster))
        .collect::<raylet::Result<_>>()?;
    cluster.get_all(&refs).map(drop)
}

/// Submits `count` tasks, then waits for them one at a time, as Ray's
/// `ray.wait(not_ready)` loop does.
fn wait_one_by_one(cluster: &Cluster, count: usize) -> raylet::Result<()> {
    let mut not_ready: Vec<ObjectRef<ByteBuf>> = (0..count)
        .map(|_| small_value::remote(cluster))
        .collect::<raylet::Result<_>>()?;
    while !not_ready.is_empty() {
        not_ready = cluster.wait(&not_ready, 1, None).1;
    }
    Ok(())
}

/// `clients` tasks each put `per_client` buffers of 80 MiB.
fn multi_client_put(cluster: &Cluster, clients: usize, per_client: usize) -> raylet::Result<()> {
    let refs: Vec<ObjectRef<()>> = (0..clients)
        .map(|_| put_zeroed_buffers::remote(cluster, per_client))
        .collect::<raylet::Result<_>>()?;
    cluster.get_all(&refs).map(drop)
}
