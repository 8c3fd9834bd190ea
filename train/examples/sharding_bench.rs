//! Samples per second and memory per rank of sharded data parallelism (ZeRO
//! stages 0-3, `raylet_train::sharding`) on a model of 52.5 M parameters:
//! eight 2560 x 2560 linear layers with ReLU, Adam, a regression on random
//! data. Each rank is an actor in a worker process of its own; the ranks
//! talk through shared memory (the collective group's transport for ranks
//! on one host). For each strategy and rank count it prints the
//! median step time, samples per second over every rank, and per rank the
//! bytes of parameters and optimizer state kept between steps (what the
//! strategy shards) and the worker process's resident memory between steps
//! and at its peak.
//!
//! `cargo run --release -p raylet-train --example sharding_bench [-- --steps 6] [--ranks 2,4] [--width 2560] [--write bench/sharding.md]`
//!
//! With `--write`, the report (how it was run, the model, the table) also
//! goes to that file, which `bench/compare_ray.py` inlines into
//! BENCHMARKS.md.

use std::time::Instant;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::Distribution;
use raylet::ObjectRef;
use raylet_train::collective::{CollectiveGroup, GroupOptions};
use raylet_train::sharding::{DataParallel, ShardMemory, ShardingStrategy};
use serde::{Deserialize, Serialize};

const LAYERS: usize = 8;
const BATCH_PER_RANK: usize = 8;
const STRATEGIES: [ShardingStrategy; 4] = [
    ShardingStrategy::None,
    ShardingStrategy::OptimizerState,
    ShardingStrategy::Gradients,
    ShardingStrategy::Parameters,
];

/// Square linear layers with ReLU between them.
#[derive(Module, Debug)]
struct WideMlp {
    layers: Vec<Linear>,
    activation: Relu,
}

impl WideMlp {
    fn new(width: usize, device: &Device) -> Self {
        WideMlp {
            layers: (0..LAYERS)
                .map(|_| LinearConfig::new(width, width).init(device))
                .collect(),
            activation: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        for layer in &self.layers {
            x = self.activation.forward(layer.forward(x));
        }
        x
    }
}

/// What one rank measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RankFigures {
    step_seconds: Vec<f64>,
    memory: ShardMemory,
    rss_between_steps: u64,
    rss_peak: u64,
}

#[raylet::actor]
struct Rank;

#[raylet::actor]
impl Rank {
    fn new() -> Self {
        Rank
    }

    fn train(
        &self,
        name: String,
        rank: usize,
        world: usize,
        strategy: ShardingStrategy,
        width: usize,
        steps: usize,
    ) -> RankFigures {
        let cluster = raylet::current().expect("actors run in a cluster");
        let mut group =
            CollectiveGroup::join(&cluster, &name, rank, world, GroupOptions::default()).expect("the ranks meet");
        let device = Device::flex().autodiff();
        let model = WideMlp::new(width, &device);
        let mut parallel =
            DataParallel::new(&mut group, model, AdamConfig::new().init(), strategy).expect("the ranks start alike");
        let mut step_seconds = Vec::new();
        let mut rss_between_steps = 0;
        for _ in 0..steps {
            let started = Instant::now();
            let model = parallel.model(&mut group).expect("the model gathers");
            let input = Tensor::<2>::random([BATCH_PER_RANK, width], Distribution::Default, &device);
            let target = Tensor::<2>::random([BATCH_PER_RANK, width], Distribution::Default, &device);
            let loss = (model.forward(input) - target).powi_scalar(2).mean();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            parallel
                .step(&mut group, 1e-4, model, grads, &Device::flex())
                .expect("a step");
            step_seconds.push(started.elapsed().as_secs_f64());
            rss_between_steps = resident_bytes("VmRSS:");
        }
        RankFigures {
            step_seconds,
            memory: parallel.memory().expect("the shard's size"),
            rss_between_steps,
            rss_peak: resident_bytes("VmHWM:"),
        }
    }
}

