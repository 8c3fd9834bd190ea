//! The actor metrics of `ray microbenchmark`, with the same actors: a sync
//! actor that uses no CPU, an async actor, and client actors that call
//! them. Each metric makes its actors on its first run, in the warm-up.

use raylet::{ActorHandle, Cluster, ObjectRef, SharedBytes};
use serde_bytes::ByteBuf;

use super::{Metric, metric, once, small_value};

/// Ray's `Actor` (`num_cpus=0`).
#[raylet::actor]
pub struct Echo;

#[raylet::actor]
impl Echo {
    pub fn new() -> Self {
        Echo
    }

    pub fn small_value(&self) -> ByteBuf {
        ByteBuf::from(b"ok".to_vec())
    }

    pub fn small_value_arg(&self, _x: u64) -> ByteBuf {
        ByteBuf::from(b"ok".to_vec())
    }

    pub fn small_value_big_arg(&self, _x: SharedBytes) -> ByteBuf {
        ByteBuf::from(b"ok".to_vec())
    }

    /// Submits `n` small-value tasks and gets them.
    pub fn small_value_batch(&self, n: usize) -> usize {
        let cluster = raylet::current().expect("actors run in a cluster");
        let results: Vec<ObjectRef<ByteBuf>> = (0..n)
            .map(|_| small_value::remote(&cluster).expect("submitting a task"))
            .collect();
        get_all(&results)
    }
}

/// Ray's `AsyncActor`.
#[raylet::actor]
pub struct AsyncEcho;

#[raylet::actor]
impl AsyncEcho {
    pub fn new() -> Self {
        AsyncEcho
    }

    pub async fn small_value(&self) -> ByteBuf {
        ByteBuf::from(b"ok".to_vec())
    }

    pub async fn small_value_with_arg(&self, _x: u64) -> ByteBuf {
        ByteBuf::from(b"ok".to_vec())
    }
}

/// Ray's `Client` (`num_cpus=0`): calls its servers, of either kind, through
/// untyped handles.
#[raylet::actor]
pub struct Caller {
    servers: Vec<ActorHandle>,
}

#[raylet::actor]
impl Caller {
    pub fn new(servers: Vec<ActorHandle>) -> Self {
        Caller { servers }
    }

    pub fn small_value_batch(&self, n: usize) -> usize {
        let results: Vec<ObjectRef<ByteBuf>> = self
            .servers
            .iter()
            .flat_map(|server| (0..n).map(|_| server.call("small_value", Ok(Vec::new()))))
            .collect();
        get_all(&results)
    }

    pub fn small_value_batch_arg(&self, n: usize) -> usize {
        let cluster = raylet::current().expect("actors run in a cluster");
        let x = cluster.put(&0u64).expect("put");
        let results: Vec<ObjectRef<ByteBuf>> = self
            .servers
            .iter()
            .flat_map(|server| {
                (0..n).map(|_| server.call("small_value_arg", raylet::IntoArg::<u64>::into_arg(&x).map(|a| vec![a])))
            })
            .collect();
        get_all(&results)
    }

    /// As `small_value_batch_arg`, with a 1 MiB buffer put instead of `0`:
    /// above the inline limit, so each call's worker maps it from the
    /// node's store and reads it as `SharedBytes`, without a copy.
    pub fn small_value_batch_big_arg(&self, n: usize) -> usize {
        let cluster = raylet::current().expect("actors run in a cluster");
        let x = cluster.put(&SharedBytes::from(vec![1u8; 1 << 20])).expect("put");
        let results: Vec<ObjectRef<ByteBuf>> = self
            .servers
            .iter()
            .flat_map(|server| {
                (0..n).map(|_| {
                    server.call(
                        "small_value_big_arg",
                        raylet::IntoArg::<SharedBytes>::into_arg(&x).map(|a| vec![a]),
                    )
                })
            })
            .collect();
        get_all(&results)
    }
}

fn get_all(results: &[ObjectRef<ByteBuf>]) -> usize {
    let cluster = raylet::current().expect("actors run in a cluster");
    cluster.get_all(results).expect("the servers answer").len()
}

/// Ray's `work` task: `n` calls spread over `actors`, then gets them all.
#[raylet::remote]
fn call_round_robin(actors: Vec<ActorHandle>, n: usize) -> usize {
    let results: Vec<ObjectRef<ByteBuf>> = (0..n)
        .map(|i| actors[i % actors.len()].call("small_value", Ok(Vec::new())))
        .collect();
    get_all(&results)
}

/// Half the machine's CPUs, at least one: Ray's `n_cpu`.
fn half_the_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get() / 2).max(1)
}

pub(super) fn echo(cluster: &Cluster) -> raylet::Result<EchoHandle> {
    Echo::remote(cluster).num_cpus(0.0).spawn()
}

fn echoes(cluster: &Cluster, count: usize) -> raylet::Result<Vec<ActorHandle>> {
    (0..count).map(|_| Ok(echo(cluster)?.as_ref().clone())).collect()
}

fn async_echoes(cluster: &Cluster, count: usize) -> raylet::Result<Vec<ActorHandle>> {
    (0..count)
        .map(|_| Ok(AsyncEcho::remote(cluster).spawn()?.as_ref().clone()))
        .collect()
}

