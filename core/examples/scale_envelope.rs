//! raylet's side of Ray's release-test envelope (release/benchmarks in
//! Ray's repository), one workload per run, as a driver of the cluster at
//! `RAYLET_ADDRESS` (or of an embedded one without it). Prints one JSON
//! line, `{"workload": .., "scale": .., "seconds": ..}`, the seconds timed
//! inside this driver; `bench/compare_envelope.sh` starts the cluster,
//! samples its processes' memory and sets the line beside Ray's.
//!
//! `scale_envelope WORKLOAD [--scale N]`, WORKLOAD one of:
//! - `tasks_1m`: as Ray's `test_many_queued_tasks`: one task per CPU
//!   blocks on a gate actor, N no-op tasks (default 1,000,000) are
//!   submitted behind them, the gate opens, and every result is got.
//! - `args_10k`: as Ray's `test_many_args`: N (default 10,000) puts of a
//!   list of 10,000 ones, and one task that gets them all and sums them.
//!   Ray passes the refs as N positional arguments that Ray resolves before
//!   the task runs; a raylet function has a fixed argument list, so here the
//!   task takes them in one `Vec` and gets them itself.
//! - `pgs_1000`: N placement groups (default 1,000) of one bundle of
//!   0.001 CPU, created, waited for and removed.
//! - `many_actors`: N actors (default 100) of no CPU, each a worker
//!   process, created and each called once.
//! - `broadcast_1g`: as Ray's `test_object_broadcast`: a 1 GiB tensor of
//!   ones put by this driver and one reader actor on each node with a
//!   custom resource `host1`..`hostN` (default 3), called once; then, timed,
//!   every reader at once maps the tensor on its node (which pulls it
//!   there) and sums its bytes.

use std::time::{Duration, Instant};

use raylet::prelude::*;
use raylet::{Bundle, DType, PlacementGroup, PlacementStrategy, Tensor};
use serde_json::json;
use tokio::sync::Semaphore;

/// Tasks block on it until it opens (Ray's test uses a semaphore actor).
#[raylet::actor]
struct Gate {
    open: Semaphore,
}

#[raylet::actor]
impl Gate {
    fn new() -> Self {
        Gate {
            open: Semaphore::new(0),
        }
    }

    /// Waits until the gate opens.
    pub async fn pass(&self) {
        let permit = self.open.acquire().await.expect("the gate's semaphore is never closed");
        permit.forget();
    }

    /// Lets `count` waiting tasks through.
    pub async fn open(&self, count: usize) {
        self.open.add_permits(count);
    }
}

#[raylet::remote(num_cpus = 1)]
fn block(gate: GateHandle) {
    gate.pass().get().expect("the gate answers");
}

#[raylet::remote(num_cpus = 1)]
fn no_op() {}

#[raylet::remote]
fn sum_args(args: Vec<ObjectRef<Vec<u64>>>) -> u64 {
    let cluster = raylet::current().expect("tasks run in a cluster");
    let lists = cluster.get_all(&args).expect("the owner serves the lists");
    lists.iter().map(|list| list.iter().sum::<u64>()).sum()
}

/// An actor that answers one call, as Ray's many-actors test's.
#[raylet::actor]
struct Idle;

#[raylet::actor]
impl Idle {
    fn new() -> Self {
        Idle
    }

    fn ping(&self) {}
}

/// Reads broadcast tensors on its node.
#[raylet::actor]
struct Reader;

#[raylet::actor]
impl Reader {
    fn new() -> Self {
        Reader
    }

    fn ping(&self) {}

