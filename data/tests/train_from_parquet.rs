//! Train reads the digits from a Parquet file: two workers each read their
//! streaming-split shard as shuffled batches every epoch (a random shuffle
//! of the rows per epoch and a local shuffle buffer, each block one ahead
//! of the training step) and learn the digits to the accuracy of the same
//! training from memory.

use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{AdamConfig, GradientsParams};
use raylet_data::{DataShard, Dataset};
use raylet_models::digits::{self, Digit, DigitsMlp, batch};
use raylet_train::collective::ReduceOp;
use raylet_train::digits::DigitsTraining;
use raylet_train::model_sync::{allreduce_gradients, sync_initial_model};
use raylet_train::{
    Metrics, RunConfig, ScalingConfig, TrainContext, TrainError, TrainLoop, Trainer, register_train_loop,
};
use serde::{Deserialize, Serialize};

const EPOCHS: u64 = 12;

/// The digits training of `DigitsTraining`, its rows read from a streaming
/// split's shards instead of from memory.
#[derive(Serialize, Deserialize)]
struct DigitsFromShards {
    shards: Vec<DataShard<Digit>>,
    test: Vec<Digit>,
    training: DigitsTraining,
}
register_train_loop!(DigitsFromShards);

fn loop_error(error: impl std::fmt::Display) -> TrainError {
    TrainError::Loop(error.to_string())
}

impl TrainLoop for DigitsFromShards {
    fn reports(&self) -> Option<u64> {
        Some(self.training.epochs)
    }

    fn run(self, context: &mut TrainContext) -> Result<(), TrainError> {
        let training = &self.training;
        let device = context.device();
        let autodiff = device.clone().autodiff();
        autodiff.seed(training.seed);
        let mut shard = self.shards[context.rank()].clone();
        let mut model = sync_initial_model(context.group(), DigitsMlp::new(training.hidden, &autodiff))?;
        let mut optimizer = AdamConfig::new().init();
        let local_batch = training.global_batch_size / context.world_size();
        for epoch in 0..training.epochs {
            let mut batches = shard.iter_batches(local_batch);
            loop {
                // Every rank steps only while every rank has a whole batch.
                let next = batches.next().transpose().map_err(loop_error)?;
                let mut full = [f64::from(next.as_ref().is_some_and(|b| b.len() == local_batch))];
                context.group().allreduce(&mut full, ReduceOp::Sum)?;
                let Some(digits) = next.filter(|_| full[0] as usize == context.world_size()) else {
                    break;
                };
                let (pixels, labels) = batch(&digits, &autodiff);
                let loss = CrossEntropyLoss::new(None, &autodiff).forward(model.forward(pixels), labels);
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                let grads = allreduce_gradients(context.group(), &model, grads, &device)?;
                model = optimizer.step(training.learning_rate, model, grads);
            }
            for rest in batches {
                rest.map_err(loop_error)?;
            }
            let mine: Vec<Digit> = self
                .test
                .iter()
                .skip(context.rank())
                .step_by(context.world_size())
                .cloned()
                .collect();
            let mut totals = [model.count_correct(&mine, &autodiff) as f64, mine.len() as f64];
            context.group().allreduce(&mut totals, ReduceOp::Sum)?;
            let metrics = Metrics::new()
                .with("epoch", epoch as f64)
                .with("accuracy", totals[0] / totals[1]);
            context.report(metrics, None)?;
        }
        Ok(())
    }
}

fn trainer<L: TrainLoop>(train_loop: L, storage: &std::path::Path, name: &str) -> Trainer<L> {
    Trainer::new(train_loop)
        .scaling(ScalingConfig {
            num_workers: 2,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: name.into(),
            storage_path: storage.to_path_buf(),
            verbose: false,
            ..RunConfig::default()
        })
}

#[test]
fn two_workers_learn_the_digits_from_a_parquet_file_as_well_as_from_memory() {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
    let temp = tempfile::tempdir().unwrap();
    let data = digits::load(0.2, 0);
    let training = DigitsTraining {
        epochs: EPOCHS,
        ..DigitsTraining::default()
    };

    let from_memory = trainer(training.clone(), temp.path(), "memory")
        .dataset("train", data.train.clone())
        .dataset("test", data.test.clone())
        .fit()
        .unwrap();

    let parquet = temp.path().join("digits");
    Dataset::from_items(data.train.clone())
        .items_per_block(200)
        .show_progress(false)
        .write_parquet(&parquet)
        .unwrap();
    let split = Dataset::read_parquet(parquet.to_str().unwrap())
        .show_progress(false)
        .rows::<Digit>()
        .random_shuffle(training.seed)
        .local_shuffle_buffer(256, training.seed)
        .streaming_split(2)
        .unwrap();
    let from_parquet = DigitsFromShards {
        shards: split.shards(),
        test: data.test.clone(),
        training,
    };
    let from_parquet = trainer(from_parquet, temp.path(), "parquet").fit().unwrap();

    let accuracy = |result: &raylet_train::TrainResult| result.metrics.get("accuracy").unwrap();
    let (memory, parquet) = (accuracy(&from_memory), accuracy(&from_parquet));
    println!("test accuracy after {EPOCHS} epochs: {memory:.3} from memory, {parquet:.3} from Parquet");
    assert!(memory > 0.9 && parquet > 0.9, "{memory} and {parquet}");
    assert!((memory - parquet).abs() <= 0.04, "{memory} and {parquet}");
}