fn main() {
    let steps: usize = flag("--steps").map_or(6, |s| s.parse().expect("--steps takes a number"));
    let width: usize = flag("--width").map_or(2560, |s| s.parse().expect("--width takes a number"));
    let worlds: Vec<usize> = flag("--ranks").map_or(vec![2, 4], |s| {
        s.split(',')
            .map(|n| n.parse().expect("--ranks takes numbers"))
            .collect()
    });
    let parameters = LAYERS * (width * width + width);
    let mut report = vec![
        format!(
            "Run with `cargo run --release -p raylet-train --example sharding_bench -- {}` at {} (UTC). Model: {LAYERS} linear layers of {width} x {width}, {:.1} M parameters ({:.0} MiB as f32); Adam; {BATCH_PER_RANK} samples per rank per step; {steps} steps, the first left out of the median. Each rank is an actor in a worker process of its own; they talk through shared memory (the collective group's default on one host). *Parameters* and *optimizer state* are the bytes a rank keeps between steps (the optimizer's as its encoded burnpack size); *resident* is the worker process's RSS after the last step and its peak (VmHWM), the largest over the ranks.\n",
            std::env::args().skip(1).collect::<Vec<_>>().join(" "),
            utc_now(),
            parameters as f64 / 1e6,
            mib(parameters as u64 * 4)
        ),
        "| strategy | ranks | step (median) | samples/s | parameters per rank | optimizer state per rank | parameters + state per rank | resident between steps (max rank) | resident peak (max rank) |".to_string(),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    report.iter().for_each(|line| println!("{line}"));
    let cluster = raylet::init().expect("an embedded cluster");
    for &world in &worlds {
        for strategy in STRATEGIES {
            let figures = run(&cluster, world, strategy, width, steps);
            report.push(row(world, strategy, &figures));
            println!("{}", report.last().expect("a row"));
        }
    }
    cluster.shutdown().expect("the cluster stops");
    if let Some(path) = flag("--write") {
        std::fs::write(&path, report.join("\n") + "\n").expect("the report is written");
    }
}

/// Now, as `YYYY-MM-DD HH:MM`, in UTC.
fn utc_now() -> String {
    let output = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M"])
        .output()
        .expect("date runs");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn run(
    cluster: &raylet::Cluster,
    world: usize,
    strategy: ShardingStrategy,
    width: usize,
    steps: usize,
) -> Vec<RankFigures> {
    let name = format!("sharding-bench-{strategy:?}-{world}-{}", std::process::id());
    let ranks: Vec<RankHandle> = (0..world)
        .map(|_| Rank::remote(cluster).num_cpus(0.0).spawn())
        .collect::<raylet::Result<_>>()
        .expect("the ranks start");
    let figures: Vec<ObjectRef<RankFigures>> = ranks
        .iter()
        .enumerate()
        .map(|(rank, actor)| actor.train(name.clone(), rank, world, strategy, width, steps))
        .collect();
    let figures = cluster.get_all(&figures).expect("every rank trains");
    for actor in &ranks {
        cluster.kill(actor, true).expect("a rank ends");
    }
    figures
}

/// The table's row for one strategy and rank count.
fn row(world: usize, strategy: ShardingStrategy, figures: &[RankFigures]) -> String {
    let mut times = figures[0].step_seconds[1..].to_vec();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let largest = |field: fn(&RankFigures) -> u64| figures.iter().map(field).max().unwrap_or(0);
    let parameters = largest(|f| f.memory.parameters);
    let state = largest(|f| f.memory.optimizer_state);
    let both = largest(|f| f.memory.parameters + f.memory.optimizer_state);
    format!(
        "| {strategy:?} | {world} | {:.2} s | {:.1} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB |",
        median,
        (BATCH_PER_RANK * world) as f64 / median,
        mib(parameters),
        mib(state),
        mib(both),
        mib(largest(|f| f.rss_between_steps)),
        mib(largest(|f| f.rss_peak)),
    )
}

/// A `/proc/self/status` figure (`VmRSS:`, `VmHWM:`) in bytes.
fn resident_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != name).nth(1)
}