    /// The sum of the tensor's bytes, as Ray's reader sums its array.
    fn sum(&self, tensor: ObjectRef<Tensor>) -> u64 {
        let archived = tensor.get_archived().expect("the tensor is pulled to this node");
        archived.as_bytes().iter().map(|&byte| u64::from(byte)).sum()
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workload = args.first().map(String::as_str).unwrap_or_default();
    let default_scale = match workload {
        "tasks_1m" => 1_000_000,
        "args_10k" => 10_000,
        "pgs_1000" => 1_000,
        "many_actors" => 100,
        "broadcast_1g" => 3,
        other => anyhow::bail!(
            "unknown workload {other:?}: give one of tasks_1m, args_10k, pgs_1000, many_actors, broadcast_1g"
        ),
    };
    let scale = match args.iter().position(|arg| arg == "--scale") {
        Some(at) => args
            .get(at + 1)
            .ok_or_else(|| anyhow::anyhow!("--scale takes a number"))?
            .parse()?,
        None => default_scale,
    };
    let cluster = raylet::init()?;
    let seconds = match workload {
        "tasks_1m" => timed(|| queued_tasks(&cluster, scale))?,
        "args_10k" => timed(|| many_args(&cluster, scale))?,
        "pgs_1000" => timed(|| placement_groups(&cluster, scale))?,
        "many_actors" => timed(|| many_actors(&cluster, scale))?,
        _ => broadcast(&cluster, scale)?,
    };
    println!("{}", json!({"workload": workload, "scale": scale, "seconds": seconds}));
    cluster.shutdown()?;
    Ok(())
}

/// The seconds `work` took.
fn timed(work: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let started = Instant::now();
    work()?;
    Ok(started.elapsed().as_secs_f64())
}

fn queued_tasks(cluster: &Cluster, count: usize) -> anyhow::Result<()> {
    let cpus = cluster
        .status()?
        .alive()
        .map(|node| node.total.get("CPU").as_f64())
        .sum::<f64>() as usize;
    // Ray runs up to 1,000 calls of an async actor at once; the gate must
    // take `open` while every blocked task waits in `pass`.
    let gate = Gate::remote(cluster).num_cpus(0.0).max_concurrency(1000).spawn()?;
    let blocked: Vec<ObjectRef<()>> = (0..cpus)
        .map(|_| block::remote(cluster, gate.clone()))
        .collect::<raylet::Result<_>>()?;
    let pending: Vec<ObjectRef<()>> = (0..count)
        .map(|_| no_op::remote(cluster))
        .collect::<raylet::Result<_>>()?;
    gate.open(cpus).get()?;
    cluster.get_all(&blocked)?;
    for result in &pending {
        result.get()?;
    }
    Ok(())
}

fn many_args(cluster: &Cluster, count: usize) -> anyhow::Result<()> {
    let list = vec![1u64; 10_000];
    let args: Vec<ObjectRef<Vec<u64>>> = (0..count).map(|_| cluster.put(&list)).collect::<raylet::Result<_>>()?;
    let sum = sum_args::remote(cluster, args)?.get()?;
    anyhow::ensure!(sum == 10_000 * count as u64, "the sum is {sum}");
    Ok(())
}

fn placement_groups(cluster: &Cluster, count: usize) -> anyhow::Result<()> {
    let groups: Vec<PlacementGroup> = (0..count)
        .map(|_| cluster.placement_group(vec![Bundle::new().num_cpus(0.001)], PlacementStrategy::Pack))
        .collect::<raylet::Result<_>>()?;
    for group in &groups {
        group.ready_timeout(Duration::from_secs(600))?;
    }
    groups.iter().try_for_each(PlacementGroup::remove)?;
    Ok(())
}

fn many_actors(cluster: &Cluster, count: usize) -> anyhow::Result<()> {
    let actors: Vec<IdleHandle> = (0..count)
        .map(|_| Idle::remote(cluster).num_cpus(0.0).spawn())
        .collect::<raylet::Result<_>>()?;
    let pings: Vec<ObjectRef<()>> = actors.iter().map(IdleHandle::ping).collect();
    cluster.get_all(&pings)?;
    Ok(())
}

/// The seconds from asking every reader to sum the tensor to having every sum.
fn broadcast(cluster: &Cluster, hosts: usize) -> anyhow::Result<f64> {
    const BYTES: usize = 1 << 30;
    let tensor = cluster.put_archived(&Tensor::from_bytes(DType::U8, &[BYTES], vec![1u8; BYTES])?)?;
    let readers: Vec<ReaderHandle> = (1..=hosts)
        .map(|host| {
            Reader::remote(cluster)
                .num_cpus(0.0)
                .resource(&format!("host{host}"), 1.0)
                .spawn()
        })
        .collect::<raylet::Result<_>>()?;
    cluster.get_all(&readers.iter().map(ReaderHandle::ping).collect::<Vec<_>>())?;
    let started = Instant::now();
    let sums = cluster.get_all(
        &readers
            .iter()
            .map(|reader| reader.sum(tensor.clone()))
            .collect::<Vec<_>>(),
    )?;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(sums.iter().all(|&sum| sum == BYTES as u64), "a reader summed {sums:?}");
    Ok(seconds)
}
