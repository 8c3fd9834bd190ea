//! What raylet-train does on a GPU, run where there is one (built with the
//! `vulkan` feature; burn's wgpu backend on Vulkan):
//!
//! 1. a 2-rank allreduce of tensors on the GPU: each rank an actor holding
//!    half the GPU, its tensor copied to the host, reduced over the
//!    collective group, and made a GPU tensor again, checked against the sum;
//! 2. the digits trained by 2 workers, each on half the GPU, gradients
//!    averaged over the group at every step, beside the same run on the CPU.
//!
//! `cargo run --release -p raylet-train --features vulkan --example vulkan_check -- [--epochs 10]`

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::{DeviceKind, TensorData};
use raylet::ObjectRef;
use raylet_models::digits;
use raylet_train::collective::{CollectiveGroup, GroupOptions, ReduceOp};
use raylet_train::digits::DigitsTraining;
use raylet_train::{RunConfig, ScalingConfig, Trainer, WorkerResources};

/// Elements of each rank's tensor in the allreduce.
const ELEMENTS: usize = 4 << 20;

/// One rank of the allreduce, on half of the GPU.
#[raylet::actor]
struct Rank;

#[raylet::actor]
impl Rank {
    fn new() -> Self {
        Rank
    }

    /// Reduces a GPU tensor of `rank + 1`s over the group; returns the
    /// device it lived on, the GPU ids this actor was given, and how many
    /// elements of the result differ from the sum.
    fn allreduce_on_gpu(&self, name: String, rank: usize, world: usize) -> (String, Vec<u32>, usize) {
        let cluster = raylet::current().expect("actors run in a cluster");
        let mut group =
            CollectiveGroup::join(&cluster, &name, rank, world, GroupOptions::default()).expect("the ranks meet");
        let gpu = raylet::gpu_ids().first().map_or(0, |&id| id as usize);
        let device = Device::vulkan(DeviceKind::DiscreteGpu(gpu));
        let tensor = Tensor::<1>::from_data(TensorData::new(vec![(rank + 1) as f32; ELEMENTS], [ELEMENTS]), &device);
        let mut host = tensor.into_data().try_into_vec_as::<f32>().expect("f32 values");
        group.allreduce(&mut host, ReduceOp::Sum).expect("the allreduce");
        let reduced = Tensor::<1>::from_data(TensorData::new(host, [ELEMENTS]), &device);
        let expected = (world * (world + 1) / 2) as f32;
        let values = reduced.into_data().try_into_vec_as::<f32>().expect("f32 values");
        let wrong = values.iter().filter(|&&value| value != expected).count();
        (format!("{device:?}"), raylet::gpu_ids(), wrong)
    }
}

fn main() -> anyhow::Result<()> {
    let epochs: u64 = flag("--epochs").map_or(Ok(10), |value| value.parse())?;
    let cluster = raylet::init()?;
    println!("the cluster's resources: {:?}", cluster.status()?.total());
    allreduce_gpu_tensors(&cluster)?;
    let data = digits::load(0.2, 0);
    for use_gpu in [true, false] {
        let started = Instant::now();
        let accuracy = train_digits(&data, use_gpu, epochs)?;
        let place = if use_gpu {
            "GPU (2 workers, half a GPU each)"
        } else {
            "CPU (2 workers)"
        };
        println!(
            "digits on {place}: final test accuracy {:.2}% after {epochs} epochs in {:.1} s",
            accuracy * 100.0,
            started.elapsed().as_secs_f64()
        );
    }
    cluster.shutdown()?;
    Ok(())
}

/// Step 1: two ranks, each on half the GPU, reduce GPU tensors.
fn allreduce_gpu_tensors(cluster: &raylet::Cluster) -> anyhow::Result<()> {
    let world = 2;
    let ranks: Vec<RankHandle> = (0..world)
        .map(|_| Rank::remote(cluster).num_cpus(0.0).num_gpus(0.5).spawn())
        .collect::<raylet::Result<_>>()?;
    let name = format!("gpu-check-{}", std::process::id());
    let started = Instant::now();
    let results: Vec<ObjectRef<(String, Vec<u32>, usize)>> = ranks
        .iter()
        .enumerate()
        .map(|(rank, actor)| actor.allreduce_on_gpu(name.clone(), rank, world))
        .collect();
    for (rank, (device, gpus, wrong)) in cluster.get_all(&results)?.into_iter().enumerate() {
        println!(
            "rank {rank}: tensor on {device}, GPU ids {gpus:?}, {wrong} of {ELEMENTS} elements differ from the sum"
        );
        anyhow::ensure!(wrong == 0, "rank {rank}'s allreduce of GPU tensors is wrong");
    }
    println!(
        "2-rank allreduce of {} MiB GPU tensors: correct, {:.2} s with joining",
        (ELEMENTS * 4) >> 20,
        started.elapsed().as_secs_f64()
    );
    for actor in &ranks {
        cluster.kill(actor, true)?;
    }
    Ok(())
}

/// Step 2: the digits on 2 workers, on the GPU or the CPU; the final test
/// accuracy.
fn train_digits(data: &digits::DigitsSplit, use_gpu: bool, epochs: u64) -> anyhow::Result<f64> {
    let name = format!("gpu-check-digits-{use_gpu}-{}", std::process::id());
    let result = Trainer::new(DigitsTraining {
        epochs,
        ..DigitsTraining::default()
    })
    .scaling(ScalingConfig {
        num_workers: 2,
        use_gpu,
        resources_per_worker: WorkerResources {
            num_cpus: 0.5,
            num_gpus: if use_gpu { 0.5 } else { 0.0 },
            ..WorkerResources::default()
        },
        ..ScalingConfig::default()
    })
    .run_config(RunConfig {
        name,
        storage_path: std::env::temp_dir().join("raylet-gpu-check"),
        ..RunConfig::default()
    })
    .dataset("train", data.train.clone())
    .dataset("test", data.test.clone())
    .fit()?;
    let last = result
        .metrics_history
        .last()
        .ok_or_else(|| anyhow::anyhow!("no report"))?;
    Ok(last.metrics.get("accuracy").unwrap_or(f64::NAN))
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != name).nth(1)
}
