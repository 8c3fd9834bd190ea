//! Sharded data parallelism (ZeRO stages 1-3) against plain data
//! parallelism, its ranks threads of this process over real TCP: the same
//! parameters after 20 Adam steps on the digits, each rank holding about
//! 1/n of the parameters and optimizer state, and a checkpoint gathered
//! from shards that resumes under another strategy and world size.

use std::sync::Arc;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use raylet::Cluster;
use raylet_models::digits::{Digit, batch, load};
use raylet_train::collective::{CollectiveGroup, GroupOptions};
use raylet_train::sharding::{DataParallel, ShardMemory, ShardingStrategy};

/// 64 pixels, four hidden layers of 48 with ReLU, 10 class scores: ten
/// parameters, so that four ranks each own some.
#[derive(Module, Debug)]
struct DeepMlp {
    layers: Vec<Linear>,
    activation: Relu,
}

impl DeepMlp {
    fn new(device: &Device) -> Self {
        let widths = [64, 48, 48, 48, 48, 10];
        let layers = widths
            .windows(2)
            .map(|pair| LinearConfig::new(pair[0], pair[1]).init(device))
            .collect();
        DeepMlp {
            layers,
            activation: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        for (index, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if index < last {
                x = self.activation.forward(x);
            }
        }
        x
    }
}

/// Every parameter's values, flat, in visit order.
struct Values(Vec<f32>);

impl ModuleVisitor for Values {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.extend(param.val().into_data().iter::<f32>());
    }
}

fn values(model: &DeepMlp) -> Vec<f32> {
    let mut values = Values(Vec::new());
    model.visit(&mut values);
    values.0
}

/// What a rank ends with: the whole model and optimizer on rank 0, and what
/// it held between steps.
struct RankResult {
    gathered: Option<(DeepMlp, ModuleOptimizer)>,
    model_values: Vec<f32>,
    memory: ShardMemory,
}

/// Trains `steps` steps from `start` on `world` ranks with `strategy`,
/// starting from the optimizer state `optimizer` and at step `first_step`.
fn train(
    cluster: &Cluster,
    world: usize,
    strategy: ShardingStrategy,
    start: &DeepMlp,
    optimizer: &ModuleOptimizer,
    first_step: usize,
    steps: usize,
) -> Vec<RankResult> {
    let digits = Arc::new(load(0.2, 0).train);
    let name = format!("sharding-{strategy:?}-{world}-{first_step}-{}", rand::random::<u64>());
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let (cluster, name, digits) = (cluster.clone(), name.clone(), digits.clone());
            let (start, optimizer) = (start.clone(), optimizer.clone());
            std::thread::spawn(move || {
                let mut group = CollectiveGroup::join(&cluster, &name, rank, world, GroupOptions::default()).unwrap();
                let mut parallel = DataParallel::new(&mut group, start, optimizer, strategy).unwrap();
                for step in first_step..first_step + steps {
                    let model = parallel.model(&mut group).unwrap();
                    let grads = gradients(&model, &shard(&digits, step, rank, world));
                    parallel.step(&mut group, 1e-2, model, grads, &Device::flex()).unwrap();
                }
                let memory = parallel.memory().unwrap();
                let model_values = values(&parallel.model(&mut group).unwrap());
                let gathered = parallel.gathered(&mut group).unwrap();
                RankResult {
                    gathered,
                    model_values,
                    memory,
                }
            })
        })
        .collect();
    threads.into_iter().map(|thread| thread.join().unwrap()).collect()
}

/// Rank `rank`'s part of step `step`'s global batch of 64 images.
fn shard(digits: &[Digit], step: usize, rank: usize, world: usize) -> Vec<Digit> {
    let global = 64;
    let local = global / world;
    let start = (step * global + rank * local) % (digits.len() - global);
    digits[start..start + local].to_vec()
}

fn gradients(model: &DeepMlp, digits: &[Digit]) -> GradientsParams {
    let device = Device::flex().autodiff();
    let (pixels, labels) = batch(digits, &device);
    let loss = CrossEntropyLoss::new(None, &device).forward(model.forward(pixels), labels);
    GradientsParams::from_grads(loss.backward(), model)
}