fn caller_of(cluster: &Cluster, servers: Vec<ActorHandle>) -> raylet::Result<CallerHandle> {
    Caller::remote(cluster, servers).num_cpus(0.0).spawn()
}

/// `count` callers, each with an `Echo` of its own to call.
fn callers_with_own_echo(cluster: &Cluster, count: usize) -> raylet::Result<Vec<CallerHandle>> {
    (0..count)
        .map(|_| caller_of(cluster, vec![echo(cluster)?.as_ref().clone()]))
        .collect()
}

/// `tasks` tasks each make `n` calls round-robin over `actors`.
fn round_robin_from_tasks(cluster: &Cluster, actors: &[ActorHandle], tasks: usize, n: usize) -> raylet::Result<()> {
    let work: Vec<ObjectRef<usize>> = (0..tasks)
        .map(|_| call_round_robin::remote(cluster, actors.to_vec(), n))
        .collect::<raylet::Result<_>>()?;
    cluster.get_all(&work).map(drop)
}

fn calls<T>(count: usize, call: impl Fn(usize) -> ObjectRef<T>) -> Vec<ObjectRef<T>> {
    (0..count).map(call).collect()
}

pub(super) fn actor_metrics(cluster: &Cluster) -> Vec<Metric<'_>> {
    let (n, m, n_cpu) = (5000, 4, half_the_cpus());
    let mut sync_actor = None;
    let mut async_actor = None;
    let mut concurrent_actor = None;
    let mut one_to_n = None;
    let mut n_to_n = None;
    let mut n_to_n_arg = None;
    let mut n_to_n_big_arg = None;
    let mut async_sync_actor = None;
    let mut async_async_actor = None;
    let mut async_args_actor = None;
    let mut async_one_to_n = None;
    let mut async_n_to_n = None;
    vec![
        metric(
            "1:1 actor calls sync",
            1.0,
            Box::new(move || once(&mut sync_actor, || echo(cluster))?.small_value().get().map(drop)),
        )
        .with_latency(),
        metric(
            "1:1 actor calls async",
            1000.0,
            Box::new(move || {
                let actor = once(&mut async_actor, || echo(cluster))?;
                cluster.get_all(&calls(1000, |_| actor.small_value())).map(drop)
            }),
        ),
        metric(
            "1:1 actor calls concurrent",
            1000.0,
            Box::new(move || {
                let actor = once(&mut concurrent_actor, || {
                    Echo::remote(cluster).num_cpus(0.0).max_concurrency(16).spawn()
                })?;
                cluster.get_all(&calls(1000, |_| actor.small_value())).map(drop)
            }),
        ),
        metric(
            "1:n actor calls async",
            (n * n_cpu) as f64,
            Box::new(move || {
                let client = once(&mut one_to_n, || caller_of(cluster, echoes(cluster, n_cpu)?))?;
                client.small_value_batch(n).get().map(drop)
            }),
        ),
        metric(
            "n:n actor calls async",
            (m * n) as f64,
            Box::new(move || round_robin_from_tasks(cluster, once(&mut n_to_n, || echoes(cluster, n_cpu))?, m, n)),
        ),
        metric(
            "n:n actor calls with arg async",
            (1000 * n_cpu) as f64,
            Box::new(move || {
                let clients = once(&mut n_to_n_arg, || callers_with_own_echo(cluster, n_cpu))?;
                cluster
                    .get_all(&calls(clients.len(), |i| clients[i].small_value_batch_arg(1000)))
                    .map(drop)
            }),
        ),
        metric(
            "n:n actor calls with 1 MiB arg async",
            (1000 * n_cpu) as f64,
            Box::new(move || {
                let clients = once(&mut n_to_n_big_arg, || callers_with_own_echo(cluster, n_cpu))?;
                cluster
                    .get_all(&calls(clients.len(), |i| clients[i].small_value_batch_big_arg(1000)))
                    .map(drop)
            }),
        ),
        metric(
            "1:1 async-actor calls sync",
            1.0,
            Box::new(move || {
                let actor = once(&mut async_sync_actor, || AsyncEcho::remote(cluster).spawn())?;
                actor.small_value().get().map(drop)
            }),
        )
        .with_latency(),
        metric(
            "1:1 async-actor calls async",
            1000.0,
            Box::new(move || {
                let actor = once(&mut async_async_actor, || AsyncEcho::remote(cluster).spawn())?;
                cluster.get_all(&calls(1000, |_| actor.small_value())).map(drop)
            }),
        ),
        metric(
            "1:1 async-actor calls with args async",
            1000.0,
            Box::new(move || {
                let actor = once(&mut async_args_actor, || AsyncEcho::remote(cluster).spawn())?;
                cluster
                    .get_all(&calls(1000, |i| actor.small_value_with_arg(i as u64)))
                    .map(drop)
            }),
        ),
        metric(
            "1:n async-actor calls async",
            (n * n_cpu) as f64,
            Box::new(move || {
                let client = once(&mut async_one_to_n, || {
                    caller_of(cluster, async_echoes(cluster, n_cpu)?)
                })?;
                client.small_value_batch(n).get().map(drop)
            }),
        ),
        metric(
            "n:n async-actor calls async",
            (m * n) as f64,
            Box::new(move || {
                let actors = once(&mut async_n_to_n, || async_echoes(cluster, n_cpu))?;
                round_robin_from_tasks(cluster, actors, m, n)
            }),
        ),
    ]
}
