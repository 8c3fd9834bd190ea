//! Data-parallel training of a burn model over the collective group, with
//! ranks as threads of this process: two ranks start from different random
//! models, take rank 0's, and train on half of each batch with their
//! gradients averaged. After 20 SGD steps they hold the same parameters as
//! each other, and as one model trained on the whole batch (within 1e-5).

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::tensor::{Bytes, TensorData};
use raylet_train::collective::{CollectiveGroup, GroupOptions};
use raylet_train::model_sync::{allreduce_gradients, sync_initial_model};

const BATCH: usize = 64;
const STEPS: usize = 20;
const LEARNING_RATE: f64 = 0.2;

#[derive(Module, Debug)]
struct Mlp {
    l1: Linear,
    act: Relu,
    l2: Linear,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Mlp {
            l1: LinearConfig::new(8, 32).init(device),
            act: Relu::new(),
            l2: LinearConfig::new(32, 4).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.l2.forward(self.act.forward(self.l1.forward(x)))
    }
}

/// A fixed batch: features from a formula, four classes in turn.
fn batch(device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
    let features: Vec<f32> = (0..BATCH * 8)
        .map(|k| ((k / 8 * 31 + k % 8 * 17) % 13) as f32 / 13.0 - 0.5)
        .collect();
    let labels: Vec<i64> = (0..BATCH).map(|i| (i % 4) as i64).collect();
    (
        Tensor::<2>::from_data(TensorData::new(features, [BATCH, 8]), device),
        Tensor::<1, Int>::from_data(TensorData::new(labels, [BATCH]), device),
    )
}

struct FlattenParams(Vec<f32>);

impl ModuleVisitor for FlattenParams {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let values = param.val().into_data().try_into_vec_as::<f32>();
        self.0.extend(values.unwrap());
    }
}

fn parameters(model: &Mlp) -> Vec<f32> {
    let mut flatten = FlattenParams(Vec::new());
    model.visit(&mut flatten);
    flatten.0
}

fn gradients(model: &Mlp, x: Tensor<2>, y: Tensor<1, Int>, device: &Device) -> GradientsParams {
    let loss = CrossEntropyLoss::new(None, device).forward(model.forward(x), y);
    GradientsParams::from_grads(loss.backward(), model)
}

/// Trains as rank `rank` of 2 on its half of the batch; returns rank 0's
/// initial record (from rank 0) and the final parameters.
fn train_rank(cluster: raylet::Cluster, rank: usize) -> (Option<Vec<u8>>, Vec<f32>) {
    let base = Device::flex();
    let device = base.clone().autodiff();
    device.seed(rank as u64 + 7);
    let mut group = CollectiveGroup::join(&cluster, "data-parallel", rank, 2, GroupOptions::default()).unwrap();
    let mut model = sync_initial_model(&mut group, Mlp::new(&device)).unwrap();
    let initial = (rank == 0).then(|| model.clone().into_record().into_bytes().unwrap().to_vec());
    let (x, y) = batch(&device);
    let half = rank * BATCH / 2..(rank + 1) * BATCH / 2;
    let mut optim = SgdConfig::new().init();
    for _ in 0..STEPS {
        let grads = gradients(
            &model,
            x.clone().slice([half.clone()]),
            y.clone().slice([half.clone()]),
            &device,
        );
        let grads = allreduce_gradients(&mut group, &model, grads, &base).unwrap();
        model = optim.step(LEARNING_RATE, model, grads);
    }
    (initial, parameters(&model))
}

#[test]
fn two_ranks_on_half_batches_train_the_same_model_as_one_on_the_whole_batch() {
    let cluster = raylet::init().unwrap();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let cluster = cluster.clone();
            std::thread::spawn(move || train_rank(cluster, rank))
        })
        .collect();
    let mut results: Vec<(Option<Vec<u8>>, Vec<f32>)> = ranks.into_iter().map(|rank| rank.join().unwrap()).collect();
    let (_, second) = results.pop().unwrap();
    let (initial, first) = results.pop().unwrap();
    assert_eq!(first, second, "the replicas stay bit-identical");

    let device = Device::flex().autodiff();
    let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(initial.unwrap())).unwrap();
    let mut whole = Mlp::new(&device).load_record(record);
    let (x, y) = batch(&device);
    let mut optim = SgdConfig::new().init();
    let untrained = parameters(&whole);
    for _ in 0..STEPS {
        let grads = gradients(&whole, x.clone(), y.clone(), &device);
        whole = optim.step(LEARNING_RATE, whole, grads);
    }
    let expected = parameters(&whole);
    let moved = untrained
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(moved > 1e-3, "training moved the parameters ({moved})");
    let apart = first
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("after {STEPS} steps: data-parallel vs whole batch differ by at most {apart:e}");
    assert!(apart < 1e-5, "{apart}");
}