fn initial_model() -> DeepMlp {
    let device = Device::flex().autodiff();
    device.seed(42);
    DeepMlp::new(&device)
}

fn adam() -> ModuleOptimizer {
    AdamConfig::new().init()
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn final_values(results: &[RankResult]) -> Vec<f32> {
    values(&results[0].gathered.as_ref().expect("rank 0 gathers the model").0)
}

#[test]
fn every_stage_gives_the_parameters_of_plain_data_parallelism_after_20_steps() {
    let cluster = raylet::init().unwrap();
    let start = initial_model();
    for world in [2, 4] {
        let plain = train(&cluster, world, ShardingStrategy::None, &start, &adam(), 0, 20);
        let expected = final_values(&plain);
        assert!(max_difference(&expected, &values(&start)) > 1e-3, "the model trained");
        for strategy in [
            ShardingStrategy::OptimizerState,
            ShardingStrategy::Gradients,
            ShardingStrategy::Parameters,
        ] {
            let sharded = train(&cluster, world, strategy, &start, &adam(), 0, 20);
            let difference = max_difference(&final_values(&sharded), &expected);
            assert!(difference <= 1e-5, "{strategy:?} on {world} ranks: {difference}");
            for (rank, result) in sharded.iter().enumerate() {
                let difference = max_difference(&result.model_values, &expected);
                assert!(difference <= 1e-5, "{strategy:?}, rank {rank} of {world}: {difference}");
                assert_eq!(result.gathered.is_some(), rank == 0);
            }
        }
    }
}

#[test]
fn each_rank_holds_about_its_share_of_parameters_and_optimizer_state() {
    let cluster = raylet::init().unwrap();
    let start = initial_model();
    let total_parameters = (values(&start).len() * 4) as u64;
    let plain = train(&cluster, 2, ShardingStrategy::None, &start, &adam(), 0, 2);
    let full_state = plain[0].memory.optimizer_state;
    assert_eq!(plain[0].memory.parameters, total_parameters);
    assert!(
        full_state > 2 * total_parameters,
        "Adam keeps two moments: {full_state}"
    );
    let largest_parameter = (48 * 48 * 4) as u64;
    for world in [2u64, 4] {
        for strategy in [ShardingStrategy::Gradients, ShardingStrategy::Parameters] {
            let results = train(&cluster, world as usize, strategy, &start, &adam(), 0, 2);
            let states: Vec<u64> = results.iter().map(|r| r.memory.optimizer_state).collect();
            for (rank, result) in results.iter().enumerate() {
                let state = result.memory.optimizer_state;
                let share = full_state / world;
                assert!(
                    state.abs_diff(share) <= 3 * largest_parameter,
                    "{strategy:?}, rank {rank} of {world}: state {state} vs share {share} ({states:?})"
                );
                let parameters = result.memory.parameters;
                match strategy {
                    ShardingStrategy::Parameters => assert!(
                        parameters.abs_diff(total_parameters / world) <= largest_parameter,
                        "rank {rank} of {world}: {parameters} parameter bytes of {total_parameters}"
                    ),
                    _ => assert_eq!(parameters, total_parameters),
                }
            }
            let held: u64 = states.iter().sum();
            assert!(held.abs_diff(full_state) < full_state / 10, "{held} vs {full_state}");
        }
    }
}

#[test]
fn a_checkpoint_gathered_from_shards_resumes_with_another_strategy_and_world_size() {
    let cluster = raylet::init().unwrap();
    let start = initial_model();
    let straight = train(&cluster, 2, ShardingStrategy::None, &start, &adam(), 0, 20);
    let first = train(&cluster, 4, ShardingStrategy::Parameters, &start, &adam(), 0, 10);
    let (model, optimizer) = first.into_iter().next().unwrap().gathered.unwrap();
    let resumed = train(
        &cluster,
        2,
        ShardingStrategy::OptimizerState,
        &model,
        &optimizer,
        10,
        10,
    );
    let difference = max_difference(&final_values(&resumed), &final_values(&straight));
    assert!(difference <= 1e-5, "resumed vs straight: {difference}");
}
